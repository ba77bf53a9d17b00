/* test_compile.c — ahead-of-time compile to a plan file and plan sessions,
 * with no GPU: moec_compile of a tiny model writes a plan that reads back
 * (buckets, kernels, cubins, module, the checkpoint hashes) and equals the
 * plan built in-process from the same options; progress is reported per
 * bucket as kernels compiled of all kernels; bad options, a foreign or missing checkpoint and an unwritable
 * path fail without leaving a file. A plan session checks the plan and the
 * checkpoint before it asks for a device: another checkpoint is refused
 * first, and only then (here) "no CUDA device". MOEC_COMPILE_TEST_CACHE
 * names a cubin cache to keep (to rerun under valgrind without NVRTC). */
#include <ftw.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compiler/api_internal.h"
#include "runtime/plan_check.h"
#include "passlib.h"
#include "testlib.h"

#ifdef MOEC_HAVE_CUDA
enum { HAVE_NVRTC = 1 };
#else
enum { HAVE_NVRTC = 0 };
#endif

static char g_dir[4096], g_cache[4200];

typedef struct progress_log {
    int n;
    int done[16], total[16];
} progress_log;

static void on_progress(int done, int total, void *user)
{
    progress_log *l = user;
    if (l->n < 16) {
        l->done[l->n] = done;
        l->total[l->n] = total;
    }
    l->n++;
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static const char *tmp_path(const char *name)
{
    static char buf[4][4200];
    static int i;
    char *b = buf[i++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", g_dir, name);
    return b;
}

/* The plan read back from path equals p (built in-process) step for step,
 * and its cubins byte for byte. */
static void check_same_plan(const ir_plan *p, const ir_plan *q)
{
    T_CHECK(p->n_buckets == q->n_buckets && p->compute_dtype == q->compute_dtype &&
            !strcmp(p->arch, q->arch) && p->kv_block_size == q->kv_block_size);
    for (int b = 0; b < p->n_buckets && b < q->n_buckets; b++) {
        const ir_bucket *x = &p->buckets[b], *y = &q->buckets[b];
        T_CHECK(x->T == y->T && x->n_kernels == y->n_kernels && x->n_steps == y->n_steps &&
                x->arena_bytes == y->arena_bytes && x->scratch_bytes == y->scratch_bytes);
        T_CHECK(x->cubin_size == y->cubin_size && !memcmp(x->cubin, y->cubin, x->cubin_size));
        for (int k = 0; k < x->n_kernels && k < y->n_kernels; k++)
            T_CHECK(!strcmp(x->kernel_names[k], y->kernel_names[k]));
        for (int s = 0; s < x->n_steps && s < y->n_steps; s++) {
            T_CHECK(!memcmp(&x->steps[s], &y->steps[s], sizeof x->steps[s]));
            /* Indices name the same values and ops in both modules. */
            const ir_step *st = &x->steps[s];
            const ir_arg *args[IR_MAX_ARGS + 4];
            int n = 0;
            for (int a = 0; a < st->n_args; a++)
                args[n++] = &st->args[a];
            if (st->kind == IR_STEP_GEMM) {
                args[n++] = &st->gemm.a;
                args[n++] = &st->gemm.b;
                args[n++] = &st->gemm.c;
                if (st->gemm.has_bias)
                    args[n++] = &st->gemm.bias;
            }
            for (int a = 0; a < n; a++) {
                if (args[a]->kind != IR_ARG_ACT && args[a]->kind != IR_ARG_WEIGHT)
                    continue;
                int v = args[a]->index;
                int ok = v >= 0 && v < p->module->n_values && v < q->module->n_values &&
                         !strcmp(p->module->values[v]->name, q->module->values[v]->name);
                T_CHECK(ok);
                if (!ok) {
                    fprintf(stderr, "bucket %d step %d arg %d: value index %d differs\n", b, s, a, v);
                    return;
                }
            }
            if (st->op_id >= 0)
                T_CHECK(st->op_id < q->module->n_ops &&
                        !strcmp(p->module->ops[st->op_id]->out[0]->name,
                                q->module->ops[st->op_id]->out[0]->name));
        }
    }
    char *a = ir_module_print_str(p->module), *c = ir_module_print_str(q->module);
    T_CHECK(a && c && !strcmp(a, c));
    free(a);
    free(c);
}

/* deepseek_v3 in bf16, buckets 1 and 8: the plan file and what it holds. */
static void test_compile_v3(const char *plan_path)
{
    const char *dir = t_src("tests/data/deepseek_v3");
    moec_model_t *m = NULL;
    T_OK(moec_model_open(dir, &m));
    if (!m)
        return;
    progress_log log = {0};
    moec_compile_options o = {0};
    o.n_buckets = 2;
    o.buckets[0] = 1;
    o.buckets[1] = 8;
    o.cache_dir = g_cache;
    o.progress = on_progress;
    o.progress_user = &log;
    T_OK(moec_compile(m, dir, &o, plan_path));
    /* one call per bucket: kernels done of every bucket's kernels */
    T_CHECK(log.n == 2 && log.total[0] == log.total[1] && log.done[1] == log.total[1] &&
            log.done[0] > 0 && log.done[0] < log.done[1]);

    ir_plan *p = NULL;
    ir_module *pm = NULL;
    ir_plan_meta meta;
    T_OK(ir_plan_read(plan_path, &p, &pm, &meta));
    if (p) {
        T_CHECK(p->n_buckets == 2 && p->buckets[0].T == 1 && p->buckets[1].T == 8);
        T_CHECK(log.total[0] == p->buckets[0].n_kernels + p->buckets[1].n_kernels);
        T_CHECK(log.done[0] == p->buckets[0].n_kernels || log.done[0] == p->buckets[1].n_kernels);
        T_CHECK(!strcmp(p->arch, "sm_90") && p->compute_dtype == IR_DTYPE_BF16 &&
                p->kv_block_size == 64);
        for (int b = 0; b < p->n_buckets; b++) {
            const ir_bucket *bk = &p->buckets[b];
            /* A cubin is an ELF image. */
            T_CHECK(bk->cubin_size > 1000 && !memcmp(bk->cubin, "\177ELF", 4));
            T_CHECK(bk->n_kernels > 5 && bk->n_steps >= bk->n_kernels);
            for (int k = 0; k < bk->n_kernels; k++)
                T_CHECK(bk->kernel_names[k] && strlen(bk->kernel_names[k]) > 3);
            T_CHECK(bk->arena_bytes == (size_t)ir_module_meta_int(pm, "arena_bytes_per_token", 0) *
                                           (size_t)bk->T);
        }
        /* The fused module: MLA absorbed, planned, for bf16. */
        T_CHECK(ir_module_meta_int(pm, "vocab_size", 0) == 256);
        const ir_attr *cd = ir_module_meta(pm, "compute_dtype");
        T_CHECK(cd && cd->kind == IR_ATTR_STR && !strcmp(cd->s, "bf16"));
        int mla = 0;
        for (int i = 0; i < pm->n_ops; i++)
            mla += pm->ops[i]->kind == IR_OP_MLA_ATTENTION;
        T_CHECK(mla == 3);
        /* The hashes are those of the checkpoint, and only of it. */
        char cfg[17], w[17];
        T_OK(rt_hash_config(dir, cfg));
        T_OK(rt_hash_weights(pm, dir, w));
        T_CHECK(!strcmp(cfg, meta.config_hash) && !strcmp(w, meta.weights_hash));
        T_OK(rt_plan_check_checkpoint(&meta, pm, plan_path, dir));
        T_ERR(rt_plan_check_checkpoint(&meta, pm, plan_path, t_src("tests/data/qwen3_moe")),
              MOEC_ERR_MISMATCH, "was compiled for another config");

        /* The same options in-process give the same plan (warm cache). */
        cg_options co;
        ir_module *fm = NULL;
        ir_plan *q = NULL;
        T_OK(moec_cg_options(IR_DTYPE_BF16, "sm_90", &co));
        co.n_buckets = 2;
        co.buckets[0] = 1;
        co.buckets[1] = 8;
        co.cache_dir = g_cache;
        T_OK(moec_fuse(moec_model_module(m), &co, &fm));
        if (fm)
            T_OK(cg_plan_build(fm, &co, &q));
        if (q)
            check_same_plan(q, p);
        ir_plan_free(q);
        ir_module_free(fm);
        ir_plan_free(p);
    }
    ir_module_free(pm);
    moec_model_free(m);
}

/* fp32, the one bucket of 4 tokens, sm_80, the test's cache. */
static moec_compile_options fp32_options(void)
{
    moec_compile_options o = {0};
    o.dtype = "fp32";
    o.n_buckets = 1;
    o.buckets[0] = 4;
    o.arch = "sm_80";
    o.cache_dir = g_cache;
    return o;
}

/* qwen3_moe in fp32, one bucket. */
static void test_compile_fp32(void)
{
    const char *dir = t_src("tests/data/qwen3_moe");
    const char *path = tmp_path("q3.moec");
    moec_model_t *m = NULL;
    T_OK(moec_model_open(dir, &m));
    if (!m)
        return;
    moec_compile_options o = fp32_options();
    T_OK(moec_compile(m, dir, &o, path));
    ir_plan *p = NULL;
    ir_module *pm = NULL;
    ir_plan_meta meta;
    T_OK(ir_plan_read(path, &p, &pm, &meta));
    if (p)
        T_CHECK(p->compute_dtype == IR_DTYPE_F32 && p->n_buckets == 1 && p->buckets[0].T == 4 &&
                !strcmp(p->arch, "sm_80") && p->buckets[0].cubin_size > 0);
    ir_plan_free(p);
    ir_module_free(pm);
    moec_model_free(m);
}

/* Bad options and checkpoints fail before anything is written. */
static void test_compile_errors(void)
{
    const char *dir = t_src("tests/data/deepseek_v3");
    const char *path = tmp_path("never.moec");
    moec_model_t *m = NULL;
    T_OK(moec_model_open(dir, &m));
    if (!m)
        return;
    moec_compile_options o = {0};
    o.cache_dir = g_cache;
    o.par.tp = 3;
    T_ERR(moec_compile(m, dir, &o, path), MOEC_ERR_INVALID_ARG,
          "tp 3 does not divide num_attention_heads 4 (%l0.attn.o_c)");
    o.par = (moec_parallel){2, 3, 0, 0};
    T_ERR(moec_compile(m, dir, &o, path), MOEC_ERR_INVALID_ARG, "ep 3 must divide tp 2");
    o.par = (moec_parallel){0, 0, 0, 0};
    o.dtype = "fp16";
    T_ERR(moec_compile(m, dir, &o, path), MOEC_ERR_INVALID_ARG,
          "compute dtype 'fp16' is not bf16 or fp32");
    o.dtype = NULL;
    o.fp8_layout = "fast";
    T_ERR(moec_compile(m, dir, &o, path), MOEC_ERR_INVALID_ARG,
          "fp8 layout 'fast' is not gate_up, tiles, down or rows, alone or with +linear");
    o.fp8_layout = "gate_up+linears";
    T_ERR(moec_compile(m, dir, &o, path), MOEC_ERR_INVALID_ARG,
          "fp8 layout 'gate_up+linears' is not gate_up, tiles, down or rows, alone or with "
          "+linear");
    T_ERR(moec_fp8_layout_check("+linear"), MOEC_ERR_INVALID_ARG,
          "fp8 layout '+linear' is not gate_up");
    T_CHECK(moec_fp8_layout_check("rows+linear") == MOEC_OK &&
            moec_fp8_layout_check("tiles") == MOEC_OK);
    o.fp8_layout = NULL;
    o.arch = "gfx942";
    T_ERR(moec_compile(m, dir, &o, path), MOEC_ERR_INVALID_ARG,
          "target arch 'gfx942' is not a GPU arch like sm_90");
    o.arch = NULL;
    o.n_buckets = 3;
    o.buckets[0] = 1;
    o.buckets[1] = 8;
    o.buckets[2] = 8;
    T_ERR(moec_compile(m, dir, &o, path), MOEC_ERR_INVALID_ARG,
          "batch bucket 2 is 8: buckets must ascend");
    o.n_buckets = 17;
    T_ERR(moec_compile(m, dir, &o, path), MOEC_ERR_INVALID_ARG, "17 batch buckets (want 1 to 16)");
    o.n_buckets = 1;
    o.buckets[0] = 1;
    /* Another model's checkpoint, and a directory with no weights. */
    T_ERR(moec_compile(m, t_src("tests/data/qwen3_moe"), &o, path), MOEC_ERR_MISMATCH,
          "tensor 'model.layers.0.self_attn.q_a_layernorm.weight' not found in");
    const char *empty = tmp_path("noweights");
    T_CHECK(mkdir(empty, 0755) == 0);
    char cfg[4300];
    snprintf(cfg, sizeof cfg, "%s/config.json", empty);
    size_t n;
    char *text = t_read_file(t_src("tests/data/deepseek_v3/config.json"), &n);
    t_write_file(cfg, text, n);
    free(text);
    T_ERR(moec_compile(m, empty, &o, path), MOEC_ERR_IO, "no *.safetensors");
    T_CHECK(!exists(path));
    /* The output path is checked first (before the checkpoint: qwen3_moe's
     * would not fit), naming the path given. */
    char want[9000], in_file[4400];
    snprintf(want, sizeof want, "cannot write the plan %s: directory %s: No such file or directory",
             tmp_path("no/such/dir/x.moec"), tmp_path("no/such/dir"));
    T_ERR(moec_compile(m, t_src("tests/data/qwen3_moe"), &o, tmp_path("no/such/dir/x.moec")),
          MOEC_ERR_IO, want);
    snprintf(want, sizeof want, "cannot write the plan %s: it is a directory (name a file, such as %s/model.moec)",
             g_dir, g_dir);
    T_ERR(moec_compile(m, t_src("tests/data/qwen3_moe"), &o, g_dir), MOEC_ERR_IO, want);
    snprintf(in_file, sizeof in_file, "%s/x.moec", cfg);
    snprintf(want, sizeof want, "cannot write the plan %s: %s is not a directory", in_file, cfg);
    T_ERR(moec_compile(m, dir, &o, in_file), MOEC_ERR_IO, want);
    T_ERR(moec_compile(NULL, dir, &o, path), MOEC_ERR_INVALID_ARG, "NULL argument");
    T_CHECK(!exists(path));
    remove(cfg);
    rmdir(empty);
    /* bench: the context against max_position_embeddings 512 (each step
     * decodes one more token), before any device is looked for */
    moec_bench_options bo = {.n_batch = 1, .batch = {1}, .context = 512, .steps = 1};
    moec_bench_result r;
    T_ERR(moec_bench(m, dir, &bo, &r), MOEC_ERR_CAPACITY,
          "context 512 is too long: each step decodes the token after it, and the model's "
          "max_position_embeddings 512 allows a context of at most 511");
    T_CHECK(r.context == 512 && r.max_context == 511);
    /* a bad option is named, not 'bad options' */
    bo.context = 8;
    T_ERR(moec_bench(m, dir, NULL, &r), MOEC_ERR_INVALID_ARG, "moec_bench: NULL options");
    T_ERR(moec_bench(m, dir, &bo, NULL), MOEC_ERR_INVALID_ARG, "moec_bench: NULL result");
    T_ERR(moec_bench(m, NULL, &bo, &r), MOEC_ERR_INVALID_ARG, "moec_bench: NULL weights_dir");
    T_ERR(moec_bench(NULL, dir, &bo, &r), MOEC_ERR_INVALID_ARG,
          "moec_bench: NULL model and no plan_path");
    bo.n_batch = 17;
    T_ERR(moec_bench(m, dir, &bo, &r), MOEC_ERR_INVALID_ARG,
          "moec_bench: n_batch must be from 1 to 16, got 17");
    bo.n_batch = 1;
    bo.steps = 0;
    T_ERR(moec_bench(m, dir, &bo, &r), MOEC_ERR_INVALID_ARG,
          "moec_bench: steps must be at least 1 and warmup at least 0, got 0 and 0");
    bo.steps = 1;
    bo.warmup = -1;
    T_ERR(moec_bench(m, dir, &bo, &r), MOEC_ERR_INVALID_ARG,
          "moec_bench: steps must be at least 1 and warmup at least 0, got 1 and -1");
    moec_model_free(m);
}

/* moec_bench of a plan: its default context is the model's limit less one
 * (not 1024), a longer one is refused before the device is looked for. */
static void test_bench_plan(const char *plan_path)
{
    const char *v3 = t_src("tests/data/deepseek_v3");
    moec_bench_options bo = {.n_batch = 1, .batch = {1}, .context = 1024, .steps = 1,
                             .plan_path = plan_path};
    moec_bench_result r;
    T_ERR(moec_bench(NULL, v3, &bo, &r), MOEC_ERR_CAPACITY,
          "context 1024 is too long: each step decodes the token after it, and the model's "
          "max_position_embeddings 512 allows a context of at most 511");
    T_CHECK(r.context == 1024 && r.max_context == 511);
    int n_dev = 0;
    if (moec_cuda_device_count(&n_dev) != MOEC_OK || n_dev < 1) {
        bo.context = -1;
        T_ERR(moec_bench(NULL, v3, &bo, &r), MOEC_ERR_NO_DEVICE,
              "no CUDA device: no NVIDIA driver or GPU was found (");
        T_CHECK(r.context == 511 && r.max_context == 511);
    }
}

/* Plan sessions: every check that needs no device comes before the device. */
static void test_plan_session(const char *plan_path)
{
    moec_session_t *s = NULL;
    const char *v3 = t_src("tests/data/deepseek_v3");
    T_ERR(moec_session_init_plan(plan_path, t_src("tests/data/qwen3_moe"), 16, &s),
          MOEC_ERR_MISMATCH, "was compiled for another config");
    T_CHECK(s == NULL);
    T_ERR(moec_session_init_plan(plan_path, v3, 1000, &s), MOEC_ERR_INVALID_ARG,
          "max_seq_len 1000 exceeds the model's max_position_embeddings 512");
    T_ERR(moec_session_init_plan(plan_path, v3, 0, &s), MOEC_ERR_INVALID_ARG,
          "max_seq_len must be positive");
    T_ERR(moec_session_init_plan(plan_path, NULL, 16, &s), MOEC_ERR_INVALID_ARG, "NULL argument");

    size_t n;
    char *good = t_read_file(plan_path, &n);
    const char *bad = tmp_path("bad.moec");
    t_write_file(bad, good, n / 2);
    T_ERR(moec_session_init_plan(bad, v3, 16, &s), MOEC_ERR_FORMAT,
          "bad.moec is corrupt or truncated");
    t_write_file(bad, good, 100);
    T_ERR(moec_session_init_plan(bad, v3, 16, &s), MOEC_ERR_FORMAT, "bad.moec is truncated");
    free(good);
    T_ERR(moec_session_init_plan(v3, v3, 16, &s), MOEC_ERR_IO,
          "deepseek_v3 is a directory, not a plan file");
    T_ERR(moec_session_init_plan(t_src("tests/data/deepseek_v3/config.json"), v3, 16, &s),
          MOEC_ERR_FORMAT, "config.json is not a moec plan");
    remove(bad);

    int n_dev = 0;
    if (moec_cuda_device_count(&n_dev) != MOEC_OK || n_dev < 1) {
        T_ERR(moec_session_init_plan(plan_path, v3, 16, &s), MOEC_ERR_NO_DEVICE, "no CUDA device");
        T_CHECK(s == NULL);
    } else {
        T_OK(moec_session_init_plan(plan_path, v3, 16, &s));
        T_CHECK(moec_session_backend(s) == MOEC_BACKEND_CUDA && moec_session_vocab_size(s) == 256 &&
                moec_session_eos_token(s) == 1);
        moec_session_free(s);
    }
}

/* The steps of kind k in a bucket. */
static int count_steps(const ir_bucket *b, ir_step_kind k)
{
    int n = 0;
    for (int i = 0; i < b->n_steps; i++)
        n += b->steps[i].kind == k;
    return n;
}

static int has_kernel(const ir_bucket *b, const char *prefix)
{
    for (int k = 0; k < b->n_kernels; k++)
        if (!strncmp(b->kernel_names[k], prefix, strlen(prefix)))
            return 1;
    return 0;
}

/* tests/data/<name> compiled at tp 2, ep 2 (fp32_options) into
 * tmp_path(file), its plans and modules read back into plans[0..1],
 * mods[0..1] (NULL where it failed); the plan's path. */
static const char *compile_tp2_ep2_as(const char *name, const char *file, int combine,
                                      ir_plan **plans, ir_module **mods, ir_plan_meta *meta)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/%s", name);
    const char *dir = t_src(rel), *path = tmp_path(file);
    memset(plans, 0, 2 * sizeof *plans);
    memset(mods, 0, 2 * sizeof *mods);
    moec_model_t *m = NULL;
    T_OK(moec_model_open(dir, &m));
    moec_compile_options o = fp32_options();
    o.par = (moec_parallel){2, 2, 0, combine};
    if (combine) { /* one token a step too: a reduce_scatter straight from its operand */
        o.n_buckets = 2;
        o.buckets[0] = 1;
        o.buckets[1] = 4;
    }
    if (m)
        T_OK(moec_compile(m, dir, &o, path));
    if (m)
        T_OK(ir_plan_read_ranks(path, plans, mods, meta));
    moec_model_free(m);
    return path;
}

static const char *compile_tp2_ep2(const char *name, const char *file, ir_plan **plans,
                                   ir_module **mods, ir_plan_meta *meta)
{
    return compile_tp2_ep2_as(name, file, MOEC_EP_COMBINE_ALL_REDUCE, plans, mods, meta);
}

/* moec compile --tp 2 --ep 2 --ep-combine reduce-scatter, through codegen
 * and NVRTC for every rank: each MoE block's combine is a reduce_scatter
 * step (a rank's 32 of the 64 hidden columns of each token) and an
 * all_gather; with 4 tokens a kernel packs each rank's columns of every
 * row together before it and the gathered blocks are put in place after;
 * with one token the reduce_scatter reads its operand as it is. */
static void test_compile_ranks_scattered(void)
{
    ir_plan *plans[IR_MAX_RANKS];
    ir_module *mods[IR_MAX_RANKS];
    ir_plan_meta meta = {0};
    compile_tp2_ep2_as("deepseek_v3", "v3_tp2_rs.moec", MOEC_EP_COMBINE_REDUCE_SCATTER, plans,
                       mods, &meta);
    for (int r = 0; r < 2 && plans[r]; r++) {
        int layers = (int)ir_module_meta_int(mods[r], "num_hidden_layers", 0);
        int moe = t_count_ops(mods[r], IR_OP_MOE_ROUTED);
        T_CHECK(moe > 0 && plans[r]->n_buckets == 2);
        for (int k = 0; k < plans[r]->n_buckets; k++) {
            const ir_bucket *b = &plans[r]->buckets[k];
            int T = b->T, scatters = 0;
            T_CHECK(count_steps(b, IR_STEP_COLLECTIVE) == 2 + 2 * layers + moe);
            T_CHECK(has_kernel(b, "scatter_pack_r2_o4_b32_f32_f32") == (T == 4));
            T_CHECK(has_kernel(b, "gather_r2_o4_i32_f32") == (T == 4));
            for (int i = 0; i < b->n_steps; i++) {
                const ir_step *st = &b->steps[i];
                if (st->kind != IR_STEP_COLLECTIVE || st->coll.op != IR_OP_REDUCE_SCATTER)
                    continue;
                scatters++;
                T_CHECK(st->coll.ranks == 2 && st->coll.count == T * 32 &&
                        st->coll.dtype == IR_DTYPE_F32);
                T_CHECK(T == 4 ? st->coll.send.kind == IR_ARG_SCRATCH
                               : st->coll.send.kind == IR_ARG_ACT);
            }
            T_CHECK(scatters == moe);
        }
    }
    for (int r = 0; r < 2; r++) {
        ir_plan_free(plans[r]);
        ir_module_free(mods[r]);
    }
}

/* moec compile --tp 2 --ep 2: a plan per rank in one file, each with its
 * collectives as steps (the logits gathered through scratch, then put in
 * place), its rank's vocabulary rows and experts in its kernels; the file
 * says its split, a session asked for another is refused by name before
 * any device is asked for, and a one-plan reader refuses it. */
static void test_compile_ranks(void)
{
    const char *dir = t_src("tests/data/deepseek_v3");
    ir_plan *plans[IR_MAX_RANKS];
    ir_module *mods[IR_MAX_RANKS];
    ir_plan_meta meta = {0};
    const char *path = compile_tp2_ep2("deepseek_v3", "v3_tp2.moec", plans, mods, &meta);
    T_CHECK(meta.format == IR_PLAN_FORMAT && meta.tp == 2 && meta.ep == 2 &&
            ir_plan_meta_ranks(&meta) == 2);
    for (int r = 0; r < 2 && plans[r]; r++) {
        const ir_bucket *b = &plans[r]->buckets[0];
        int layers = (int)ir_module_meta_int(mods[r], "num_hidden_layers", 0);
        T_CHECK(ir_module_meta_int(mods[r], "rank", -1) == r);
        /* an all_reduce per layer's attention and MLP, the embedding's, the
         * logits' all_gather */
        T_CHECK(count_steps(b, IR_STEP_COLLECTIVE) == 2 + 2 * layers);
        T_CHECK(has_kernel(b, "gather_r2_o4_i128_f32"));
        T_CHECK(has_kernel(b, r ? "embedding_v128_h64_s128_t4" : "embedding_v128_h64_t4"));
        T_CHECK(has_kernel(b, r ? "moe_align_e8_s8_k4" : "moe_align_e8_k4"));
        for (int i = 0; i < b->n_steps; i++) {
            const ir_step *st = &b->steps[i];
            if (st->kind != IR_STEP_COLLECTIVE)
                continue;
            T_CHECK(st->coll.ranks == 2 && st->coll.dtype == IR_DTYPE_F32);
            T_CHECK(st->coll.op == IR_OP_ALL_GATHER ? st->coll.count == 4 * 128
                                                    : st->coll.count == 4 * 64);
        }
    }
    for (int r = 0; r < 2; r++) {
        ir_plan_free(plans[r]);
        ir_module_free(mods[r]);
    }
    ir_plan *one = NULL;
    ir_module *mod = NULL;
    T_ERR(ir_plan_read(path, &one, &mod, &meta), MOEC_ERR_UNSUPPORTED,
          "v3_tp2.moec is split over 2 ranks (tp 2, ep 2): it runs as a group of ranks");
    moec_session_t *s = NULL;
    moec_parallel want = {1, 0, 0, 0};
    T_ERR(moec_session_init_plan_parallel(path, dir, 16, &want, &s), MOEC_ERR_INVALID_ARG,
          "was compiled for tp 2, ep 2 (2 ranks); asked to run it with tp 1, ep 1: a plan runs "
          "with the split it was compiled for");
    want = (moec_parallel){2, 1, 0, 0};
    T_ERR(moec_session_init_plan_parallel(path, dir, 16, &want, &s), MOEC_ERR_INVALID_ARG,
          "asked to run it with tp 2, ep 1");
    T_CHECK(s == NULL);
    /* bench: another split than the plan's refused before any device is
     * looked for; its own split benched as a group (the GPUs counted) */
    moec_bench_options bo = {.n_batch = 1, .batch = {1}, .context = -1, .steps = 1,
                             .plan_path = path, .par = {2, 1, 0, 0}};
    moec_bench_result br;
    T_ERR(moec_bench(NULL, dir, &bo, &br), MOEC_ERR_INVALID_ARG,
          "v3_tp2.moec was compiled for tp 2, ep 2 (2 ranks); asked to run it with tp 2, ep 1");
    bo.par = (moec_parallel){0, 0, 0, 0};
    int n_dev = 0;
    if (moec_cuda_device_count(&n_dev) != MOEC_OK || n_dev < 1) {
        want = (moec_parallel){2, 2, 0, 0};
        T_ERR(moec_session_init_plan_parallel(path, dir, 16, &want, &s), MOEC_ERR_NO_DEVICE,
              "no CUDA device");
        T_ERR(moec_bench(NULL, dir, &bo, &br), MOEC_ERR_NO_DEVICE, "no CUDA device");
    } else if (n_dev < 2) {
        T_ERR(moec_session_init_plan(path, dir, 16, &s), MOEC_ERR_NO_DEVICE,
              "is split over 2 ranks (tp 2, ep 2): it needs 2 GPUs, this machine has 1");
        T_ERR(moec_bench(NULL, dir, &bo, &br), MOEC_ERR_NO_DEVICE,
              "is split over 2 ranks (tp 2, ep 2): it needs 2 GPUs, this machine has 1");
    }
    T_CHECK(s == NULL);
}

/* An fp8 checkpoint compiled split (--tp 2 --ep 2) along its blocks: each
 * rank's plan keeps q_b_proj in fp8, its box of codes (rows 384 r ..) and
 * the scales of its 3 blocks, the storage its codes then its scales; the
 * plan's checkpoint hash is the checkpoint's (scales included) and binds
 * only it. */
static void test_compile_fp8_ranks(void)
{
    const char *dir = t_src("tests/data/deepseek_v3_fp8_tp");
    ir_plan *plans[IR_MAX_RANKS];
    ir_module *mods[IR_MAX_RANKS];
    ir_plan_meta meta = {0};
    const char *path =
        compile_tp2_ep2("deepseek_v3_fp8_tp", "v3fp8_tp2.moec", plans, mods, &meta);
    for (int r = 0; r < 2 && mods[r]; r++) {
        const ir_value *q = ir_module_find_value(mods[r], "l0.attn.q_b_proj");
        T_CHECK(q && q->type.dtype == IR_DTYPE_F8E4M3 && q->type.dims[0] == 384 &&
                q->bind.box_start[0] == 384 * r && q->scale.bind.box_start[0] == 3 * r &&
                q->scale.bind.box_size[0] == 3);
        if (q)
            T_CHECK(ir_weight_storage_bytes(mods[r], q, IR_DTYPE_F32) ==
                    ir_weight_scale_offset(q) + 3 * 2 * sizeof(float));
        char w[17];
        T_OK(rt_hash_weights(mods[r], dir, w));
        T_CHECK(!strcmp(w, meta.weights_hash));
        T_OK(rt_plan_check_checkpoint(&meta, mods[r], path, dir));
        T_ERR(rt_plan_check_checkpoint(&meta, mods[r], path, t_src("tests/data/deepseek_v3_fp8")),
              MOEC_ERR_MISMATCH, "was compiled for another config");
    }
    for (int r = 0; r < 2; r++) {
        ir_plan_free(plans[r]);
        ir_module_free(mods[r]);
    }
}

/* A plan compiled unsharded is refused by name when a split is asked for. */
static void test_unsharded_plan_split(const char *plan_path)
{
    moec_session_t *s = NULL;
    moec_parallel want = {1, 0, 0, 0};
    T_ERR(moec_session_init_plan_parallel(plan_path, t_src("tests/data/deepseek_v3"), 16, &want,
                                          &s),
          MOEC_ERR_INVALID_ARG, "was compiled unsharded (no --tp); asked to run it with tp 1");
    T_CHECK(s == NULL);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "%s", t_tmpdir("compile"));
    const char *keep = getenv("MOEC_COMPILE_TEST_CACHE");
    if (keep && *keep)
        snprintf(g_cache, sizeof g_cache, "%s", keep);
    else
        snprintf(g_cache, sizeof g_cache, "%s/cubin", g_dir);
    char plan[4300];
    snprintf(plan, sizeof plan, "%s/v3.moec", g_dir);
    test_compile_errors();
    if (!HAVE_NVRTC) {
        moec_model_t *m = NULL;
        T_OK(moec_model_open(t_src("tests/data/deepseek_v3"), &m));
        T_ERR(moec_compile(m, t_src("tests/data/deepseek_v3"), NULL, plan), MOEC_ERR_UNSUPPORTED,
              "built without NVRTC");
        moec_model_free(m);
        fprintf(stderr, "SKIP: no compile checks: moec was built without the CUDA toolkit\n");
    } else {
        test_compile_v3(plan);
        test_compile_fp32();
        test_plan_session(plan);
        test_unsharded_plan_split(plan);
        test_compile_ranks();
        test_compile_ranks_scattered();
        test_compile_fp8_ranks();
        test_bench_plan(plan);
    }
    nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return t_finish("test_compile");
}
