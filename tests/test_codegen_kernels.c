/* test_codegen_kernels.c — the heavy kernels' emitters (attention,
 * mla_attention, moe_topk, moe_routed, moe_experts, argmax, and linears and
 * experts of fp8 weights) on hand-built modules of real model shapes and
 * odd small ones, and on the ops of the
 * tiny models after the whole pass pipeline, for buckets T = 1, 8, 64:
 * the steps they emit (kernels, grids, blocks, argument lists that match
 * the kernel signatures, scratch offsets) for every bucket, and an NVRTC
 * compile for sm_90 of one bucket of most modules (chosen so that every
 * kernel form compiles: expert blocks of 1, 2, 4 and 8 rows, split and
 * unsplit attention, tensor-core and CUDA-core MLA, the MLA prologue's
 * forms, DeepSeek-V3.2's indexer in its fast and legacy forms
 * (MOEC_DSA_KERNEL), bf16 and f32) whose cubin must hold every kernel; the
 * argmax's check for NaN and infinite logits in its source; the device
 * sampler at real and odd vocabularies (test_sampler). NVRTC takes a few tenths of a second per
 * kernel, hence one bucket each, compiled on a thread per CPU. */
#include <ctype.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cg.h"
#include "codegen/moe_routed.h"
#include "err.h"
#include "ir/ir_sample.h"
#include "kern_modules.h"
#include "passlib.h"
#include "testlib.h"

static const int BUCKETS[] = {1, 8, 64};
#define N_BUCKETS 3

/* The parameter count of kernel `name` in src (commas of its signature + 1). */
static int kernel_params(const char *src, const char *name, int *launch_bound)
{
    char pat[256];
    snprintf(pat, sizeof pat, " %s(", name);
    const char *p = strstr(src, pat);
    if (!p)
        return -1;
    const char *lb = p;
    while (lb > src && strncmp(lb, "__launch_bounds__(", 18) != 0)
        lb--;
    *launch_bound = atoi(lb + 18);
    int n = 1;
    for (p += strlen(pat); *p && *p != ')'; p++)
        n += *p == ',';
    return n;
}

/* Whether the line before kernel name's definition is a comment naming the
 * codegen file that produced it. */
static int has_header(const char *src, const char *name)
{
    char pat[256];
    snprintf(pat, sizeof pat, " %s(", name);
    const char *p = strstr(src, pat);
    if (!p)
        return 0;
    while (p > src && p[-1] != '\n')
        p--;
    if (p == src)
        return 0;
    const char *q = p - 1;
    while (q > src && q[-1] != '\n')
        q--;
    const char *cg = strstr(q, "(codegen/");
    return strncmp(q, "// ", 3) == 0 && cg && cg < p;
}

/* Emits the heavy ops of m (and the argmax of its output) for bucket T. */
static moec_status gen(const ir_module *m, const cg_options *o, int T, cg_ctx *c)
{
    memset(c, 0, sizeof *c);
    c->m = m;
    c->opt = o;
    c->T = T;
    for (int k = 0; k < m->n_ops; k++)
        if (km_is_heavy(m->ops[k]))
            MOEC_TRY(cg_emit_op(c, m->ops[k]));
    return cg_emit_argmax(c, m->outputs[0]);
}

/* 1 when moe_topk op topk's kernel computes the router's logits on tensor
 * cores (its name says so). */
static int topk_router_mma(const cg_ctx *c, const ir_op *topk)
{
    for (int i = 0; i < c->n_steps; i++)
        if (c->steps[i].op_id == topk->id)
            return strstr(c->kernel_names[c->steps[i].kernel], "_routermma_") != NULL;
    return 0;
}

/* Generic checks of one bucket's steps against its source. */
static void check_steps(const ir_module *m, const cg_ctx *c)
{
    int want = 1; /* argmax */
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        int n = 0;
        for (int i = 0; i < c->n_steps; i++)
            n += c->steps[i].op_id == op->id;
        if (op->kind == IR_OP_ATTENTION || op->kind == IR_OP_MLA_ATTENTION) {
            /* cache write (unless a prologue op writes the rows), attention,
               and the merge when the sequence is split */
            const ir_value *kvc = op->in[2], *kin = op->in[1];
            int pre = op->kind == IR_OP_MLA_ATTENTION && kvc->def &&
                      cg_mla_prologue_cache(m, kvc->def) == op;
            pre |= op->kind == IR_OP_ATTENTION && kin->def &&
                   cg_attn_prologue_cache(m, kin->def) == op;
            T_CHECK(n == 2 - pre || n == 3 - pre);
            want += n;
        } else if (op->kind == IR_OP_LINEAR && km_is_heavy(op)) {
            /* one kernel, or the few-rows kernel per group of up to 4 rows */
            T_CHECK(n >= 1 && n <= (c->T + 3) / 4);
            want += n;
        } else if (op->kind == IR_OP_MOE_ROUTED) {
            /* no align step where the moe_topk's kernel aligned (buckets up
               to CG_MOE_TOPK_ALIGN_MAX_T, and 2 to 64 tokens where it
               computes the router's logits on tensor cores) */
            const ir_op *topk = op->in[1]->def;
            int bm = 0;
            long long nb = 0;
            int fused = topk && cg_moe_topk_aligned(c, topk, &bm, &nb) == op;
            int mma = topk && topk_router_mma(c, topk);
            T_CHECK(!mma || (c->T >= 2 && c->T <= 64));
            T_CHECK(fused == (topk != NULL && (c->T <= CG_MOE_TOPK_ALIGN_MAX_T || mma)));
            int aligned = 0;
            for (int i = 0; i < c->n_steps; i++)
                aligned += topk && c->steps[i].op_id == topk->id &&
                           strstr(c->kernel_names[c->steps[i].kernel], "moe_topk_align_") != NULL;
            T_CHECK(aligned == fused);
            T_CHECK(n == km_steps_of(m, op) - fused);
            want += n;
        } else if (op->kind == IR_OP_ATTN_PROLOGUE) {
            /* none where the attention's kernel runs it (one token,
               the default; not under MOEC_ATTN_FUSE_PROLOGUE=0) */
            const ir_op *att = cg_attn_prologue_cache(m, op);
            int fused = att && cg_attn_prologue_fused(c, att) == op;
            T_CHECK(n == (fused ? 0 : km_steps_of(m, op)));
            want += n;
        } else {
            want += km_steps_of(m, op);
        }
    }
    T_CHECK(c->n_steps == want);
    for (int i = 0; i < c->n_steps; i++) {
        const ir_step *s = &c->steps[i];
        T_CHECK(s->kind == IR_STEP_KERNEL);
        T_CHECK(s->kernel >= 0 && s->kernel < c->n_kernels);
        if (s->kernel < 0 || s->kernel >= c->n_kernels)
            continue;
        const char *name = c->kernel_names[s->kernel];
        int lb = 0;
        int np = kernel_params(c->src.data, name, &lb);
        if (np != s->n_args || (int)s->block[0] != lb)
            fprintf(stderr, "%s: %d params, %d args; launch bound %d, block %u\n", name, np,
                    s->n_args, lb, s->block[0]);
        T_CHECK(np == s->n_args);
        T_CHECK((int)s->block[0] == lb);
        T_CHECK(s->block[0] % 32 == 0 && s->block[0] <= 1024 && s->block[1] == 1);
        T_CHECK(s->grid[0] >= 1 && s->grid[1] >= 1 && s->grid[2] >= 1);
        /* dynamic shared memory only for the tensor-core MLA kernel, the
           staged kernels, the fast DSA score kernel, the fast DSA
           select (its score row), the side stream's GEMVs (a pad,
           cg_side_smem_pad) and the few-token linear's tile form (its
           warps' sums, which a cluster's blocks read) */
        T_CHECK(s->smem == 0 ||
                ((strstr(name, "_mma_") || strstr(name, "_f8tc_") ||
                  !strncmp(name, "linear_tc_", 10) ||
                  (!strncmp(name, "linear_gemv_", 12) &&
                   (s->stream == 1 || strstr(name, "_tl"))) ||
                  !strncmp(name, "dsa_score_tc_", 13) || !strncmp(name, "dsa_select_r11_", 15)) &&
                 s->smem <= 227 * 1024));
        T_CHECK(has_header(c->src.data, name));
        for (int a = 0; a < s->n_args; a++)
            if (s->args[a].kind == IR_ARG_SCRATCH)
                T_CHECK(s->args[a].i >= 0 && (size_t)s->args[a].i < c->scratch_bytes &&
                        s->args[a].i % 16 == 0);
    }
}

/* Finds the steps of the first op of kind k; returns the first step index. */
static int steps_of(const ir_module *m, const cg_ctx *c, ir_op_kind k)
{
    for (int j = 0; j < m->n_ops; j++)
        if (m->ops[j]->kind == k)
            for (int i = 0; i < c->n_steps; i++)
                if (c->steps[i].op_id == m->ops[j]->id)
                    return i;
    return -1;
}

/* The first moe_routed's gate_up step (-1: none), and the step that
 * aligned its slots with the argument index of its sorted slots (then
 * block experts, count used): its own align kernel's (1), or in buckets
 * up to CG_MOE_TOPK_ALIGN_MAX_T, or where it computes the router's logits
 * on tensor cores, its moe_topk's kernel's (its last three arguments). */
static int moe_gate_up_step(const ir_module *m, const cg_ctx *c, const ir_step **al, int *al_arg)
{
    int r = steps_of(m, c, IR_OP_MOE_ROUTED), k = steps_of(m, c, IR_OP_MOE_TOPK);
    if (r < 0)
        return -1;
    int fused = k >= 0 && strstr(c->kernel_names[c->steps[k].kernel], "moe_topk_align_") != NULL;
    T_CHECK(fused == (k >= 0 && (c->T <= CG_MOE_TOPK_ALIGN_MAX_T ||
                                 strstr(c->kernel_names[c->steps[k].kernel], "_routermma_"))));
    *al = fused ? &c->steps[k] : &c->steps[r];
    *al_arg = fused ? (*al)->n_args - 3 : 1;
    return fused ? r : r + 1;
}

static int has(const void *bin, size_t n, const char *s)
{
    return memmem(bin, n, s, strlen(s)) != NULL;
}

/* A program waiting for NVRTC, and the kernels its cubin must hold. */
typedef struct compile_job {
    char *label, *src;
    moec_buf names; /* kernel names, one per line */
    void *cubin;
    size_t size;
    moec_status st;
    char err[2048];
} compile_job;

#define MAX_JOBS 80
static compile_job jobs[MAX_JOBS];
static int n_jobs, next_job;
static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *cache_dir;

static void *compile_worker(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&job_lock);
        int i = next_job++;
        pthread_mutex_unlock(&job_lock);
        if (i >= n_jobs)
            return NULL;
        compile_job *j = &jobs[i];
        j->st = cg_compile(j->src, "sm_90", cache_dir, &j->cubin, &j->size);
        if (j->st != MOEC_OK)
            snprintf(j->err, sizeof j->err, "%s", moec_last_error());
    }
}

/* Compiles every queued program on a thread per CPU (NVRTC takes a good
 * tenth of a second per kernel) and checks each cubin holds its kernels. */
static void compile_all(void)
{
    cache_dir = t_tmpdir("cg_kern");
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int n_threads = cpus < 1 ? 1 : cpus > 8 ? 8 : (int)cpus;
    pthread_t th[8];
    int started = 0;
    for (int i = 1; i < n_threads; i++)
        if (pthread_create(&th[started], NULL, compile_worker, NULL) == 0)
            started++;
    compile_worker(NULL);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < n_jobs; i++) {
        compile_job *j = &jobs[i];
#ifdef MOEC_HAVE_CUDA
        if (j->st != MOEC_OK)
            fprintf(stderr, "%s: %s\n", j->label, j->err);
        T_CHECK(j->st == MOEC_OK);
        for (char *line = j->names.data; j->st == MOEC_OK && line && *line;) {
            char *nl = strchr(line, '\n');
            *nl = '\0';
            int found = has(j->cubin, j->size, line);
            if (!found)
                fprintf(stderr, "%s: no kernel %s in the cubin\n", j->label, line);
            T_CHECK(found);
            line = nl + 1;
        }
#else
        T_CHECK(j->st != MOEC_OK);
#endif
        free(j->cubin);
        free(j->src);
        free(j->label);
        moec_buf_free(&j->names);
    }
    n_jobs = next_job = 0;
}

/* The next job's slot, cleared (queued once its caller counts it in
 * n_jobs), or NULL, a failed check, when every slot is taken. */
static compile_job *job_slot(void)
{
    T_CHECK(n_jobs < MAX_JOBS);
    if (n_jobs >= MAX_JOBS)
        return NULL;
    compile_job *j = &jobs[n_jobs];
    memset(j, 0, sizeof *j);
    return j;
}

/* Adds c's source (its programmatic waits in place) to program prog and
 * kernel kn to job j's names. */
static void job_add(compile_job *j, moec_buf *prog, cg_ctx *c, const char *kn)
{
    cg_add_pdl_waits(&c->src);
    moec_buf_printf(prog, "%s", c->src.data ? c->src.data : "");
    moec_buf_printf(&j->names, "%s\n", kn);
}

/* Queues job j (job_slot's) with program prog, its kernels' names already
 * in j->names, under label; where either ran out of memory (a failed
 * check), frees them instead. */
static void job_queue(compile_job *j, moec_buf *prog, const char *label)
{
    T_CHECK(!prog->oom && !j->names.oom);
    if (prog->oom || j->names.oom) {
        moec_buf_free(prog);
        moec_buf_free(&j->names);
        return;
    }
    j->label = strdup(label);
    j->src = prog->data;
    n_jobs++;
}

/* The last op of kind k in m, NULL if none. */
static const ir_op *last_op(const ir_module *m, ir_op_kind k)
{
    const ir_op *op = NULL;
    for (int i = 0; i < m->n_ops; i++)
        if (m->ops[i]->kind == k)
            op = m->ops[i];
    return op;
}

/* Generates m for every bucket, checks the steps, calls check(m, c) per
 * bucket, and queues the buckets in compile_mask (bit b: BUCKETS[b]) as one
 * program for compile_all. */
static void run_module_at(const ir_module *m, const cg_options *o, const int *buckets, int nb,
                          void (*check)(const ir_module *, const cg_ctx *), unsigned compile_mask)
{
    compile_job *j = job_slot();
    if (!j)
        return;
    moec_buf prog = {0};
    cg_emit_prologue(&prog);
    int ok = 1;
    for (int b = 0; b < nb; b++) {
        cg_ctx c;
        moec_status st = gen(m, o, buckets[b], &c);
        T_OK(st);
        if (st == MOEC_OK) {
            check_steps(m, &c);
            if (check)
                check(m, &c);
            if (compile_mask & (1u << b)) {
                moec_buf_printf(&prog, "%s", c.src.data);
                for (int k = 0; k < c.n_kernels; k++)
                    moec_buf_printf(&j->names, "%s\n", c.kernel_names[k]);
            }
        }
        ok = ok && st == MOEC_OK;
        cg_ctx_free(&c);
    }
    T_CHECK(!prog.oom && !j->names.oom);
    if (!ok || prog.oom || j->names.oom || !compile_mask) {
        moec_buf_free(&prog);
        moec_buf_free(&j->names);
        return;
    }
    char label[128];
    snprintf(label, sizeof label, "%s (%s, buckets mask %u)", m->name,
             ir_dtype_name(o->compute_dtype), compile_mask);
    j->label = strdup(label);
    j->src = prog.data;
    n_jobs++;
}

static void run_module(const ir_module *m, const cg_options *o,
                       void (*check)(const ir_module *, const cg_ctx *), unsigned compile_mask)
{
    run_module_at(m, o, BUCKETS, N_BUCKETS, check, compile_mask);
}

/* ---- the real model shapes ----------------------------------------------- */

/* cg_scratch's arithmetic: reserve n bytes at the next 16-byte boundary. */
static size_t reserve(size_t *top, size_t n)
{
    size_t off = (*top + 15) / 16 * 16;
    *top = off + n;
    return off;
}

/* Splits of a sequence for `blocks` blocks a split: 264 of them, rounded
 * down for the tensor-core MLA kernel (one wave), up for the others. */
static int splits(int blocks, int one_wave)
{
    int ns = one_wave ? 264 / blocks : (264 + blocks - 1) / blocks;
    return ns < 1 ? 1 : ns > 64 ? 64 : ns;
}

/* 1 where a GQA kernel of key and value channels dk, dv (8 query heads a
 * block at most) takes the tensor cores' form: a bf16 cache, one lane a
 * position (MOEC_ATTN_LPP unset or 1), MOEC_ATTN_TC not 0, channels in 32s
 * and 64s. Its splits fill one wave of 264 blocks (two a SM). */
static int gqa_tc(const cg_ctx *c, int dk, int dv)
{
    const char *lv = getenv("MOEC_ATTN_LPP"), *tv = getenv("MOEC_ATTN_TC");
    return c->opt->compute_dtype == IR_DTYPE_BF16 && (!lv || atoi(lv) == 1) &&
           (!tv || atoi(tv) != 0) && dk % 32 == 0 && dv % 64 == 0;
}

/* DeepSeek-V2-Lite: MLA 16 heads r 512 dr 64, 64 experts top-6, H 2048, I 1408. */
static void check_prefetch(const char *src, const char *name, long long pf, int want,
                           const char *weights);

static void check_v2lite(const ir_module *m, const cg_ctx *c)
{
    int T = c->T;
    int a = steps_of(m, c, IR_OP_MLA_ATTENTION);
    T_CHECK(a >= 0);
    if (a >= 0) {
        const ir_step *w = &c->steps[a], *s = &c->steps[a + 1];
        T_CHECK(w->grid[0] == (unsigned)T && w->n_args == 8 && w->args[6].kind == IR_ARG_KV &&
                w->args[6].i == 0 && w->args[7].i == 1);
        /* every head of a token in one block: the cache rows are read once;
           the sequence split to fill the GPU */
        int ns = splits(T, 1);
        T_CHECK(s->grid[0] == (unsigned)T && s->grid[1] == 1 && s->grid[2] == (unsigned)ns &&
                s->block[0] == 256);
        /* bf16 and heads in sixteens: the tensor-core kernel, 104144 bytes of
           smem, two buffers of 32-position tiles (by bulk copies on sm_90) */
        T_CHECK(strstr(c->kernel_names[s->kernel], "mla_attn_mma_h16_r512_dr64_pt32_nb2_") != NULL);
        T_CHECK((strstr(c->kernel_names[s->kernel], "_tma_") != NULL) ==
                (cg_arch_num(c->opt) >= 90 && !getenv("MOEC_MLA_TMA")));
        /* the softmax two rows a warp at once over half-warps, unless
           MOEC_MLA_SM2=0 (the name says so) */
        const char *sm = getenv("MOEC_MLA_SM2");
        int sm2 = !sm || atoi(sm) != 0;
        T_CHECK((strstr(c->kernel_names[s->kernel], "_sm1_") == NULL) == sm2);
        T_CHECK(strstr(c->src.data, sm2 ? "constexpr bool TMA = true, SM2 = true,"
                                        : "constexpr bool TMA = true, SM2 = false,") != NULL ||
                cg_arch_num(c->opt) < 90 || getenv("MOEC_MLA_TMA"));
        /* two column tiles a warp sharing q's fragments unless
           MOEC_MLA_CT=1 or they would not fit (sm_86's 99 KiB; the name says
           so): the scores in 4 k parts, else 2 */
        const char *ctv = getenv("MOEC_MLA_CT");
        int ct1 = (ctv && atoi(ctv) == 1) || (!ctv && cg_smem_max(c->opt) < 104144);
        T_CHECK((strstr(c->kernel_names[s->kernel], "_ct1_") != NULL) == ct1);
        /* the scores' 36 k steps unrolled whole from shared addresses where
           each of their parts holds whole steps (8 warps: 4 parts, 2 with one
           column tile; 16 warps twice as many) unless MOEC_MLA_QK2=0 (the name
           says so) */
        const char *qk = getenv("MOEC_MLA_QK2"), *wv = getenv("MOEC_MLA_WARPS"),
                   *ptv = getenv("MOEC_MLA_PT");
        int nq = (ptv && atoi(ptv) < 32 ? 16 : 32) / 8 / (ct1 ? 1 : 2);
        int nw = wv && atoi(wv) >= 16 ? 16 : 8, parts = nw / nq > 1 ? nw / nq : 1;
        int qk2 = (!qk || atoi(qk) != 0) && 36 % parts == 0;
        T_CHECK((strstr(c->kernel_names[s->kernel], "_qk2_") != NULL) == qk2);
        T_CHECK(strstr(c->src.data, qk2 ? "QK2 = true," : "QK2 = false,") != NULL);
        /* the softmax weights by 2^x unless MOEC_MLA_EX2=0; the first tiles
           before the wait where bulk copies load them (sm_90, unless
           MOEC_MLA_TMA=0), in buckets of up to 64 tokens, unless
           MOEC_MLA_EARLY=0 (the names say so) */
        const char *exv = getenv("MOEC_MLA_EX2"), *ev = getenv("MOEC_MLA_EARLY"),
                   *tv = getenv("MOEC_MLA_TMA");
        int ex2 = !exv || atoi(exv) != 0;
        int early = cg_arch_num(c->opt) >= 90 && (!tv || atoi(tv) != 0) && c->T <= 64 &&
                    (!ev || atoi(ev) != 0);
        T_CHECK((strstr(c->kernel_names[s->kernel], "_ex2_") != NULL) == ex2);
        T_CHECK((strstr(c->kernel_names[s->kernel], "_early_") != NULL) == early);
        T_CHECK(strstr(c->src.data, ex2 ? "EX2 = true," : "EX2 = false,") != NULL);
        /* q, two kv tiles, the scores' k parts, P, m/l/alpha, two mbarriers */
        T_CHECK(s->smem == 16 * 584 * 2 + 2 * 32 * 584 * 2 + (ct1 ? 2 : 4) * 16 * 36 * 4 +
                               16 * 40 * 2 + 192 + 2 * 8);
        const char *mv = getenv("MOEC_ATTN_MERGE");
        /* merged in the kernel where a group's partial states are at most
           64 KiB (MOEC_ATTN_MERGE=2: always) */
        int merge = ns > 1 && !(mv && !strcmp(mv, "0")) &&
                    ((mv && !strcmp(mv, "2")) || ns * 16 * 512 * 4 <= 64 * 1024);
        T_CHECK(s->n_args == (ns > 1 ? 13 + merge : 11));
        if (merge) {
            /* the last block of each token's heads merges the splits: the
               counters are the last argument, and no merge kernel follows */
            T_CHECK(strstr(c->kernel_names[s->kernel], "_m_bs") != NULL);
            T_CHECK(s->args[13].kind == IR_ARG_INPUT &&
                    s->args[13].index == IR_INPUT_SPLIT_COUNTERS);
            T_CHECK(s->args[11].kind == IR_ARG_SCRATCH && s->args[12].kind == IR_ARG_SCRATCH);
            T_CHECK(a + 2 >= c->n_steps || c->steps[a + 2].op_id != s->op_id);
        } else if (ns > 1) {
            const ir_step *cb = s + 1;
            T_CHECK(strstr(c->kernel_names[cb->kernel], "mla_combine_h16_r512") != NULL);
            T_CHECK(cb->grid[0] == (unsigned)T && cb->grid[1] == 16 && cb->n_args == 6);
            T_CHECK(cb->args[3].i == s->args[11].i && cb->args[4].i == s->args[12].i);
            /* a group of 128 threads (512 channels in fours) per eight splits,
               at most 8 groups */
            int g = (ns + 7) / 8 > 8 ? 8 : (ns + 7) / 8;
            char gname[16];
            snprintf(gname, sizeof gname, "_g%d_", g);
            T_CHECK(cb->block[0] == (unsigned)(128 * g) &&
                    strstr(c->kernel_names[cb->kernel], gname) != NULL);
        }
        T_CHECK(s->args[5].kind == IR_ARG_CONFIG && s->args[5].index == IR_CONFIG_MAX_BLOCKS);
        T_CHECK(s->args[9].kind == IR_ARG_F32 && s->args[9].f > 0.13 && s->args[9].f < 0.14);
    }
    /* the router's linear in the top-k kernel, which also aligns: a
       cluster of 8 blocks of 8 warps, a warp per expert row at one token
       (the GEMV form), on tensor cores at 8 and 64 (args x, w, ids,
       weights, scaling and the align's three) */
    int k = steps_of(m, c, IR_OP_MOE_TOPK);
    T_CHECK(k >= 0 && c->steps[k].grid[0] == 8 && c->steps[k].block[0] == 256 &&
            c->steps[k].n_args == 8);
    if (k >= 0) {
        char tk[96];
        /* at one token the block's weight rows (8 of 2048 a warp: 32
           registers a thread) are read before the wait */
        snprintf(tk, sizeof tk, "moe_topk_align_bm%d_router%s_h2048_bf16%s_e64_k6_softmax",
                 T == 64 ? 8 : T == 8 ? 2 : 1, T == 1 ? "" : "mma", T == 1 ? "_wpre" : "");
        T_CHECK(strstr(c->kernel_names[c->steps[k].kernel], tk) != NULL);
        /* its weight rows read before the wait, and nothing else */
        if (T == 1 && c->src.data)
            check_prefetch(c->src.data, c->kernel_names[c->steps[k].kernel], 0, 0, "w");
        T_CHECK(c->steps[k].args[0].kind == IR_ARG_ACT &&
                c->steps[k].args[0].index == ir_module_find_value(m, "x")->id &&
                c->steps[k].args[1].kind == IR_ARG_WEIGHT &&
                c->steps[k].args[1].index == ir_module_find_value(m, "rw")->id);
    }
    const ir_step *al = NULL;
    int ala = 0, r = moe_gate_up_step(m, c, &al, &ala);
    T_CHECK(r >= 0);
    if (r < 0)
        return;
    /* T=1 and 8: one and two rows per expert block on CUDA cores, the
       streaming form (4 warps of 2 gate/up rows, 8 down rows at one slot a
       block and 4 at two, 4 chunks in flight: 8 of gate_up's 256-wide
       chunks in 2 rounds, down's 5.5 in 2 of 3); T=64 (12 rows per block
       wanted): tensor cores, blocks of 8 rows, one warp of 16 rows, 8
       chunks in flight for gate_up and 4 for down */
    int mma = T == 64, bm = T == 64 ? 8 : T == 8 ? 2 : 1;
    int n = T * 6, nnz = n < 64 ? n : 64;
    int nb = (n + (bm - 1) * nnz + bm - 1) / bm;
    const ir_step *gu = &c->steps[r], *dn = gu + 1, *sm = gu + 2;
    char want[128];
    /* the tensor-core forms keep h in bf16 (_h16) */
    snprintf(want, sizeof want, "moe_gate_up_e64_k6_h2048_i1408_bm%d_%s_t%d_bf16_bf16_fused%s", bm,
             mma ? "mma_w1_u8" : "gv_w4_r2_u4", T, mma ? "_h16" : "");
    T_CHECK(!strcmp(c->kernel_names[gu->kernel], want));
    snprintf(want, sizeof want, "moe_down_e64_k6_h2048_i1408_bm%d_%s_t%d_bf16_f32_w%s_pre", bm,
             mma ? "mma_w1_u4" : bm == 1 ? "gv_w4_r8_u3" : "gv_w4_r4_u3", T, mma ? "_h16" : "");
    T_CHECK(!strcmp(c->kernel_names[dn->kernel], want));
    T_CHECK(al == &c->steps[k] && al->grid[0] == 8 && al->grid[1] == 1);
    T_CHECK(gu->grid[0] == (unsigned)nb && gu->grid[1] == (mma ? 1408 / 16 : 1408 / 8) &&
            gu->block[0] == (mma ? 32 : 128));
    T_CHECK(dn->grid[0] == (unsigned)nb && dn->grid[1] == (bm == 1 ? 2048 / 32 : 2048 / 16) &&
            dn->block[0] == (mma ? 32 : 128));
    T_CHECK(sm->grid[0] == (unsigned)T && sm->grid[1] == 2);
    /* scratch: the attention splits' (m, l) and outputs; sorted slots,
       block experts, used count, h [T*K, I], y [T*K, H] */
    size_t top = 0;
    int ns = splits(T, 1);
    if (ns > 1) {
        reserve(&top, (size_t)T * 16 * ns * 2 * 4);
        reserve(&top, (size_t)T * 16 * ns * 512 * 4);
    }
    T_CHECK(al->args[ala].i == (int64_t)reserve(&top, (size_t)nb * bm * 4));
    T_CHECK(al->args[ala + 1].i == (int64_t)reserve(&top, (size_t)nb * 4));
    T_CHECK(al->args[ala + 2].i == (int64_t)reserve(&top, 4));
    T_CHECK(gu->args[3].i == al->args[ala].i && gu->args[4].i == al->args[ala + 1].i &&
            gu->args[5].i == al->args[ala + 2].i);
    T_CHECK(gu->args[6].i == (int64_t)reserve(&top, (size_t)n * 1408 * (mma ? 2 : 4)));
    T_CHECK(sm->args[0].i == (int64_t)reserve(&top, (size_t)n * 2048 * 4));
    T_CHECK(c->scratch_bytes == top);
    T_CHECK(gu->args[1].kind == IR_ARG_WEIGHT && gu->args[2].index == gu->args[1].index);
    T_CHECK(dn->args[5].kind == IR_ARG_ACT && dn->args[6].kind == IR_ARG_F32 &&
            dn->args[6].f == 1.0);
    T_CHECK(sm->args[2].kind == IR_ARG_ACT && sm->args[2].index == ir_module_find_value(m, "y")->id);
}

/* DeepSeek-V3: MLA 128 heads, sigmoid routing with bias over 8 groups (4
 * kept, top2_sum), 256 experts top-8, H 7168, I 2048. */
static void check_v3(const ir_module *m, const cg_ctx *c)
{
    int a = steps_of(m, c, IR_OP_MLA_ATTENTION);
    T_CHECK(a >= 0 && c->steps[a + 1].grid[1] == 128 / 16);
    int k = steps_of(m, c, IR_OP_MOE_TOPK);
    T_CHECK(k >= 0);
    if (k >= 0) {
        const ir_step *s = &c->steps[k];
        int fused = c->T <= CG_MOE_TOPK_ALIGN_MAX_T;
        T_CHECK(s->n_args == (fused ? 8 : 5) && s->args[1].kind == IR_ARG_WEIGHT &&
                s->args[4].f == 2.5);
        T_CHECK(strstr(c->kernel_names[s->kernel],
                       fused ? "moe_topk_align_bm1_e256_k8_sigmoid_g8_tg4_top2_n1_bf32"
                             : "moe_topk_e256_k8_sigmoid_g8_tg4_top2_n1_bf32") != NULL);
    }
    /* gate_up: 2048 rows, down: 7168 rows; 8 and 16 rows per block in the
       streaming form up to T=32 (blocks of 1 or 2 slots; down 32 rows in
       blocks of one slot, up to T=16 here), 16 on tensor cores once T >
       48 wants four slots on a block of 256 experts */
    const ir_step *al = NULL;
    int ala = 0, r = moe_gate_up_step(m, c, &al, &ala);
    int bm1 = strstr(r >= 0 ? c->kernel_names[c->steps[r + 1].kernel] : "", "_bm1_") != NULL;
    T_CHECK(r >= 0 && c->steps[r].grid[1] == (c->T <= 32 ? 2048 / 8 : 2048 / 16) &&
            c->steps[r + 1].grid[1] == (bm1 ? 7168 / 32 : 7168 / 16));
}

/* Qwen3-30B-A3B: GQA 32 q heads, 4 kv heads, d 128; 128 experts top-8,
 * H 2048, I 768 with separate gate and up. */
static void check_qwen3(const ir_module *m, const cg_ctx *c)
{
    int a = steps_of(m, c, IR_OP_ATTENTION);
    T_CHECK(a >= 0);
    if (a >= 0) {
        const ir_step *w = &c->steps[a], *s = &c->steps[a + 1];
        int tc = gqa_tc(c, 128, 128);
        T_CHECK(w->grid[0] == (unsigned)c->T && w->args[0].kind == IR_ARG_ACT);
        /* a block per (token, kv head, split): the 8 heads of a group share its reads */
        T_CHECK(s->grid[0] == (unsigned)c->T && s->grid[1] == 4 &&
                s->grid[2] == (unsigned)splits(c->T * 4, tc));
        T_CHECK(strstr(c->kernel_names[s->kernel], "attn_h32_hkv4_dk128_dv128_gb8") != NULL);
        T_CHECK(s->args[1].kind == IR_ARG_INPUT && s->args[1].index == IR_INPUT_POSITIONS);
        T_CHECK(s->args[2].kind == IR_ARG_INPUT && s->args[2].index == IR_INPUT_SLOTS);
        T_CHECK(s->args[3].kind == IR_ARG_INPUT && s->args[3].index == IR_INPUT_BLOCK_TABLE);
        T_CHECK(s->args[9].kind == IR_ARG_I32 && s->args[9].i == 0);
        /* splits of at least 128 positions (the tensor cores' form: 64);
           merged by the kernel's last block where a group's partial states
           are at most 64 KiB (T = 8: 9 splits, 36 KiB; 8 on tensor cores),
           else by a merge kernel (T = 1: 64 splits, 256 KiB) */
        int ns = splits(c->T * 4, tc), merge = ns > 1 && ns * 8 * 128 * 4 <= 64 * 1024;
        /* lanes a position: one by default (on tensor cores, _tc, unless
           MOEC_ATTN_TC=0); MOEC_ATTN_LPP=N fixes N (_lppN past one), 0 the
           kernel's choice at run time where the sequence is split (_lppa),
           one where it is not. The splits' fewest positions at one lane a
           position, 128, name the kernel either way. */
        const char *lv = getenv("MOEC_ATTN_LPP");
        int lpp = lv ? atoi(lv) : 1;
        char mp[32];
        if (lpp == 0)
            snprintf(mp, sizeof mp, "_mp128_lppa_");
        else if (lpp > 1)
            snprintf(mp, sizeof mp, "_mp128_lpp%d_", lpp);
        else
            snprintf(mp, sizeof mp, tc ? "_mp64_tc_" : "_mp128_");
        T_CHECK(ns == 1 ? strstr(c->kernel_names[s->kernel], "_lpp") == NULL
                        : strstr(c->kernel_names[s->kernel], mp) != NULL);
        T_CHECK((strstr(c->kernel_names[s->kernel], "_tc_") != NULL) == tc);
        T_CHECK(s->n_args == (ns > 1 ? 12 + merge : 10));
        if (merge)
            T_CHECK(s->args[12].kind == IR_ARG_INPUT &&
                    s->args[12].index == IR_INPUT_SPLIT_COUNTERS &&
                    strstr(c->kernel_names[s->kernel], "_m_bs") != NULL);
        else if (ns > 1)
            T_CHECK(a + 2 < c->n_steps &&
                    strstr(c->kernel_names[c->steps[a + 2].kernel], "attn_combine_h32_dv128") != NULL);
        T_CHECK(c->T != 8 || merge);
    }
    const ir_step *al = NULL;
    int ala = 0, r = moe_gate_up_step(m, c, &al, &ala);
    T_CHECK(r >= 0);
    if (r >= 0) {
        const ir_step *gu = &c->steps[r];
        T_CHECK(strstr(c->kernel_names[gu->kernel], "_split") != NULL);
        T_CHECK(gu->args[1].kind == IR_ARG_WEIGHT && gu->args[2].kind == IR_ARG_WEIGHT &&
                gu->args[1].index != gu->args[2].index);
    }
    int last = c->n_steps - 1;
    T_CHECK(c->steps[last].args[1].kind == IR_ARG_INPUT &&
            c->steps[last].args[1].index == IR_INPUT_SAMPLED && c->steps[last].grid[0] == (unsigned)c->T);
}

/* DeepSeek-V3.2: the indexer (64 heads of 128, top 2048) before the sparse
 * MLA attention over the selection. Fast form (the default): the scores on
 * tensor cores by a grid of 528 blocks of 128 sharing every token's tiles
 * (q, two key tiles, head weights and the tokens' first tiles in dynamic
 * shared memory), the select keeping 32768 scores in shared memory. */
static void check_v32(const ir_module *m, const cg_ctx *c)
{
    int T = c->T, d = steps_of(m, c, IR_OP_DSA_TOPK), a = steps_of(m, c, IR_OP_MLA_ATTENTION);
    const ir_op *dsa = ir_module_find_value(m, "sel")->def;
    T_CHECK(d >= 0 && a > d);
    if (d < 0 || a < 0)
        return;
    const ir_step *w = &c->steps[d], *sc = &c->steps[d + 1], *se = &c->steps[d + 2];
    /* keys into pool 0; scores into the first dsa_topk's pool 1, which the select reads */
    T_CHECK(w->grid[0] == (unsigned)T && w->n_args == 6 && w->args[5].kind == IR_ARG_KV &&
            w->args[5].index == dsa->id && w->args[5].i == 0);
    T_CHECK(strstr(c->kernel_names[sc->kernel], "dsa_score_tc_h64_d128_k2048_pt64_g528_") != NULL);
    T_CHECK(sc->grid[0] == 528 && sc->grid[1] == 1 && sc->block[0] == 128 &&
            sc->smem == (unsigned)(64 * 136 * 2 + 2 * 64 * 136 * 2 + 64 * 4 + 2 * 4 + (T + 1) * 4));
    T_CHECK(sc->n_args == 10 && sc->args[6].kind == IR_ARG_KV && sc->args[6].i == 0 &&
            sc->args[7].kind == IR_ARG_KV && sc->args[7].index == dsa->id && sc->args[7].i == 1);
    T_CHECK(strstr(c->kernel_names[se->kernel], "dsa_select_r11_k2048_c32768_") != NULL);
    T_CHECK(se->grid[0] == (unsigned)T && se->block[0] == 1024 && se->smem == 32768 * 4 &&
            se->args[0].kind == IR_ARG_KV && se->args[0].i == 1 && se->args[4].kind == IR_ARG_ACT &&
            se->args[4].index == dsa->out[0]->id);
    /* the sparse MLA kernel reads sel (its third argument) */
    const ir_step *at = &c->steps[a + 1];
    T_CHECK(strstr(c->kernel_names[at->kernel], "_k2048") != NULL);
    T_CHECK(at->args[2].kind == IR_ARG_ACT && at->args[2].index == dsa->out[0]->id);
}

/* The legacy form (MOEC_DSA_KERNEL=legacy): a grid row of 256-thread
 * blocks per token, the select reading global memory. */
static void check_v32_legacy(const ir_module *m, const cg_ctx *c)
{
    int T = c->T, d = steps_of(m, c, IR_OP_DSA_TOPK);
    const ir_op *dsa = ir_module_find_value(m, "sel")->def;
    T_CHECK(d >= 0);
    if (d < 0)
        return;
    const ir_step *sc = &c->steps[d + 1], *se = &c->steps[d + 2];
    T_CHECK(strstr(c->kernel_names[sc->kernel], "dsa_score_mma_h64_d128_k2048_pt64_") != NULL);
    T_CHECK(sc->grid[0] == (unsigned)T && sc->grid[1] == (unsigned)((528 + T - 1) / T) &&
            sc->block[0] == 256 && sc->smem == 0);
    T_CHECK(sc->args[7].kind == IR_ARG_KV && sc->args[7].index == dsa->id && sc->args[7].i == 1);
    T_CHECK(!strncmp(c->kernel_names[se->kernel], "dsa_select_k2048_", 17));
    T_CHECK(se->grid[0] == (unsigned)T && se->block[0] == 1024 && se->smem == 0 &&
            se->args[4].index == dsa->out[0]->id);
}

/* The fast select's capacity: MOEC_DSA_SELECT_CAP (0: every row from
 * global memory), and at most what the arch lets a block opt in to. */
static void check_v32_cap(const ir_module *m, const cg_ctx *c, const char *name, unsigned smem)
{
    int d = steps_of(m, c, IR_OP_DSA_TOPK);
    T_CHECK(d >= 0);
    if (d < 0)
        return;
    const ir_step *se = &c->steps[d + 2];
    T_CHECK(strstr(c->kernel_names[se->kernel], name) != NULL && se->smem == smem);
}

static void check_v32_cap0(const ir_module *m, const cg_ctx *c)
{
    check_v32_cap(m, c, "dsa_select_r11_k2048_c0_", 0);
}

static void check_v32_sm86(const ir_module *m, const cg_ctx *c)
{
    /* 99 KiB less the histograms: 20480 scores */
    check_v32_cap(m, c, "dsa_select_r11_k2048_c20480_", 20480 * 4);
}

/* MOEC_ATTN_MERGE=3: every split attention kernel merges its own splits,
 * GQA's from those that may hold positions (_ml), with no merge kernel. */
static void check_merge_live(const ir_module *m, const cg_ctx *c)
{
    int a = steps_of(m, c, IR_OP_ATTENTION);
    T_CHECK(a >= 0);
    if (a < 0)
        return;
    const ir_step *s = &c->steps[a + 1];
    int split = strstr(c->kernel_names[s->kernel], "_ns1_") == NULL;
    T_CHECK((strstr(c->kernel_names[s->kernel], "_ml_bs") != NULL) == split);
    for (int i = 0; i < c->n_steps; i++)
        T_CHECK(strstr(c->kernel_names[c->steps[i].kernel], "attn_combine_") == NULL);
}

/* 1 where c's bucket runs GQA's attn_prologue inside the attention kernel:
 * one token, unless MOEC_ATTN_FUSE_PROLOGUE=0. */
static int pro_fused_here(const cg_ctx *c)
{
    const char *fv = getenv("MOEC_ATTN_FUSE_PROLOGUE");
    return c->T == 1 && !(fv && !strcmp(fv, "0"));
}

/* Qwen3-30B-A3B's attn_prologue feeding its attention: by default the
 * one-token bucket has no prologue kernel and an attention kernel that
 * reads the qkv row and the norms in place of q (named for the prologue:
 * row 5120, 128 rotated, neox, norms), launched plainly (its step's
 * plain); the bucket of 8, and every bucket under
 * MOEC_ATTN_FUSE_PROLOGUE=0, keep both kernels, as programmatic
 * dependents. */
static void check_qwen3_pro(const ir_module *m, const cg_ctx *c)
{
    int fuse = pro_fused_here(c);
    int p = steps_of(m, c, IR_OP_ATTN_PROLOGUE), a = steps_of(m, c, IR_OP_ATTENTION);
    T_CHECK(fuse ? p < 0 : p >= 0);
    T_CHECK(a >= 0);
    if (a < 0)
        return;
    const ir_step *s = &c->steps[a];
    const char *n = c->kernel_names[s->kernel];
    T_CHECK((strstr(n, "_pro_n5120_r128_neox_norm_bf16_bf16_") != NULL) == fuse);
    T_CHECK(s->plain == fuse);
    if (p >= 0)
        T_CHECK(c->steps[p].plain == 0);
    if (fuse) {
        const ir_op *pro = cg_attn_prologue_fused(c, m->ops[s->op_id]);
        T_CHECK(pro != NULL);
        if (!pro)
            return;
        T_CHECK(s->args[0].kind == IR_ARG_ACT && s->args[0].index == pro->in[0]->id);
        T_CHECK(s->args[3].kind == IR_ARG_F32 && s->args[3].f > 0.99e-6 && s->args[3].f < 1.01e-6);
        T_CHECK(s->args[4].kind == IR_ARG_INPUT && s->args[4].index == IR_INPUT_POSITIONS);
    } else {
        T_CHECK(s->args[1].kind == IR_ARG_INPUT && s->args[1].index == IR_INPUT_POSITIONS);
    }
}

static void test_real_shapes(void)
{
    cg_options o;
    cg_options_default(&o);
    km_spec v2 = {.name = "k_v2lite", .vocab = 8, .attn = KM_MLA, .H = 16, .R = 512, .DR = 64,
                  .attn_scale = 0.1352, .E = 64, .K = 6, .NG = 1, .TG = 1, .scaling = 1.0,
                  .moe = KM_ROUTED, .HID = 2048, .I = 1408, .wdt = "bf16", .moe_scale = 1.0,
                  .router = 1};
    km_spec v3 = {.name = "k_v3", .vocab = 8, .attn = KM_MLA, .H = 128, .R = 512, .DR = 64,
                  .attn_scale = 0.1352, .E = 256, .K = 8, .sigmoid = 1, .NG = 8, .TG = 4,
                  .top2 = 1, .norm = 1, .bias = 1, .scaling = 2.5, .moe = KM_ROUTED, .HID = 7168,
                  .I = 2048, .wdt = "bf16", .moe_scale = 1.0};
    km_spec q3 = {.name = "k_qwen3", .vocab = 8, .attn = KM_GQA, .H = 32, .HKV = 4, .DK = 128,
                  .DV = 128, .attn_scale = 0.08838834764831845, .E = 128, .K = 8, .NG = 1, .TG = 1,
                  .norm = 1, .scaling = 1.0, .moe = KM_ROUTED_SPLIT, .HID = 2048, .I = 768,
                  .wdt = "bf16", .moe_scale = 1.0};
    km_spec v32 = {.name = "k_v32", .vocab = 8, .attn = KM_MLA, .H = 128, .R = 512, .DR = 64,
                   .attn_scale = 0.1352, .TOPK = 2048, .HI = 64, .DI = 128, .dsa_scale = 0.0883883,
                   .dsa_wscale = 0.125};
    const km_spec *specs[] = {&v2, &v3, &q3, &v32};
    void (*checks[])(const ir_module *, const cg_ctx *) = {check_v2lite, check_v3, check_qwen3,
                                                           check_v32};
    /* compiled at T = 8, 64, 1: expert blocks of 2, 4 and 1 rows (Qwen3 at 8
       too: its attention's merge in the kernel); V3.2 at 1 and 64 */
    const unsigned compile[] = {2, 4, 1 | 2, 1 | 4};
    for (int i = 0; i < 4; i++) {
        ir_module *m = km_module(specs[i]);
        T_CHECK(m != NULL);
        if (m)
            run_module(m, &o, checks[i], compile[i]);
        /* Qwen3 with 2, 4 and 8 lanes a position (MOEC_ATTN_LPP) and the
           kernel's choice at run time (0) at T = 1 and 8: compiled by NVRTC */
        if (m && i == 2)
            for (int lpp = 0; lpp <= 8; lpp = lpp ? lpp * 2 : 2) {
                char v[4];
                snprintf(v, sizeof v, "%d", lpp);
                setenv("MOEC_ATTN_LPP", v, 1);
                run_module(m, &o, checks[i], 1 | 2);
                unsetenv("MOEC_ATTN_LPP");
            }
        /* Qwen3's attention in the lanes' form (MOEC_ATTN_TC=0), compiled
           by NVRTC at T = 1 and 8 */
        if (m && i == 2) {
            setenv("MOEC_ATTN_TC", "0", 1);
            run_module(m, &o, checks[i], 1 | 2);
            unsetenv("MOEC_ATTN_TC");
        }
        /* Qwen3's splits merged by the last block from those that may hold
           positions (MOEC_ATTN_MERGE=3, names _ml): compiled at T = 1, 8 */
        if (m && i == 2) {
            setenv("MOEC_ATTN_MERGE", "3", 1);
            run_module(m, &o, check_merge_live, 1 | 2);
            unsetenv("MOEC_ATTN_MERGE");
        }
        /* V2-Lite with the splits merged by their own kernel at T = 64, by
           the attention kernel at T = 8 */
        if (m && i == 0) {
            setenv("MOEC_ATTN_MERGE", "0", 1);
            run_module(m, &o, checks[i], 4);
            setenv("MOEC_ATTN_MERGE", "2", 1);
            run_module(m, &o, checks[i], 2);
            unsetenv("MOEC_ATTN_MERGE");
        }
        ir_module_free(m);
    }
    /* Qwen3's prologue and attention (MOEC_ATTN_FUSE_PROLOGUE=0), then the
       two as one kernel at T = 1 (the default): compiled by NVRTC at T = 1
       and 8 */
    km_spec q3p = {.name = "k_qwen3_pro", .vocab = 8, .attn = KM_GQA_PRO, .H = 32, .HKV = 4,
                   .DK = 128, .DV = 128, .qk_norm = 1, .attn_scale = 0.08838834764831845};
    ir_module *mp = km_module(&q3p);
    T_CHECK(mp != NULL);
    if (mp) {
        setenv("MOEC_ATTN_FUSE_PROLOGUE", "0", 1);
        run_module(mp, &o, check_qwen3_pro, 0);
        unsetenv("MOEC_ATTN_FUSE_PROLOGUE");
        run_module(mp, &o, check_qwen3_pro, 1 | 2);
        ir_module_free(mp);
    }
    /* V3.2's other forms: legacy (compiled at T = 64), the select with no
       scores in shared memory (compiled at T = 1), and for sm_86 */
    ir_module *m = km_module(&v32);
    T_CHECK(m != NULL);
    if (!m)
        return;
    setenv("MOEC_DSA_KERNEL", "legacy", 1);
    run_module(m, &o, check_v32_legacy, 4);
    unsetenv("MOEC_DSA_KERNEL");
    setenv("MOEC_DSA_SELECT_CAP", "0", 1);
    run_module(m, &o, check_v32_cap0, 1);
    unsetenv("MOEC_DSA_SELECT_CAP");
    snprintf(o.arch, sizeof o.arch, "sm_86");
    run_module(m, &o, check_v32_sm86, 0);
    ir_module_free(m);
}

/* ---- the fused indexer (pass fuse_dsa_indexer) ---------------------------- */

/* dsa_prologue_k: one kernel, a warp a token, writing dsa_topk's key cache
 * (pool 0 of the dsa_topk), which then starts with its score kernel; the
 * score kernel reads q and the head weights from their rows and rotates q
 * (its name says the rows and the rope). */
static void check_dsa_fused(const ir_module *m, const cg_ctx *c)
{
    int T = c->T, pk = steps_of(m, c, IR_OP_DSA_PROLOGUE_K), d = steps_of(m, c, IR_OP_DSA_TOPK);
    const ir_op *dsa = ir_module_find_value(m, "sel")->def;
    const ir_op *pro = ir_module_find_value(m, "ik")->def;
    T_CHECK(pk >= 0 && d == pk + 1 && cg_dsa_prologue_cache(m, pro) == dsa);
    if (pk < 0 || d != pk + 1)
        return;
    const ir_step *p = &c->steps[pk], *sc = &c->steps[d], *se = &c->steps[d + 1];
    T_CHECK(!strncmp(c->kernel_names[p->kernel], "dsa_prologue_k_d", 16) &&
            strstr(c->kernel_names[p->kernel], "_bs64_") != NULL);
    T_CHECK(p->grid[0] == (unsigned)((T + 3) / 4) && p->block[0] == 128 && p->n_args == 11 &&
            p->args[9].kind == IR_ARG_KV && p->args[9].index == dsa->id && p->args[9].i == 0);
    T_CHECK(!strncmp(c->kernel_names[sc->kernel], "dsa_score", 9) &&
            strstr(c->kernel_names[sc->kernel], "_q") != NULL &&
            (strstr(c->kernel_names[sc->kernel], "_neox64_") != NULL ||
             strstr(c->kernel_names[sc->kernel], "_il6_") != NULL));
    T_CHECK(sc->args[0].kind == IR_ARG_ACT && sc->args[0].index == dsa->in[0]->id &&
            sc->args[1].kind == IR_ARG_ACT && sc->args[1].index == dsa->in[2]->id);
    T_CHECK(!strncmp(c->kernel_names[se->kernel], "dsa_select", 10));
}

static void test_dsa_fused(void)
{
    cg_options o;
    cg_options_default(&o);
    o.kv_block_size = 64;
    /* V3.2's shape: the key after q_a, kv and k_pe's 2112 columns, q after q_b's 24576 */
    km_spec v32 = {.name = "k_v32_fused", .vocab = 8, .attn = KM_MLA, .H = 128, .R = 512,
                   .DR = 64, .attn_scale = 0.1352, .TOPK = 2048, .HI = 64, .DI = 128,
                   .dsa_scale = 0.0883883, .dsa_wscale = 0.125, .IRD = 64, .IPRE = 2112,
                   .IQPRE = 24576};
    /* odd sizes: rows not 16-byte aligned (CUDA-core scores, scalar loads),
       interleaved pairs, linear scaling and an attn_factor */
    km_spec odd = {.name = "k_odd_fused", .vocab = 8, .attn = KM_MLA, .H = 3, .R = 36, .DR = 6,
                   .attn_scale = 0.3, .TOPK = 5, .HI = 3, .DI = 12, .dsa_scale = 0.5,
                   .dsa_wscale = -0.7, .IRD = 6, .IPRE = 5, .IQPRE = 3,
                   .irope = "style = \"interleave\", theta = 500.0, scaling = \"linear\", "
                            "factor = 2.0, attn_factor = 1.25"};
    ir_module *m = km_module(&v32), *mo = km_module(&odd);
    T_CHECK(m && mo);
    /* compiled (one bucket each, NVRTC being slow): the fast form at T = 1,
       legacy tensor cores at 8; the odd sizes' CUDA-core forms in bf16 and
       f32 at 8; the steps of every bucket checked */
    if (m) {
        run_module(m, &o, check_dsa_fused, 1);
        setenv("MOEC_DSA_KERNEL", "legacy", 1);
        run_module(m, &o, check_dsa_fused, 2);
        unsetenv("MOEC_DSA_KERNEL");
        o.compute_dtype = IR_DTYPE_F32;
        run_module(m, &o, check_dsa_fused, 0);
        o.compute_dtype = IR_DTYPE_BF16;
    }
    if (mo)
        for (int f32 = 0; f32 < 2; f32++) {
            o.compute_dtype = f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16;
            run_module(mo, &o, check_dsa_fused, 2);
        }
    ir_module_free(m);
    ir_module_free(mo);
}

/* ---- the MLA prologue ------------------------------------------------------ */

/* The prologue ops: one kernel each, a block of 128 per (token, role): the
 * q head groups, the latent, the kv side; the kv side's op writes the cache
 * rows of the attention (its pools, the step inputs), which writes none.
 * Programmatic dependents (their input no linear over fp8 weights:
 * test_codegen's config parts check those). */
static void check_prologue(const ir_module *m, const cg_ctx *c)
{
    int T = c->T, a = steps_of(m, c, IR_OP_MLA_ATTENTION);
    const ir_op *att = ir_module_find_value(m, "o")->def;
    const ir_op *kv = ir_module_find_value(m, "kv_c")->def;
    const ir_op *q = ir_module_find_value(m, "q_pe")->def;
    T_CHECK(a >= 0 && cg_mla_prologue_cache(m, kv) == att &&
            cg_mla_prologue_cache(m, q) == (q == kv ? att : NULL));
    if (a < 0)
        return;
    /* the attention starts with its attention kernel: no cache write */
    T_CHECK(!strncmp(c->kernel_names[c->steps[a].kernel], "mla_attn", 8));
    int H = (int)ir_op_attr_int(q, "heads", 0), dn = (int)ir_op_attr_int(q, "qk_nope_head_dim", 0);
    int dr = (int)ir_op_attr_int(q, "qk_rope_head_dim", 0);
    int hg = 1024 / (dn + dr) < 1 ? 1 : 1024 / (dn + dr) > H ? H : 1024 / (dn + dr);
    int nqg = (H + hg - 1) / hg;
    for (int i = 0; i < c->n_steps; i++) {
        const ir_step *s = &c->steps[i];
        const ir_op *op = m->ops[s->op_id];
        if (op != kv && op != q)
            continue;
        const char *kn = c->kernel_names[s->kernel];
        int is_kv = op->kind == IR_OP_MLA_PROLOGUE_KV, is_q = op->kind == IR_OP_MLA_PROLOGUE_Q;
        const char *want = is_kv ? "mla_prologue_kv_h0_" : is_q ? "mla_prologue_q_h" : "mla_prologue_h";
        T_CHECK(!strncmp(kn, want, strlen(want)));
        int roles = is_kv ? 2 : is_q ? nqg : nqg + 1;
        T_CHECK(s->grid[0] == (unsigned)T && s->grid[1] == (unsigned)roles && s->block[0] == 128);
        T_CHECK(!s->plain);
        T_CHECK(s->args[0].kind == IR_ARG_ACT && s->args[0].index == op->in[0]->id &&
                s->args[1].kind == IR_ARG_INPUT && s->args[1].index == IR_INPUT_POSITIONS);
        if (op->kind == IR_OP_MLA_PROLOGUE_Q) {
            T_CHECK(s->n_args == 4 && strstr(kn, "_c") == NULL);
            continue;
        }
        /* ..., kv_c, k_pe, positions, slots, block_table, max_blocks, pool 0, pool 1, eps */
        int n = s->n_args;
        T_CHECK(n == 14 && strstr(kn, "_c64_") != NULL);
        const ir_arg *g = s->args + n - 8;
        T_CHECK(g[0].kind == IR_ARG_ACT && g[0].index == op->out[op->n_out - 1]->id);
        T_CHECK(g[1].kind == IR_ARG_INPUT && g[1].index == IR_INPUT_POSITIONS &&
                g[2].kind == IR_ARG_INPUT && g[2].index == IR_INPUT_SLOTS &&
                g[3].kind == IR_ARG_INPUT && g[3].index == IR_INPUT_BLOCK_TABLE &&
                g[4].kind == IR_ARG_CONFIG && g[4].index == IR_CONFIG_MAX_BLOCKS);
        T_CHECK(g[5].kind == IR_ARG_KV && g[5].index == att->id && g[5].i == 0 &&
                g[6].kind == IR_ARG_KV && g[6].index == att->id && g[6].i == 1);
        T_CHECK(s->args[n - 1].kind == IR_ARG_F32 && s->args[n - 1].f == 1e-6);
    }
}

static void test_prologue(void)
{
    cg_options o;
    cg_options_default(&o);
    /* DeepSeek-V2-Lite: no q LoRA, 16 heads of 128 + 64, kv_lora 512 */
    km_spec v2 = {.name = "k_pro_v2lite", .vocab = 8, .attn = KM_MLA_PRO, .H = 16, .DN = 128,
                  .DR = 64, .R = 512, .attn_scale = 0.1352};
    /* DeepSeek-V3: q_lora 1536, 128 heads; inputs wider than the sections (V3.2's indexer) */
    km_spec v3 = {.name = "k_pro_v3", .vocab = 8, .attn = KM_MLA_PRO, .H = 128, .DN = 128,
                  .DR = 64, .R = 512, .QR = 1536, .XN = 192, .attn_scale = 0.1352};
    /* odd sizes (scalar loads), neox, linear scaling, attn_factor */
    km_spec odd = {.name = "k_pro_odd", .vocab = 8, .attn = KM_MLA_PRO, .H = 3, .DN = 5, .DR = 6,
                   .R = 36, .XN = 3, .attn_scale = 0.3,
                   .rope = "style = \"neox\", theta = 500.0, scaling = \"linear\", factor = 2.0, "
                           "attn_factor = 1.25"};
    km_spec oddq = odd;
    oddq.name = "k_pro_odd_q";
    oddq.QR = 7;
    const km_spec *specs[] = {&v2, &v3, &odd, &oddq};
    for (int i = 0; i < 4; i++)
        for (int f32 = 0; f32 < 2; f32++) {
            o.compute_dtype = f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16;
            o.kv_block_size = 64;
            ir_module *m = km_module(specs[i]);
            T_CHECK(m != NULL);
            /* every form in bf16 at T = 1; the real shapes in f32 at T = 64 */
            if (m)
                run_module(m, &o, check_prologue, f32 ? (i < 2 ? 4u : 0u) : 1u);
            ir_module_free(m);
        }
}

/* ---- GQA's prologue -------------------------------------------------------- */

/* attn_prologue: one kernel, a warp a head, a block of 4 (grid T by the
 * heads' blocks), writing the attention's k and v pools; the attention
 * then starts with its attention kernel. In a bucket of one token, by
 * default, no prologue kernel: the attention's kernel, launched plainly,
 * runs it (`_pro_` in its name). */
static void check_gqa_prologue(const ir_module *m, const cg_ctx *c)
{
    int T = c->T, p = steps_of(m, c, IR_OP_ATTN_PROLOGUE), a = steps_of(m, c, IR_OP_ATTENTION);
    const ir_op *att = ir_module_find_value(m, "o")->def;
    const ir_op *pro = ir_module_find_value(m, "k")->def;
    if (pro_fused_here(c)) {
        T_CHECK(cg_attn_prologue_fused(c, att) == pro && p < 0 && a >= 0);
        if (a >= 0)
            T_CHECK(c->steps[a].plain &&
                    strstr(c->kernel_names[c->steps[a].kernel], "_pro_n") != NULL);
        return;
    }
    T_CHECK(p >= 0 && a == p + 1 && cg_attn_prologue_cache(m, pro) == att);
    if (p < 0 || a != p + 1)
        return;
    const ir_step *s = &c->steps[p];
    const char *kn = c->kernel_names[s->kernel];
    int H = (int)ir_op_attr_int(pro, "heads", 0), HKV = (int)ir_op_attr_int(pro, "kv_heads", 0);
    int norm = pro->n_in == 4;
    T_CHECK(!strncmp(kn, "attn_prologue_h", 15) && strstr(kn, "_c64_") != NULL &&
            (strstr(kn, "_norm_") != NULL) == norm);
    T_CHECK(s->grid[0] == (unsigned)T && s->grid[1] == (unsigned)((H + 2 * HKV + 3) / 4) &&
            s->block[0] == 128);
    /* x, pos, [q_norm, k_norm], q, k, v, positions, slots, block_table,
       max_blocks, pool 0, pool 1, [eps] */
    int n = s->n_args, o = norm ? 4 : 2;
    T_CHECK(n == (norm ? 14 : 11));
    T_CHECK(s->args[0].kind == IR_ARG_ACT && s->args[0].index == pro->in[0]->id &&
            s->args[1].kind == IR_ARG_INPUT && s->args[1].index == IR_INPUT_POSITIONS);
    for (int i = 0; i < 3; i++)
        T_CHECK(s->args[o + i].kind == IR_ARG_ACT && s->args[o + i].index == pro->out[i]->id);
    const ir_arg *g = s->args + o + 3;
    T_CHECK(g[0].kind == IR_ARG_INPUT && g[0].index == IR_INPUT_POSITIONS &&
            g[1].kind == IR_ARG_INPUT && g[1].index == IR_INPUT_SLOTS &&
            g[2].kind == IR_ARG_INPUT && g[2].index == IR_INPUT_BLOCK_TABLE &&
            g[3].kind == IR_ARG_CONFIG && g[3].index == IR_CONFIG_MAX_BLOCKS);
    T_CHECK(g[4].kind == IR_ARG_KV && g[4].index == att->id && g[4].i == 0 &&
            g[5].kind == IR_ARG_KV && g[5].index == att->id && g[5].i == 1);
    if (norm)
        T_CHECK(s->args[n - 1].kind == IR_ARG_F32 && s->args[n - 1].f == 1e-6);
    T_CHECK(!strncmp(c->kernel_names[c->steps[a].kernel], "attn_h", 6));
}

static void test_gqa_prologue(void)
{
    cg_options o;
    cg_options_default(&o);
    o.kv_block_size = 64;
    /* Qwen3-30B-A3B: 32 q heads, 4 kv heads of 128, q/k norms */
    km_spec q3 = {.name = "k_gpro_qwen3", .vocab = 8, .attn = KM_GQA_PRO, .H = 32, .HKV = 4,
                  .DK = 128, .DV = 128, .qk_norm = 1, .attn_scale = 0.08838834764831845};
    /* Qwen2-MoE's form (no norms) at odd sizes: rows not 16-byte aligned,
       wider than the sections; interleaved, YaRN, a partial rotary_dim, a
       window */
    km_spec odd = {.name = "k_gpro_odd", .vocab = 8, .attn = KM_GQA_PRO, .H = 6, .HKV = 2,
                   .DK = 10, .DV = 10, .XN = 3, .window = 5, .attn_scale = 0.3,
                   .rope = "style = \"interleave\", theta = 500.0, scaling = \"yarn\", factor = "
                           "4.0, yarn_low = 1.0, yarn_high = 3.0, attn_factor = 1.25, rotary_dim = 6"};
    km_spec oddn = odd;
    oddn.name = "k_gpro_odd_norm";
    oddn.qk_norm = 1;
    const km_spec *specs[] = {&q3, &odd, &oddn};
    /* the prologue kernel (MOEC_ATTN_FUSE_PROLOGUE=0), then the default */
    for (int fuse = 0; fuse < 2; fuse++) {
        if (!fuse)
            setenv("MOEC_ATTN_FUSE_PROLOGUE", "0", 1);
        for (int i = 0; i < 3; i++)
            for (int f32 = 0; f32 < 2; f32++) {
                o.compute_dtype = f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16;
                ir_module *m = km_module(specs[i]);
                T_CHECK(m != NULL);
                /* every form in bf16 at T = 1; the real shape in f32 at T = 64
                   (the fused odd forms at T = 1 in bf16; Qwen3's in
                   test_real_shapes) */
                unsigned mask = f32 ? (i == 0 ? 4u : 0u) : 1u;
                if (m)
                    run_module(m, &o, check_gqa_prologue, fuse && (f32 || i == 0) ? 0u : mask);
                ir_module_free(m);
            }
        unsetenv("MOEC_ATTN_FUSE_PROLOGUE");
    }
}

/* ---- odd shapes, other dtypes --------------------------------------------- */

static void check_odd(const ir_module *m, const cg_ctx *c)
{
    /* the unroll knobs name the GQA kernel */
    if (getenv("MOEC_ATTN_KUNROLL"))
        for (int i = 0; i < c->n_steps; i++)
            if (!strncmp(c->kernel_names[c->steps[i].kernel], "attn_h", 6))
                T_CHECK(strstr(c->kernel_names[c->steps[i].kernel], "_ku1_vu3_") != NULL);
    int a = steps_of(m, c, IR_OP_ATTENTION);
    if (a >= 0 && !strcmp(m->name, "k_mha")) {
        /* 8 kv heads: 512 blocks at T = 64 need no split, and no merge */
        int split = c->T < 64;
        T_CHECK(c->steps[a + 1].grid[2] == (split ? (unsigned)splits(c->T * 8, gqa_tc(c, 64, 64)) : 1));
        T_CHECK(c->steps[a + 1].n_args == (split ? 13 : 10));
        /* the split kernel merges its splits: the counters last, no merge kernel */
        if (split)
            T_CHECK(c->steps[a + 1].args[12].kind == IR_ARG_INPUT &&
                    c->steps[a + 1].args[12].index == IR_INPUT_SPLIT_COUNTERS &&
                    (a + 2 >= c->n_steps || c->steps[a + 2].op_id != c->steps[a + 1].op_id));
    }
    int e = steps_of(m, c, IR_OP_MOE_EXPERTS);
    if (e < 0)
        return;
    /* no router weights: the down GEMM writes the [T, K, H] result itself */
    const ir_step *dn = &c->steps[e + 2];
    T_CHECK(dn->n_args == 6 && dn->args[5].kind == IR_ARG_ACT &&
            dn->args[5].index == ir_module_find_value(m, "y")->id);
    T_CHECK(strstr(c->kernel_names[dn->kernel], "_now") != NULL);
}

static void test_odd_shapes(void)
{
    cg_options o;
    cg_options_default(&o);
    o.kv_block_size = 16;
    /* head dims and hidden sizes that are not multiples of 8 or 32, a window */
    km_spec g = {.name = "k_odd_gqa", .vocab = 8, .attn = KM_GQA, .H = 6, .HKV = 2, .DK = 24,
                 .DV = 40, .window = 5, .attn_scale = 0.2, .E = 6, .K = 3, .NG = 3, .TG = 2,
                 .norm = 1, .scaling = 1.5, .moe = KM_EXPERTS, .HID = 20, .I = 12, .wdt = "f16",
                 .moe_scale = 1.0};
    km_spec l = {.name = "k_odd_mla", .vocab = 8, .attn = KM_MLA, .H = 3, .R = 36, .DR = 6,
                 .window = 3, .attn_scale = 0.3, .E = 5, .K = 2, .sigmoid = 1, .NG = 1, .TG = 1,
                 .bias = 1, .scaling = 1.0, .moe = KM_EXPERTS_SPLIT, .HID = 9, .I = 7, .wdt = "f32",
                 .moe_scale = 1.0};
    km_spec r = {.name = "k_odd_routed", .vocab = 8, .attn = KM_GQA, .H = 1, .HKV = 1, .DK = 3,
                 .DV = 5, .attn_scale = 0.5, .E = 3, .K = 3, .NG = 1, .TG = 1, .scaling = 1.0,
                 .moe = KM_ROUTED_SPLIT, .HID = 3, .I = 5, .wdt = "bf16", .moe_scale = 0.25};
    /* one kv head per query head: enough blocks at T = 64 not to split */
    km_spec mha = {.name = "k_mha", .vocab = 8, .attn = KM_GQA, .H = 8, .HKV = 8, .DK = 64,
                   .DV = 64, .attn_scale = 0.125};
    /* a DSA indexer of 3 heads of 12 channels choosing 5 positions */
    km_spec dsa = {.name = "k_odd_dsa", .vocab = 8, .attn = KM_MLA, .H = 3, .R = 36, .DR = 6,
                   .attn_scale = 0.3, .TOPK = 5, .HI = 3, .DI = 12, .dsa_scale = 0.5,
                   .dsa_wscale = -0.7};
    const km_spec *specs[] = {&g, &l, &r, &mha, &dsa};
    /* the GQA shapes with 4 lanes a position: key chunks left to some
       lanes; the key chunks' loop not unrolled, the value rows' by 3 */
    setenv("MOEC_ATTN_LPP", "4", 1);
    setenv("MOEC_ATTN_KUNROLL", "1", 1);
    setenv("MOEC_ATTN_VUNROLL", "3", 1);
    for (int i = 0; i < 3; i += 2) {
        o.compute_dtype = IR_DTYPE_BF16;
        ir_module *m = km_module(specs[i]);
        T_CHECK(m != NULL);
        if (m)
            run_module(m, &o, check_odd, 1);
        ir_module_free(m);
    }
    unsetenv("MOEC_ATTN_LPP");
    unsetenv("MOEC_ATTN_KUNROLL");
    unsetenv("MOEC_ATTN_VUNROLL");
    for (int i = 0; i < 5; i++)
        for (int f32 = 0; f32 < 2; f32++) {
            o.compute_dtype = f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16;
            ir_module *m = km_module(specs[i]);
            T_CHECK(m != NULL);
            if (m)
                run_module(m, &o, check_odd,
                           i == 4 ? 1 | 8 : i == 3 ? (f32 ? 0 : 4) : i < 2 && (i + f32) % 2 ? 2 : 0);
            ir_module_free(m);
        }
}

/* ---- the streaming expert form ---------------------------------------------- */

/* The forms test_gv_forms expects at T = 1: the name tags of the gate_up
 * and down kernels ("gv_w4_r2_u1": the streaming form with 4 warps of 2
 * rows and 1 chunk in flight; "rw4": the first CUDA-core form). */
static const char *gv_want_gu, *gv_want_dn;

/* Every streaming GEMM's launch against its name (warps of 32 threads, a
 * block's w * r rows over ND), and at T = 1 the forms wanted. */
static void check_gv(const ir_module *m, const cg_ctx *c)
{
    const ir_value *dw = ir_module_find_value(m, "down");
    T_CHECK(dw != NULL);
    if (!dw)
        return;
    long long H = dw->type.dims[1], I = dw->type.dims[2];
    int seen = 0;
    for (int i = 0; i < c->n_steps; i++) {
        const ir_step *s = &c->steps[i];
        const char *kn = c->kernel_names[s->kernel];
        int gu = !strncmp(kn, "moe_gate_up_", 12), dn = !strncmp(kn, "moe_down_", 9);
        if (!gu && !dn)
            continue;
        long long nd = gu ? I : H;
        const char *f = strstr(kn, "_gv_w");
        int w = 0, r = 0, u = 0;
        if (f) {
            T_CHECK(sscanf(f, "_gv_w%d_r%d_u%d_", &w, &r, &u) == 3);
            T_CHECK(w > 0 && r > 0 && u > 0 && s->block[0] == (unsigned)w * 32 &&
                    s->grid[1] == (unsigned)((nd + w * r - 1) / (w * r)));
        }
        if (c->T == 1) {
            char tag[48];
            snprintf(tag, sizeof tag, "_%s_t1_", gu ? gv_want_gu : gv_want_dn);
            if (!strstr(kn, tag))
                fprintf(stderr, "%s: wants %s\n", kn, tag);
            T_CHECK(strstr(kn, tag) != NULL);
            seen++;
        }
    }
    T_CHECK(c->T != 1 || seen == 2);
}

/* The streaming form (codegen/moe_routed.c, GV_CONSTS) at blocks of one or
 * two slots: where rows come in whole 16-byte vectors (H 200 in bf16, I 37
 * not: down on the first form; fp8 H 208 and I 176 with partial 128 x 128
 * blocks; f16 and f32 weights; the experts op's down writing the result),
 * the shape knobs (8 warps of 3 rows: V2-Lite's 1408 rows not a whole
 * number of blocks; 4 chunks in flight, down's 6 evened out to 3 a round)
 * MOEC_MOE_GEMV=0 (the first form) and MOEC_MOE_GEMV_CVT=0 (fp8 codes
 * widened by integer operations, not the conversion unit); each compiled
 * at T = 1. */
static void test_gv_forms(void)
{
    km_spec odd = {.name = "k_gv_odd", .vocab = 8, .E = 6, .K = 3, .NG = 1, .TG = 1, .norm = 1,
                   .scaling = 1.0, .moe = KM_ROUTED, .HID = 200, .I = 37, .wdt = "bf16",
                   .moe_scale = 0.5};
    km_spec f8 = {.name = "k_gv_f8_odd", .vocab = 8, .E = 7, .K = 4, .NG = 1, .TG = 1,
                  .norm = 1, .scaling = 1.0, .moe = KM_ROUTED_SPLIT, .HID = 208, .I = 176,
                  .wdt = "f8e4m3", .moe_scale = 0.75};
    km_spec ex = {.name = "k_gv_f16_experts", .vocab = 8, .E = 4, .K = 2, .NG = 1, .TG = 1,
                  .norm = 1, .scaling = 1.0, .moe = KM_EXPERTS, .HID = 64, .I = 32,
                  .wdt = "f16", .moe_scale = 1.0};
    km_spec v2 = {.name = "k_gv_v2lite", .vocab = 8, .E = 64, .K = 6, .NG = 1, .TG = 1,
                  .scaling = 1.0, .moe = KM_ROUTED, .HID = 2048, .I = 1408, .wdt = "bf16",
                  .moe_scale = 1.0};
    struct {
        const km_spec *s;
        int f32;
        const char *env[3], *gu, *dn;
    } cases[] = {
        {&odd, 0, {NULL}, "gv_w4_r2_u1", "rw8"},
        {&odd, 1, {NULL}, "gv_w4_r2_u2", "rw8"},
        {&f8, 0, {NULL}, "gv_w4_r2_u1_cvt", "gv_w4_r4_u1_cvt"},
        {&f8, 1, {NULL}, "gv_w4_r2_u1_cvt", "gv_w4_r4_u1_cvt"},
        {&ex, 0, {NULL}, "gv_w4_r2_u1", "gv_w4_r8_u1"},
        {&ex, 1, {NULL}, "gv_w4_r2_u1", "gv_w4_r8_u1"},
        {&v2, 0, {"MOEC_MOE_GEMV_WARPS=8", "MOEC_MOE_GEMV_RW=3", "MOEC_MOE_GEMV_U=4"},
         "gv_w8_r3_u4", "gv_w8_r8_u3"},
        {&v2, 0, {"MOEC_MOE_GEMV=0"}, "rw4", "rw8"},
        /* fp8 codes widened by integer operations instead of the
           conversion unit (sm_90's default) */
        {&f8, 0, {"MOEC_MOE_GEMV_CVT=0"}, "gv_w4_r2_u1", "gv_w4_r4_u1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char kv[3][64];
        for (int k = 0; k < 3 && cases[i].env[k]; k++) {
            snprintf(kv[k], sizeof kv[k], "%s", cases[i].env[k]);
            char *eq = strchr(kv[k], '=');
            *eq = '\0';
            setenv(kv[k], eq + 1, 1);
        }
        cg_options o;
        cg_options_default(&o);
        o.compute_dtype = cases[i].f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16;
        gv_want_gu = cases[i].gu;
        gv_want_dn = cases[i].dn;
        ir_module *m = km_module(cases[i].s);
        T_CHECK(m != NULL);
        if (m)
            run_module(m, &o, check_gv, 1);
        ir_module_free(m);
        for (int k = 0; k < 3 && cases[i].env[k]; k++)
            unsetenv(kv[k]);
    }
}

/* ---- fp8 weights ------------------------------------------------------------ */

/* Whether a is weight `name` of m at byte offset at (0: its codes; its
 * scale offset: its scales). */
static int weight_arg(const ir_module *m, ir_arg a, const char *name, int scales)
{
    const ir_value *v = ir_module_find_value(m, name);
    return v && a.kind == IR_ARG_WEIGHT && a.index == v->id &&
           a.i == (scales ? (int64_t)ir_weight_scale_offset(v) : 0) &&
           (!scales || a.i >= ir_type_numel(&v->type, 0));
}

/* the fp8 staged linear's launches checked at 8 warps (check_fp8) */
static int fp8_tc_w8;

/* The staged linear's shape at nw warps a block: its K splits, tiles a
 * warp, slabs and shared memory (see check_tc_linear). */
typedef struct tc_want {
    int s, rt;
    long long slabs;
    size_t smem;
} tc_want;

static tc_want tc_want_shape(long long N, long long K, int tg, int groups, int w8, int nw)
{
    tc_want w = {1, 0, 0, 0};
    long long ch = K / 64;
    w.rt = tg >= 32 && (w8 || (N + 32LL * nw - 1) / (32LL * nw) * 8 >= 264) ? 2 : 1;
    w.slabs = (N + 16LL * w.rt * nw - 1) / (16LL * w.rt * nw);
    while (w.s < 8 && w.slabs * groups * w.s < 264)
        w.s++;
    /* groups of 32 tokens and more (two blocks an SM): at most 85% of 264
       blocks in clusters of more than 2, so that every cluster fits at
       once, unless that leaves fewer than 198 blocks */
    int f = w.s;
    while (tg >= 32 && f > 2 && w.slabs * groups * f > 264 * 85 / 100)
        f--;
    if (w.slabs * groups * f >= 198)
        w.s = f;
    if (w.s > ch)
        w.s = (int)ch;
    /* more splits while a split's x passes the 227 KB of shared memory */
    while (w.s < 8 && w.s < ch &&
           (size_t)tg * (size_t)((ch + w.s - 1) / w.s * 64 + 8) * 2 > 227 * 1024)
        w.s++;
    size_t x = (size_t)tg * (size_t)((ch + w.s - 1) / w.s * 64 + 8) * 2;
    size_t part = w.s > 1 ? (size_t)nw * w.rt * (tg / 8) * 512 : 0;
    w.smem = x > part ? x : part;
    return w;
}

/* The staged linear's launch (codegen/fp8_tc.c) against its name: fp8
 * (w8, linear_f8tc_) or bf16 (linear_tc_) weights, 8 to 64 tokens a group
 * (64, or T rounded up to 8), two 16-row tiles a warp from 32 tokens
 * (bf16: where slabs of 128 rows over 8 splits make 264 blocks), 4 warps
 * (fp8 groups of 64 tokens on the main stream: 8 where that makes 112 to
 * 132 blocks, or where 4 warps' blocks hold over half an SM's shared memory
 * and make more than 112 and 8 warps' no more), chunks in flight 6 in fp8
 * from groups of 32 tokens, else 4 over the tiles; on sm_90 K split over
 * the fewest blocks (up to 8, at least a 64-wide chunk each) that make 264
 * blocks (fewer where clusters would not all fit at once), a cluster each,
 * x's rows of a split (or the partial sums) in shared memory; past the
 * prefetch's buckets the first weights before the wait (_pre). Counts in
 * *n8 the launches that take 8 warps. */
static void check_tc_linear(const cg_ctx *c, const ir_step *s, long long N, long long K, int w8,
                            int *n8)
{
    const char *kn = c->kernel_names[s->kernel];
    long long n = 0, k = 0;
    int t = 0, tg = 0, nw = 0, rt = 0, S = 0, u = 0, T = c->T, end = 0;
    T_CHECK(sscanf(kn, w8 ? "linear_f8tc_n%lld_k%lld_t%d_tg%d_w%d_rt%d_s%d_u%d%n"
                          : "linear_tc_n%lld_k%lld_t%d_tg%d_w%d_rt%d_s%d_u%d%n",
                   &n, &k, &t, &tg, &nw, &rt, &S, &u, &end) == 8);
    int want_tg = T >= 64 ? 64 : (T + 7) / 8 * 8, groups = (T + want_tg - 1) / want_tg;
    int want_nw = 4;
    tc_want want = tc_want_shape(N, K, want_tg, groups, w8, 4);
    if (w8 && want_tg >= 64 && s->stream == 0) {
        tc_want w8w = tc_want_shape(N, K, want_tg, groups, w8, 8);
        long long b4 = want.slabs * want.s * groups, b8 = w8w.slabs * w8w.s * groups;
        if ((b8 >= 112 && b8 <= 132) || (want.smem > 227 * 1024 / 2 && b4 > 112 && b8 <= 112)) {
            want = w8w;
            want_nw = 8;
            ++*n8;
        }
    }
    /* fp8 groups of 32 tokens and more: 6 chunks in flight, from 64 tokens 4
       refilled by halves (_roll2) */
    T_CHECK(n == N && k == K && t == T && tg == want_tg && nw == want_nw && rt == want.rt &&
            u == (w8 && tg >= 32 ? (T >= 64 ? 4 : 6) : 4 / rt) && S == want.s);
    T_CHECK((strstr(kn + end, "_roll2_") != NULL) == (T >= 64));
    T_CHECK(!strncmp(kn + end, "_pre_", 5) == (T > CG_PREFETCH_MAX_T));
    T_CHECK(s->grid[0] == (unsigned)(want.slabs * S) && s->grid[1] == (unsigned)groups &&
            s->block[0] == 32u * (unsigned)want_nw && s->smem == want.smem);
    char decl[320];
    snprintf(decl, sizeof decl, "void __launch_bounds__(%d) %s(", 32 * want_nw, kn);
    if (S > 1)
        snprintf(decl, sizeof decl, "void __cluster_dims__(%d, 1, 1) __launch_bounds__(%d) %s(",
                 S, 32 * want_nw, kn);
    T_CHECK(strstr(c->src.data, decl) != NULL);
}

/* the tiled weights check_fp8 saw in the tile form and in the staged kernel */
static int fp8_tl_gemv, fp8_tl_tc;

/* The fp8 linear and experts: kernels named for fp8 and their blocks, the
 * weights passed as codes then scales. Linear: the few-rows kernel up to
 * T = 4 (CG_FP8_TC: the staged kernel there too), beyond it the staged
 * kernel where K comes in 64-wide chunks inside the column blocks and
 * 16-row tiles inside the row blocks (CG_FP8_OLD: the first tensor-core
 * kernel where 32-wide chunks fit), else the few-rows kernel per group of 4
 * rows (x and y offset to the group's rows); a weight in fragment tiles
 * (the default's IR_FP8_TILES_LINEAR) takes the few-rows kernel's tile
 * form there, never the first tensor-core kernel. Experts: the staged kernels
 * where the first tensor-core ones ran (CG_FP8_TC: at every T) and H and I
 * are multiples of 64, h then bf16. */
static void check_fp8(const ir_module *m, const cg_ctx *c)
{
    int T = c->T, mode = c->opt->fp8_kernel;
    int l = steps_of(m, c, IR_OP_LINEAR);
    const ir_value *lw = ir_module_find_value(m, "lw");
    if (l >= 0 && lw) {
        const ir_step *s = &c->steps[l];
        long long N = lw->type.dims[0], K = lw->type.dims[1];
        long long bn = lw->scale.block[0], bk = lw->scale.block[1];
        int tc = mode != CG_FP8_OLD && (T > 4 || mode == CG_FP8_TC) && K % 64 == 0 &&
                 bk % 64 == 0 && bn % 16 == 0;
        /* the weight in fragment tiles (the default's IR_FP8_TILES_LINEAR):
           never the first tensor-core kernel, which reads rows */
        int tl = ir_weight_tiled(m, lw, c->opt->fp8_tiles);
        T_CHECK(tl == ((c->opt->fp8_tiles & IR_FP8_TILES_LINEAR) && N % 16 == 0 && K % 64 == 0 &&
                       bn % 16 == 0 && bk % 64 == 0));
        int mma = !tc && !tl && T > 4 && K % 32 == 0 && bk % 32 == 0 && bn % 16 == 0;
        const char *kn = c->kernel_names[s->kernel];
        char tag[32];
        snprintf(tag, sizeof tag, "_f8e4m3_bf16_bf16_s%lldx%lld", bn, bk);
        T_CHECK((strstr(kn, "_tl") != NULL) == tl);
        T_CHECK(strstr(kn, tag) != NULL && s->n_args == 6 && weight_arg(m, s->args[1], "lw", 0) &&
                weight_arg(m, s->args[2], "lw", 1) && s->args[4].kind == IR_ARG_F32);
        if (tc) {
            fp8_tl_tc += tl;
            check_tc_linear(c, s, N, K, 1, &fp8_tc_w8);
        } else if (mma) {
            /* two 16-row tiles a block from T = 32 where 264 blocks remain,
               and the 4 warps' partial sums (rt * nt * 512 bytes each) fit in
               48 KB */
            int nt = (T + 7) / 8, rt = nt >= 4 && N / 32 >= 264 && 4 * 2 * nt * 512 <= 48 * 1024
                                           ? 2
                                           : 1;
            char form[32];
            snprintf(form, sizeof form, "_w4_rt%d_", rt);
            T_CHECK(!strncmp(kn, "linear_mma_", 11) && strstr(kn, form) &&
                    s->grid[0] == (unsigned)((N + 16 * rt - 1) / (16 * rt)) && s->block[0] == 128);
        } else {
            T_CHECK(!strncmp(kn, "linear_gemv_", 12));
            /* the tile form: 8 warps a 16-row tile, S blocks a tile
               (clusters on sm_90), their sums in dynamic shared memory */
            if (tl) {
                fp8_tl_gemv++;
                int sp = 0;
                const char *f = strstr(kn, "_rb16_w8_u2_s");
                T_CHECK(f && sscanf(f, "_rb16_w8_u2_s%d_", &sp) == 1 && sp >= 1 && sp <= 8 &&
                        s->grid[0] == (unsigned)(N / 16 * sp) && s->block[0] == 256 &&
                        s->smem >= (unsigned)(8 * 2 * (T < 4 ? T : 4) * 8 * 4));
            }
            int groups = T <= 4 ? 1 : (T + 3) / 4, ok = 1;
            for (int g = 0; g < groups; g++) {
                const ir_step *sg = &c->steps[l + g];
                ok &= sg->op_id == s->op_id && sg->args[0].i == (int64_t)g * 4 * K * 2 &&
                      sg->args[5].i == (int64_t)g * 4 * N * 2;
            }
            T_CHECK(ok);
        }
    }
    const ir_step *al = NULL;
    int ala = 0, r = moe_gate_up_step(m, c, &al, &ala);
    if (r < 0)
        return;
    const ir_step *gu = &c->steps[r], *dn = &c->steps[r + 1];
    int split = ir_module_find_value(m, "up") != NULL;
    const char *g = split ? "gate" : "gate_up", *u = split ? "up" : "gate_up";
    T_CHECK(gu->n_args == 9 && weight_arg(m, gu->args[1], g, 0) &&
            weight_arg(m, gu->args[2], u, 0) && weight_arg(m, gu->args[3], g, 1) &&
            weight_arg(m, gu->args[4], u, 1) && gu->args[5].kind == IR_ARG_SCRATCH);
    T_CHECK(dn->n_args == 9 && weight_arg(m, dn->args[1], "down", 0) &&
            weight_arg(m, dn->args[2], "down", 1) && dn->args[3].kind == IR_ARG_SCRATCH);
    T_CHECK(strstr(c->kernel_names[gu->kernel], "_f8e4m3_") != NULL &&
            strstr(c->kernel_names[dn->kernel], "_f8e4m3_") != NULL);
    const ir_value *dw = ir_module_find_value(m, "down"), *ids = ir_module_find_value(m, "ids");
    const ir_value *gu_w = ir_module_find_value(m, g);
    long long E = dw->type.dims[0], H = dw->type.dims[1], I = dw->type.dims[2];
    long long bn = dw->scale.block[0], bk = dw->scale.block[1], slots = T * ids->type.dims[1];
    /* from two slots a CUDA-core block (twice the mean slots an expert,
       MOEC_MOE_FP8_TC_MIN_BM; the first kernels took tensor cores from
       four) */
    int from2 = (2 * slots + E - 1) / E > 1 && bk % 32 == 0 && bn % 16 == 0;
    int tc = mode != CG_FP8_OLD && (from2 || mode == CG_FP8_TC) && H % 64 == 0 &&
             I % 64 == 0 && bk % 64 == 0 && bn % 16 == 0;
    const char *gk = c->kernel_names[gu->kernel], *dk = c->kernel_names[dn->kernel];
    T_CHECK((strstr(gk, "_f8tc_w4_") != NULL) == tc && (strstr(dk, "_f8tc_w4_") != NULL) == tc);
    if (!tc)
        return;
    /* blocks of 8 slots, doubled to 64 while the experts average more,
       halved while a block's x (or h) rows do not fit the shared memory;
       6 chunks in flight, from 64 tokens 4 refilled by halves, and so in
       every bucket over weights in fragment tiles (the default's gate_up:
       fp8_tiles, ir_weight_tiled; their scale tag ends in _tl) */
    int bm = 8;
    while (bm < 64 && slots > bm * E)
        bm *= 2;
    while (bm > 8 && bm * ((H > I ? H : I) + 8) * 2 > 227 * 1024)
        bm /= 2;
    int tiles = c->opt->fp8_tiles;
    int tl_gu = ir_weight_tiled(m, gu_w, tiles), tl_dn = ir_weight_tiled(m, dw, tiles);
    /* these models' shapes allow tiles: the default puts gate_up's there */
    int ex = tiles & IR_FP8_TILES_EXPERTS;
    T_CHECK(tl_gu == (ex == IR_FP8_TILES_GATE_UP || ex == IR_FP8_TILES_ALL));
    char want[64];
    snprintf(want, sizeof want, "_bm%d_f8tc_w4_%s_t%d_", bm,
             T >= 64 || tl_gu ? "u4_roll2" : "u6", T);
    T_CHECK(strstr(gk, want) != NULL);
    T_CHECK((strstr(gk, "_tl") != NULL) == tl_gu && (strstr(dk, "_tl") != NULL) == tl_dn);
    snprintf(want, sizeof want, "_%s_t%d_", T >= 64 || tl_dn ? "u4_roll2" : "u6", T);
    T_CHECK(strstr(dk, want) != NULL);
    long long nnz = slots < E ? slots : E, nb = (slots + (bm - 1) * nnz + bm - 1) / bm;
    T_CHECK(al->grid[0] == 1 && gu->grid[0] == (unsigned)nb &&
            gu->grid[1] == (unsigned)((I + 63) / 64) && gu->block[0] == 128 &&
            gu->smem == (unsigned)(bm * (H + 8) * 2));
    int rt = 0;
    /* down: one 16-row tile a warp (MOEC_FP8_TC_DN_RT) */
    T_CHECK(sscanf(strstr(dk, "_f8tc_w4_rt"), "_f8tc_w4_rt%d_", &rt) == 1 && rt == 1);
    T_CHECK(dn->grid[0] == gu->grid[0] && dn->grid[1] == (unsigned)((H + 64 * rt - 1) / (64 * rt)) &&
            dn->block[0] == 128 && dn->smem == (unsigned)(bm * (I + 8) * 2));
    /* h [T*K, I] is bf16: the down's y scratch follows 2 bytes an element on */
    T_CHECK(dn->args[8].kind == IR_ARG_SCRATCH &&
            dn->args[8].i == (int64_t)((gu->args[8].i + slots * I * 2 + 15) / 16 * 16));
}

static void test_fp8_shapes(void)
{
    cg_options o;
    cg_options_default(&o);
    /* DeepSeek-V3's kv_a (576 rows: 4.5 row blocks) and routed experts
       (16 of its 256) */
    km_spec v3 = {.name = "k_f8_v3", .vocab = 8, .E = 16, .K = 8, .sigmoid = 1, .NG = 8, .TG = 4,
                  .top2 = 1, .norm = 1, .bias = 1, .scaling = 2.5, .moe = KM_ROUTED,
                  .HID = 7168, .I = 2048, .wdt = "f8e4m3", .moe_scale = 1.0, .LN = 576,
                  .LK = 7168, .ldt = "f8e4m3"};
    /* Qwen3-30B-A3B's experts (gate and up apart) and o_proj */
    km_spec q3 = {.name = "k_f8_qwen3", .vocab = 8, .E = 128, .K = 8, .NG = 1, .TG = 1, .norm = 1,
                  .scaling = 1.0, .moe = KM_ROUTED_SPLIT, .HID = 2048, .I = 768,
                  .wdt = "f8e4m3", .moe_scale = 1.0, .LN = 2048, .LK = 4096, .ldt = "f8e4m3"};
    /* partial blocks everywhere, blocks of 32 x 64, up starting inside a
       row block; a linear whose K (200) is not in 32-wide chunks */
    km_spec odd = {.name = "k_f8_odd", .vocab = 8, .E = 4, .K = 2, .NG = 1, .TG = 1,
                   .scaling = 1.0, .moe = KM_ROUTED, .HID = 320, .I = 48, .wdt = "f8e4m3",
                   .moe_scale = 0.5, .LN = 37, .LK = 200, .ldt = "f8e4m3", .BN = 32, .BK = 64};
    /* V2-Lite's dense gate_proj quantized: 10944 rows (85.5 row blocks),
       two row tiles a block at T = 64 */
    km_spec v2 = {.name = "k_f8_v2lite_gate", .vocab = 8, .LN = 10944, .LK = 2048,
                  .ldt = "f8e4m3"};
    /* the staged kernels' edges: blocks of 48 x 64 (rows 336 = 7 blocks,
       21 tiles: a slab of 4 warps with dead ones; K 640 = 10 chunks split
       unevenly), up from row 192 of gate_up, H 320 (6.7 row blocks of
       down) */
    km_spec tc = {.name = "k_f8_tc_odd", .vocab = 8, .E = 6, .K = 3, .NG = 1, .TG = 1,
                  .scaling = 1.0, .moe = KM_ROUTED, .HID = 320, .I = 192, .wdt = "f8e4m3",
                  .moe_scale = 0.5, .LN = 336, .LK = 640, .ldt = "f8e4m3", .BN = 48, .BK = 64};
    /* the unfused experts op on the staged kernels (down writes the result) */
    km_spec ex = {.name = "k_f8_tc_experts", .vocab = 8, .E = 4, .K = 2, .NG = 1, .TG = 1,
                  .scaling = 1.0, .moe = KM_EXPERTS_SPLIT, .HID = 256, .I = 128,
                  .wdt = "f8e4m3", .moe_scale = 1.0};
    const km_spec *specs[] = {&v3, &q3, &odd, &v2, &tc, &ex};
    /* compiled, with the default kernels: v3 at T = 1 and 64 (few-rows and
       staged linears, CUDA-core and staged experts), qwen3 at T = 8 and
       64, odd at 64 in bf16 (grouped few-rows linear) and at 8 in f32, v2
       tc and the experts at 64; with the first kernels (CG_FP8_OLD): v3 at
       64 and odd at 64; with CG_FP8_TC: tc at T = 1 and 8 */
    const unsigned compile[][3] = {{5, 4, 0}, {6, 0, 0}, {4, 4, 0}, {4, 0, 0}, {4, 0, 3}, {4, 0, 0}};
    const int modes[3] = {CG_FP8_AUTO, CG_FP8_OLD, CG_FP8_TC};
    /* buckets that are not the default ones: 3 tokens, 16 (Qwen3-30B's
       experts two slots a CUDA-core block: the staged kernels from there),
       and 128 (two token groups of the staged linear, blocks of 16 slots) */
    const int odd_t[3] = {3, 16, 128};
    for (int i = 0; i < 6; i++)
        for (int mi = 0; mi < 3; mi++)
            for (int t = 0; t < 3; t++) {
                o.compute_dtype = IR_DTYPE_BF16;
                o.fp8_kernel = modes[mi];
                ir_module *m = km_module(specs[i]);
                cg_ctx c;
                memset(&c, 0, sizeof c);
                T_CHECK(m != NULL);
                moec_status st = m ? gen(m, &o, odd_t[t], &c) : MOEC_ERR_INVALID_ARG;
                T_OK(st);
                if (st == MOEC_OK) {
                    check_steps(m, &c);
                    check_fp8(m, &c);
                }
                cg_ctx_free(&c);
                ir_module_free(m);
            }
    T_CHECK(fp8_tl_gemv > 0 && fp8_tl_tc > 0);
    for (int i = 0; i < 6; i++)
        for (int mi = 0; mi < 3; mi++)
            for (int f32 = 0; f32 < 2; f32++) {
                if (f32 && mi)
                    continue;
                o.compute_dtype = f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16;
                o.fp8_kernel = modes[mi];
                ir_module *m = km_module(specs[i]);
                T_CHECK(m != NULL);
                if (m)
                    run_module(m, &o, f32 ? NULL : check_fp8,
                               f32 ? (i == 2 ? 2u : 0u) : compile[i][mi]);
                ir_module_free(m);
            }
    /* the first kernels at 128 tokens on V2-Lite's gate, compiled: two row
       tiles a warp would put 64 KB of partial sums in static shared memory
       (48 KB at most), so one tile a warp (check_fp8 asserts the form) */
    static const int B128[] = {128};
    o.compute_dtype = IR_DTYPE_BF16;
    o.fp8_kernel = CG_FP8_OLD;
    ir_module *m = km_module(&v2);
    T_CHECK(m != NULL);
    if (m)
        run_module_at(m, &o, B128, 1, check_fp8, 1u);
    ir_module_free(m);
    /* Qwen3-30B's o_proj at 128 tokens (two groups of 64, 128 blocks at 8
       warps) takes 8 */
    T_CHECK(fp8_tc_w8 > 0);
}

/* ---- the tiny models after every pass ------------------------------------- */

/* DeepSeek-V2's tiny model (bf16, the shared experts on the side stream,
 * which replays beside the main one at 8 and 64 tokens: IR_DUAL_STREAM_*):
 * the router's linear in the top-k kernel, a warp per expert row, at one
 * token; at 8 the linear's own step, a top-k and an align; at 64, where
 * the fork comes after the routing, the tensor-core form; with
 * MOEC_DUAL_STREAM_MAX_T=4 (8 on one stream) the tensor-core form at 8. */
static void check_tiny_router(const ir_module *m, const cg_ctx *c)
{
    int k = steps_of(m, c, IR_OP_MOE_TOPK), side = 0;
    for (int i = 0; i < m->n_ops; i++)
        side |= m->ops[i]->stream == 1;
    T_CHECK(side && k >= 0);
    if (k < 0)
        return;
    const char *name = c->kernel_names[c->steps[k].kernel];
    /* bf16 weights on the side stream: two streams up to 16 tokens (4 with
       MOEC_DUAL_STREAM_MAX_T=4), one up to 31, two from 32 on
       (ir_dual_stream_from_t), where the fork moves past the router */
    int one = getenv("MOEC_DUAL_STREAM_MAX_T") != NULL;
    T_CHECK(ir_dual_stream_from_t(m) == IR_DUAL_STREAM_FROM_T && !ir_side_stream_fp8(m));
    int mma = c->T >= 2 && !ir_bucket_two_streams(c->T, one ? 4 : 16, 0);
    T_CHECK((strstr(name, "_routermma_h64_bf16_") != NULL) == mma);
    T_CHECK((strstr(name, "_router_h64_bf16_") != NULL) == (c->T == 1));
    T_CHECK((strstr(name, "moe_topk_align_") != NULL) == (c->T == 1 || mma));
}

static void test_tiny_models(void)
{
    static const char *models[] = {"deepseek_v2",     "deepseek_v3",   "qwen3_moe",
                                   "qwen2_moe",       "deepseek_v3_fp8", "qwen3_moe_fp8",
                                   "deepseek_v32"};
    cg_options o;
    cg_options_default(&o);
    for (int i = 0; i < 7; i++) {
        ir_module *m = t_pipeline_module(models[i], NULL, NULL);
        T_CHECK(m != NULL);
        if (!m)
            continue;
        int heavy = 0;
        for (int k = 0; k < m->n_ops; k++)
            heavy += km_is_heavy(m->ops[k]);
        T_CHECK(heavy >= 4);
        run_module(m, &o, i == 0 ? check_tiny_router : NULL,
                   i == 1 || i == 4 ? 4 : i == 2 || i == 5 ? 1 : i == 6 ? 2 : 0);
        if (i == 0) { /* the bucket of 8 on one stream: compiled */
            setenv("MOEC_DUAL_STREAM_MAX_T", "4", 1);
            run_module(m, &o, check_tiny_router, 2);
            unsetenv("MOEC_DUAL_STREAM_MAX_T");
        }
        ir_module_free(m);
    }
}

/* ---- errors --------------------------------------------------------------- */

static void test_errors(void)
{
    cg_options o;
    cg_options_default(&o);
    km_spec s = {.name = "k_wide_topk", .vocab = 4, .E = 64, .K = 40, .NG = 1, .TG = 1,
                 .scaling = 1.0};
    ir_module *m = km_module(&s);
    T_CHECK(m != NULL);
    if (!m)
        return;
    cg_ctx c = {.m = m, .opt = &o, .T = 8};
    for (int k = 0; k < m->n_ops; k++)
        if (m->ops[k]->kind == IR_OP_MOE_TOPK)
            T_ERR(cg_emit_op(&c, m->ops[k]), MOEC_ERR_UNSUPPORTED, "top_k 40 > 32");
    cg_ctx_free(&c);
    ir_module_free(m);
    /* the tensor-core MLA kernel with more tile buffers than an sm_80 SM's
       shared memory holds (MOEC_MLA_NBUF, an A/B knob): refused by name,
       with the size of one column tile a warp unless MOEC_MLA_CT=2 asks
       for two */
    km_spec sm = {.name = "k_mla_nbuf", .vocab = 4, .attn = KM_MLA, .H = 16, .R = 512, .DR = 64,
                  .attn_scale = 0.1352};
    m = km_module(&sm);
    T_CHECK(m != NULL);
    if (!m)
        return;
    cg_options o80 = o;
    snprintf(o80.arch, sizeof o80.arch, "sm_80");
    setenv("MOEC_MLA_NBUF", "4", 1);
    c = (cg_ctx){.m = m, .opt = &o80, .T = 8};
    int n_mla = 0;
    for (int k = 0; k < m->n_ops; k++)
        if (m->ops[k]->kind == IR_OP_MLA_ATTENTION) {
            n_mla++;
            T_ERR(cg_emit_op(&c, m->ops[k]), MOEC_ERR_UNSUPPORTED,
                  getenv("MOEC_MLA_CT") && atoi(getenv("MOEC_MLA_CT")) == 2
                      ? "4 buffers of 32 positions need 178912 bytes of shared memory"
                      : "4 buffers of 32 positions need 174304 bytes of shared memory");
        }
    T_CHECK(n_mla == 1);
    unsetenv("MOEC_MLA_NBUF");
    cg_ctx_free(&c);
    ir_module_free(m);
    /* more experts than a warp's lanes hold in their 32-bit taken masks */
    km_spec sw = {.name = "k_many_experts", .vocab = 4, .E = 1056, .K = 8, .NG = 1, .TG = 1,
                  .scaling = 1.0};
    m = km_module(&sw);
    T_CHECK(m != NULL);
    if (!m)
        return;
    c = (cg_ctx){.m = m, .opt = &o, .T = 8};
    for (int k = 0; k < m->n_ops; k++)
        if (m->ops[k]->kind == IR_OP_MOE_TOPK)
            T_ERR(cg_emit_op(&c, m->ops[k]), MOEC_ERR_UNSUPPORTED,
                  "moe_topk %ids: 1056 experts > 1024 (a lane holds at most 32 of them)");
    cg_ctx_free(&c);
    ir_module_free(m);
    /* the argmax wants [T, vocab] logits stored as f32: x is bf16 */
    km_spec s2 = {.name = "k_bf16_x", .vocab = 4, .E = 4, .K = 2, .NG = 1, .TG = 1, .scaling = 1.0,
                  .moe = KM_ROUTED, .HID = 8, .I = 8, .wdt = "bf16", .moe_scale = 1.0};
    m = km_module(&s2);
    T_CHECK(m != NULL);
    if (!m)
        return;
    cg_ctx d = {.m = m, .opt = &o, .T = 8};
    T_ERR(cg_emit_argmax(&d, ir_module_find_value(m, "x")), MOEC_ERR_INVALID_ARG, "stored as f32");
    cg_ctx_free(&d);
    ir_module_free(m);
    /* MOEC_DSA_KERNEL other than fast or legacy */
    km_spec s3 = {.name = "k_bad_dsa_form", .vocab = 4, .attn = KM_MLA, .H = 3, .R = 36, .DR = 6,
                  .attn_scale = 0.3, .TOPK = 5, .HI = 3, .DI = 12, .dsa_scale = 0.5,
                  .dsa_wscale = 1.0};
    m = km_module(&s3);
    T_CHECK(m != NULL);
    if (!m)
        return;
    cg_ctx e = {.m = m, .opt = &o, .T = 8};
    setenv("MOEC_DSA_KERNEL", "fastest", 1);
    T_ERR(cg_emit_op(&e, ir_module_find_value(m, "sel")->def), MOEC_ERR_INVALID_ARG,
          "dsa_topk %sel: MOEC_DSA_KERNEL='fastest' is not fast or legacy");
    unsetenv("MOEC_DSA_KERNEL");
    cg_ctx_free(&e);
    ir_module_free(m);
}

/* The argmax kernel marks a row with a NaN or an infinity: every logit's
 * exponent bits tested (float4 and scalar loads), the flags of the block
 * or-ed, and IR_SAMPLED_NONFINITE written instead of an id. */
static void test_argmax_nonfinite(void)
{
    cg_options o;
    cg_options_default(&o);
    km_spec s = {.name = "k_argmax", .vocab = 4, .E = 4, .K = 2, .NG = 1, .TG = 1, .scaling = 1.0};
    ir_module *m = km_module(&s);
    T_CHECK(m != NULL);
    if (!m)
        return;
    cg_ctx c = {.m = m, .opt = &o, .T = 8};
    T_OK(cg_emit_argmax(&c, m->outputs[0]));
    const char *src = c.src.data ? c.src.data : "";
    static const char *want[] = {
        "constexpr int NONFINITE_ID = -1;\n",
        "return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;\n",
        "bad |= nonfinite(v.x) | nonfinite(v.y) | nonfinite(v.z) | nonfinite(v.w);\n",
        "bad |= nonfinite(v);\n",
        "int row_bad = __syncthreads_or(bad);\n",
        "sampled[r] = row_bad ? NONFINITE_ID : bi;\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        if (!strstr(src, want[i])) {
            fprintf(stderr, "argmax source lacks: %s", want[i]);
            T_CHECK(0);
        }
    T_CHECK(IR_SAMPLED_NONFINITE == -1);
    cg_ctx_free(&c);
    ir_module_free(m);
}

/* The residual add_rms_norm with the routed sum over K (and the shared
 * experts' addend) in its cluster form (codegen/norm_rows.h): at Qwen3-30B's
 * hidden 2048 and top-8, V3's 7168
 * and an odd 2050 (vec 2, the last block idle), buckets of 1, 8 and 64
 * tokens take 8 blocks a row (32, 128 and 160 threads, grid 8 T, the
 * kernel's cluster dims and its cluster sum in the source); 65 tokens,
 * MOEC_NORM_CL_SUM=1 and sm_80 one block a row (its block sum); one
 * program of the cluster forms compiled by NVRTC. */
static void test_norm_cluster(void)
{
    static const struct {
        int D, K, nt;
    } shapes[] = {{2048, 8, 32}, {7168, 8, 128}, {2050, 3, 160}};
    static const int Ts[] = {1, 8, 64, 65};
    compile_job *j = job_slot();
    if (!j)
        return;
    moec_buf prog = {0};
    cg_emit_prologue(&prog);
    /* pass 1: MOEC_NORM_CL_SUM=1; pass 2: sm_80 (no clusters) */
    for (int knob = 0; knob < 3; knob++) {
        if (knob == 1)
            setenv("MOEC_NORM_CL_SUM", "1", 1);
        for (int si = 0; si < 3; si++) {
            int D = shapes[si].D, K = shapes[si].K;
            km_spec sp = {.name = "k_norm_cl", .vocab = 4, .E = 16, .K = K, .NG = 1, .TG = 1,
                          .scaling = 1.0, .moe = KM_ROUTED, .HID = D, .I = 64, .wdt = "bf16",
                          .moe_scale = 1.0, .AN = D, .an_alpha = 1.0, .an_moe = 1};
            ir_module *m = km_module(&sp);
            T_CHECK(m != NULL);
            if (!m)
                continue;
            cg_options o;
            cg_options_default(&o);
            if (knob == 2)
                snprintf(o.arch, sizeof o.arch, "sm_80");
            for (int ti = 0; ti < 4; ti++) {
                int T = Ts[ti], cl = !knob && T <= 64;
                cg_ctx c = {.m = m, .opt = &o, .T = T};
                const ir_op *op = last_op(m, IR_OP_ADD_RMS_NORM);
                T_CHECK(op != NULL);
                if (!op || cg_emit_op(&c, op) != MOEC_OK || c.n_steps != 1) {
                    fprintf(stderr, "k_norm_cl D %d T %d: %s\n", D, T, moec_last_error());
                    T_CHECK(0);
                    cg_ctx_free(&c);
                    continue;
                }
                const ir_step *st = &c.steps[0];
                const char *kn = c.kernel_names[st->kernel], *src = c.src.data ? c.src.data : "";
                char want[96];
                snprintf(want, sizeof want, "add3_rms_norm_sum%d_bf16_d%d%s_t%d_", K, D,
                         cl ? "_cl8" : "", T);
                int nt = cl ? shapes[si].nt : (D % 8 ? (D / 2 + 31) / 32 * 32 : D / 8);
                if (nt > 1024)
                    nt = 1024;
                if (strncmp(kn, want, strlen(want)) || st->grid[0] != (unsigned)(cl ? 8 * T : T) ||
                    st->block[0] != (unsigned)nt)
                    fprintf(stderr, "k_norm_cl D %d T %d: %s grid %u block %u\n", D, T, kn,
                            st->grid[0], st->block[0]);
                T_CHECK(!strncmp(kn, want, strlen(want)));
                T_CHECK(st->grid[0] == (unsigned)(cl ? 8 * T : T) && st->block[0] == (unsigned)nt);
                T_CHECK((strstr(src, "__cluster_dims__(8, 1, 1) __launch_bounds__") != NULL) == cl);
                T_CHECK((strstr(src, "ss = moec_cluster_sum<8>(ss);") != NULL) == cl);
                T_CHECK((strstr(src, "ss = block_sum(ss);") != NULL) == !cl);
                if (cl && T == 1)
                    job_add(j, &prog, &c, kn);
                cg_ctx_free(&c);
            }
            ir_module_free(m);
        }
        unsetenv("MOEC_NORM_CL_SUM");
    }
    job_queue(j, &prog, "norm_cluster");
}

/* The bf16 linear past the few-token kernel (codegen/linear.c, emit_mma):
 * at 5 to 8 tokens the tensor-core kernel, its K splits by the rule (a
 * warp's chunks one round of 8 at 8 warps, every SM a block, at most 8 and
 * a chunk a warp): V2-Lite's qkv_a (228 row tiles: none), o_proj (128: 2),
 * the router's 64 rows (8), the dense down with act at K 10944 (6), Qwen3's
 * o_proj at K 4096 (2), V2-Lite's shared gate_up (352: none). With
 * MOEC_LINEAR_TC_MAX_T=64 (passes 0 to 3), from 16 tokens (and from 5
 * with MOEC_LINEAR_MMA_MAX_T=0) up to 64 the staged kernel
 * (codegen/fp8_tc.c, check_tc_linear; act computes h as it stages it: one
 * step), two tiles a warp only for the shared gate_up; a cuBLASLt step at
 * K 200 (not whole 64-wide chunks), on sm_80 at K 10944 (x past the shared
 * memory without a cluster's splits), without the knob (pass 4, the
 * default) from 16 tokens, and past 64 tokens; no cluster on sm_80 or with
 * MOEC_LINEAR_MMA_KS=1 (the staged kernel's splits are its own); the
 * clustered ones' sources compile with NVRTC. */
static void test_linear_mma(void)
{
    static const struct {
        int N, K, act, ks;
    } shapes[] = {{3648, 2048, 0, 1}, {2048, 2048, 0, 2}, {64, 2048, 0, 8},
                  {2048, 10944, 1, 6}, {2048, 4096, 0, 2}, {37, 200, 1, 0},
                  {5632, 2048, 0, 1}};
    compile_job *j = job_slot();
    if (!j)
        return;
    moec_buf prog = {0};
    cg_emit_prologue(&prog);
    /* pass 1: MOEC_LINEAR_MMA_MAX_T=0; 2: MOEC_LINEAR_MMA_KS=1; 3: sm_80;
       4: no MOEC_LINEAR_TC_MAX_T */
    setenv("MOEC_LINEAR_TC_MAX_T", "64", 1);
    for (int knob = 0; knob < 5; knob++) {
        if (knob == 1)
            setenv("MOEC_LINEAR_MMA_MAX_T", "0", 1);
        if (knob == 2) {
            unsetenv("MOEC_LINEAR_MMA_MAX_T");
            setenv("MOEC_LINEAR_MMA_KS", "1", 1);
        }
        if (knob == 3)
            unsetenv("MOEC_LINEAR_MMA_KS");
        if (knob == 4)
            unsetenv("MOEC_LINEAR_TC_MAX_T");
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            km_spec sp = {.name = "k_lin_mma", .vocab = 4, .LN = shapes[si].N,
                          .LK = shapes[si].K, .ldt = "bf16", .lact = shapes[si].act};
            ir_module *m = km_module(&sp);
            T_CHECK(m != NULL);
            if (!m)
                continue;
            cg_options o;
            cg_options_default(&o);
            if (knob == 3)
                snprintf(o.arch, sizeof o.arch, "sm_80");
            static const int Ts[] = {5, 8, 16, 32, 64, 72};
            for (int ti = 0; ti < 6; ti++) {
                int T = Ts[ti], mma = knob != 1 && T <= 8 && shapes[si].ks > 0;
                int ks = mma && (knob == 0 || knob == 4) ? shapes[si].ks : 1;
                /* on sm_80 (no clusters) a block's x of 8 tokens over all
                   of K within the shared memory */
                int tc = !mma && shapes[si].K % 64 == 0 && T <= 64 && knob != 4 &&
                         (knob != 3 || 8 * (shapes[si].K + 8) * 2 <= (int)cg_smem_max(&o));
                cg_ctx c = {.m = m, .opt = &o, .T = T};
                const ir_op *op = last_op(m, IR_OP_LINEAR);
                T_CHECK(op != NULL);
                if (!op || cg_emit_op(&c, op) != MOEC_OK || c.n_steps < 1) {
                    fprintf(stderr, "k_lin_mma %d x %d T %d: %s\n", shapes[si].N, shapes[si].K, T,
                            moec_last_error());
                    T_CHECK(0);
                    cg_ctx_free(&c);
                    continue;
                }
                const ir_step *st = &c.steps[c.n_steps - 1];
                char want[96], splits[16] = "";
                if (ks > 1)
                    snprintf(splits, sizeof splits, "_s%d", ks);
                snprintf(want, sizeof want, "linear_mma_n%d_k%d_t%d_w8_rt1_u8%s%s_bf16_", shapes[si].N,
                         shapes[si].K, T, splits, shapes[si].act ? "_silu" : "");
                const char *kn = st->kind == IR_STEP_KERNEL ? c.kernel_names[st->kernel] : "(gemm)";
                int ok = mma  ? st->kind == IR_STEP_KERNEL && c.n_steps == 1 &&
                                   !strncmp(kn, want, strlen(want)) &&
                                   st->grid[0] == (unsigned)((shapes[si].N + 15) / 16 * ks) &&
                                   st->block[0] == 256 &&
                                   st->smem == (ks > 1 ? 9u * 4 * 128 * ((T + 7) / 8) : 0u)
                         : tc ? st->kind == IR_STEP_KERNEL && c.n_steps == 1 &&
                                    !strncmp(kn, "linear_tc_", 10) &&
                                    (strstr(kn, "_silu_bf16_") != NULL) == shapes[si].act &&
                                    (knob != 3 || (strstr(kn, "_s1_") &&
                                                   !strstr(c.src.data, "__cluster_dims__")))
                              : st->kind == IR_STEP_GEMM;
                if (!ok)
                    fprintf(stderr, "k_lin_mma %d x %d T %d knob %d: %s grid %u (want %s)\n",
                            shapes[si].N, shapes[si].K, T, knob, kn, st->grid[0],
                            mma ? want : tc ? "linear_tc_" : "a GEMM step");
                T_CHECK(ok);
                if (ok && tc && knob != 3) {
                    int n8 = 0; /* bf16 weights keep 4 warps */
                    check_tc_linear(&c, st, shapes[si].N, shapes[si].K, 0, &n8);
                    T_CHECK(n8 == 0);
                }
                if (mma && ks > 1 && knob == 0) {
                    char cd[64];
                    snprintf(cd, sizeof cd, "__cluster_dims__(%d, 1, 1) __launch_bounds__", ks);
                    T_CHECK(c.src.data && strstr(c.src.data, cd));
                }
                if (knob == 0 && ((mma && ks > 1 && T == 8) || (tc && (T == 16 || T == 64))))
                    job_add(j, &prog, &c, kn);
                cg_ctx_free(&c);
            }
            ir_module_free(m);
        }
    }
    unsetenv("MOEC_LINEAR_MMA_MAX_T");
    unsetenv("MOEC_LINEAR_MMA_KS");
    unsetenv("MOEC_LINEAR_TC_MAX_T");
    job_queue(j, &prog, "linear_mma");
}

/* ---- the device sampler ------------------------------------------------------ */

/* A module whose output is [T, V] logits (an embedding), for the argmax and
 * the sampler; NULL (error printed) on failure. */
static ir_module *logits_module(long long V)
{
    char text[512], name[32];
    snprintf(name, sizeof name, "k_sample_v%lld", V);
    snprintf(text, sizeof text,
             "module %s {\n  meta vocab_size = %lld\n  input %%tokens : i32[T]\n"
             "  input %%positions : i32[T]\n  weight %%tab : f32[4, %lld] = \"tab\"\n"
             "  %%logits : f32[T, %lld] = embedding(%%tokens, %%tab)\n  output %%logits\n}\n",
             name, V, V, V);
    ir_module *m = NULL;
    if (ir_module_parse(text, name, &m) != MOEC_OK) {
        fprintf(stderr, "%s: %s\n", name, moec_last_error());
        return NULL;
    }
    return m;
}

/* The sampler after the argmax, at real vocabularies (DeepSeek-V2-Lite's
 * 102400, V3's 129280, Qwen3's 151936), a large one that needs 8 ids a lane
 * and small odd ones, for every bucket: its step (one block per row; the
 * logits, the argmax's ids, the parameter rows, the penalty entries, the
 * tokens and log probabilities out) and the constants of ir/ir_sample.h in
 * its source; then one NVRTC program of a bucket of each block size and
 * lane width (1024 threads at 129280, 8 ids a lane at 2^20, 256 threads at
 * 2049, 32 at 7: their shared definitions guarded); the largest vocabulary
 * it takes, and one past it refused. */
static void test_sampler(void)
{
    cg_options o;
    cg_options_default(&o);
    static const long long vocabs[] = {102400, 129280, 151936, 1 << 20, 50, 7, 2049};
    /* the bucket of each compiled into the one program (-1: none) */
    static const int compile_T[] = {-1, 64, -1, 1, -1, 8, 1};
    compile_job *j = job_slot();
    if (!j)
        return;
    moec_buf prog = {0};
    cg_emit_prologue(&prog);
    for (size_t v = 0; v < sizeof vocabs / sizeof *vocabs; v++) {
        long long V = vocabs[v];
        ir_module *m = logits_module(V);
        T_CHECK(m != NULL);
        if (!m)
            continue;
        T_CHECK(cg_has_sampler(m));
        for (int b = 0; b < N_BUCKETS; b++) {
            int T = BUCKETS[b];
            cg_ctx c = {.m = m, .opt = &o, .T = T};
            T_OK(cg_emit_argmax(&c, m->outputs[0]));
            T_OK(cg_emit_sample(&c, m->outputs[0]));
            T_CHECK(c.n_steps == 2 && c.n_kernels == 2);
            if (c.n_steps == 2) {
                const ir_step *s = &c.steps[1];
                char want[64];
                snprintf(want, sizeof want, "sample_v%lld_t%d", V, T);
                int nt = V >= 32768 ? 1024 : V >= 2048 ? 256 : 32, lb = 0;
                T_CHECK(!strcmp(c.kernel_names[s->kernel], want));
                T_CHECK(s->kind == IR_STEP_KERNEL && s->stream == 0 && s->grid[0] == (unsigned)T &&
                        s->grid[1] == 1 && s->block[0] == (unsigned)nt && s->smem == 0);
                T_CHECK(kernel_params(c.src.data, want, &lb) == 6 && lb == nt && s->n_args == 6);
                T_CHECK(has_header(c.src.data, want));
                T_CHECK(s->args[0].kind == IR_ARG_ACT && s->args[0].index == m->outputs[0]->id);
                static const ir_input ins[] = {IR_INPUT_SAMPLED, IR_INPUT_SAMPLE_ROWS,
                                               IR_INPUT_SAMPLE_PENS, IR_INPUT_SAMPLE_TOKENS,
                                               IR_INPUT_SAMPLE_LOGPROBS};
                for (int a = 0; a < 5; a++)
                    T_CHECK(s->args[a + 1].kind == IR_ARG_INPUT &&
                            s->args[a + 1].index == (int)ins[a] && s->args[a + 1].i == 0);
                /* tiles of 32 * EPL ids: EPL 4, or 8 past 2^19 ids */
                char tiles[96];
                long long epl = V > (1 << 19) ? 8 : 4;
                snprintf(tiles, sizeof tiles, "constexpr int V = %lld, NT = %d, EPL = %lld, NTILES = %lld;",
                         V, nt, epl, (V + 32 * epl - 1) / (32 * epl));
                T_CHECK(strstr(c.src.data, tiles) != NULL);
                static const char *consts[] = {
                    "#define MOEC_SAMPLE_WEIGHT_BITS 40\n", "#define MOEC_SAMPLE_X_MIN (-0x1.cp+4f)\n",
                    "#define MOEC_SAMPLE_LN2_HI 0x1.62e4p-1f\n", "#define MOEC_SAMPLE_C3 0x1.555556p-3f\n",
                    "#define MOEC_SAMPLE_GOLDEN 0x9e3779b97f4a7c15ull\n",
                    "return __float2ull_rz(__fmul_rn(p, scale));\n"};
                for (size_t k = 0; k < sizeof consts / sizeof *consts; k++)
                    if (!strstr(c.src.data, consts[k])) {
                        fprintf(stderr, "sampler source lacks: %s", consts[k]);
                        T_CHECK(0);
                    }
            }
            if (T == compile_T[v]) {
                moec_buf_printf(&prog, "%s", c.src.data);
                for (int k = 0; k < c.n_kernels; k++)
                    moec_buf_printf(&j->names, "%s\n", c.kernel_names[k]);
            }
            cg_ctx_free(&c);
        }
        ir_module_free(m);
    }
    job_queue(j, &prog, "the sampler at 129280, 2^20, 7 and 2049 ids");
    ir_module *m = logits_module(IR_SAMPLE_VOCAB_MAX);
    T_CHECK(m && cg_has_sampler(m));
    ir_module_free(m);
    m = logits_module(IR_SAMPLE_VOCAB_MAX + 1LL);
    T_CHECK(m && !cg_has_sampler(m));
    if (m) {
        cg_ctx c = {.m = m, .opt = &o, .T = 1};
        T_ERR(cg_emit_sample(&c, m->outputs[0]), MOEC_ERR_INVALID_ARG, "at most 8388608 ids");
        cg_ctx_free(&c);
    }
    ir_module_free(m);
}

/* ---- L2 prefetch before the wait (MOEC_PREFETCH_KB) ----------------------- */

/* Whether identifier id occurs in text[0 .. n) as a whole word. */
static int has_ident(const char *text, size_t n, const char *id)
{
    size_t k = strlen(id);
    for (size_t i = 0; i + k <= n; i++) {
        if (strncmp(text + i, id, k))
            continue;
        char a = i ? text[i - 1] : ' ', b = i + k < n ? text[i + k] : ' ';
        /* (a member, threadIdx.x, is not the parameter x) */
        if (!(a == '_' || a == '.' || isalnum((unsigned char)a)) &&
            !(b == '_' || isalnum((unsigned char)b)))
            return 1;
    }
    return 0;
}

/* Kernel `name` of src (after cg_add_pdl_waits) against the prefetch rule:
 * exactly one moec_pdl_enter; with pf > 0 (want) thread 0's prefetch of
 * cap PF_CAP = pf before it, mentioning no parameter but the weights'
 * (`weights`: names separated by spaces), else the wait first and no
 * prefetch at all. A kernel that stages its weights in shared memory
 * before the wait (the tensor-core absorptions: name with "absorb_mma")
 * prefetches nothing, and reads no parameter but the weights before it; so
 * does a norm that reads its weight into registers before the wait (the
 * block form: `float wpre[`), the one-token router's top-k kernel its
 * weight rows (`_wpre_`, `uint4 wpre[`), the bf16 tensor-core linear its
 * first chunks (`linear_mma_`, `load_w(gw)`), and the staged linears
 * theirs where no prefetch runs (`_pre_`, `load(c0)`). The MLA attention
 * on tensor cores loads its first tiles before the wait (`_early_`,
 * `load_tile(row_next, pre)`), after the prefetch where one runs: it
 * reads no parameter but the step inputs and the pools before it either. */
static void check_prefetch(const char *src, const char *name, long long pf, int want,
                           const char *weights)
{
    int staged = strstr(name, "absorb_mma") != NULL;
    char pat[320];
    snprintf(pat, sizeof pat, "%s(", name);
    const char *def = strstr(src, pat);
    while (def && def > src && def[-1] != ' ' && def[-1] != '\n')
        def = strstr(def + 1, pat);
    const char *open = def ? strchr(def, '{') : NULL;
    const char *end = open ? strstr(open, "\n}\n") : NULL;
    if (!end)
        fprintf(stderr, "%s: no kernel body\n", name);
    T_CHECK(end != NULL);
    if (!end)
        return;
    int enters = 0;
    for (const char *p = open; (p = strstr(p, "moec_pdl_enter();")) && p < end; p++)
        enters++;
    const char *pre = strstr(open, "\n    moec_pdl_enter();");
    const char *wregs = strstr(open, "\n    float wpre[");
    if (wregs && pre && wregs < pre && strstr(name, "rms_norm_"))
        staged = 1;
    /* the one-token router's weight rows in registers (uint4 wpre) */
    const char *wrows = strstr(open, "\n    uint4 wpre[");
    if (wrows && pre && wrows < pre && strstr(name, "_wpre_"))
        staged = 1;
    /* the bf16 tensor-core linear's first chunks of weight rows (load_w) */
    const char *lw = strstr(open, "\n    load_w(gw);");
    if (lw && pre && lw < pre && !strncmp(name, "linear_mma_", 11))
        staged = 1;
    /* the staged linears' (fp8 and bf16) past the prefetch's buckets */
    const char *lc = strstr(open, "\n    if (live[0])\n        load(c0);\n    moec_pdl_enter();");
    if (lc && pre && lc < pre && strstr(name, "_pre_") &&
        (!strncmp(name, "linear_f8tc_", 12) || !strncmp(name, "linear_tc_", 10)))
        staged = 1;
    if (staged)
        pf = 0;
    const char *et = strstr(open, "load_tile(row_next, pre);");
    int early = et && pre && et < pre && !strncmp(name, "mla_attn_mma_", 13) &&
                strstr(name, "_early_") != NULL;
    const char *pfx = strstr(open, "moec_prefetch_");
    int has_pf = pfx && pfx < end;
    if (enters != 1 || has_pf != (want && pf > 0))
        fprintf(stderr, "%s: %d moec_pdl_enter, prefetch %d (want %d, %lld bytes)\n", name,
                enters, has_pf, want, pf);
    T_CHECK(enters == 1 && pre && pre < end);
    T_CHECK(has_pf == (want && pf > 0));
    if (!has_pf && !staged && !early) {
        T_CHECK(!strncmp(open, "{\n    moec_pdl_enter();", 22));
        return;
    }
    char cap[64];
    snprintf(cap, sizeof cap, "constexpr long long PF_CAP = %lldLL;", pf);
    T_CHECK(staged || (early && !has_pf) ||
            (strstr(open, cap) && strstr(open, cap) < pre && pfx < pre &&
             strstr(open, "    if (threadIdx.x == 0) {") < pfx));
    /* before the wait: no parameter but the weights */
    const char *close = open;
    while (close > def && *close != ')')
        close--;
    for (const char *p = def + strlen(pat); p < close;) {
        const char *comma = strpbrk(p, ",)");
        if (!comma || comma > close)
            break;
        const char *e = comma;
        while (e > p && (e[-1] == ' ' || e[-1] == '\n'))
            e--;
        const char *b = e;
        while (b > p && (b[-1] == '_' || isalnum((unsigned char)b[-1])))
            b--;
        char id[64];
        snprintf(id, sizeof id, "%.*s", (int)(e - b), b);
        char spaced[96];
        snprintf(spaced, sizeof spaced, " %s ", id);
        char wl[128];
        snprintf(wl, sizeof wl, " %s ", weights);
        if (!strstr(wl, spaced) && has_ident(open, (size_t)(pre - open), id)) {
            fprintf(stderr, "%s: parameter %s read before the wait\n", name, id);
            T_CHECK(0);
        }
        p = comma + 1;
    }
}

/* One bucket of m for test_prefetch: its linears, absorptions and
 * add_rms_norm (or, heavy, its heavy ops through gen()), each kernel
 * checked against the rule with pf bytes (a token selection's attention
 * prefetches nothing); the kinds seen (1 few-token linear, 2 staged
 * linear, 4 absorption, 8 attention, 16 norm); the source and kernel
 * names appended to prog and names. */
static int prefetch_bucket(const ir_module *m, int T, int heavy, long long pf, int sparse,
                           moec_buf *prog, moec_buf *names)
{
    cg_options o;
    cg_options_default(&o);
    cg_ctx c;
    memset(&c, 0, sizeof c);
    c.m = m;
    c.opt = &o;
    c.T = T;
    if (heavy)
        T_OK(gen(m, &o, T, &c));
    for (int k = 0; !heavy && k < m->n_ops; k++) {
        ir_op_kind kd = m->ops[k]->kind;
        if (kd == IR_OP_LINEAR || kd == IR_OP_MLA_QABSORB || kd == IR_OP_MLA_VABSORB ||
            kd == IR_OP_ADD_RMS_NORM)
            T_OK(cg_emit_op(&c, m->ops[k]));
    }
    cg_add_pdl_waits(&c.src);
    T_CHECK(!c.src.oom);
    int seen = 0;
    for (int k = 0; c.src.data && k < c.n_kernels; k++) {
        const char *kn = c.kernel_names[k];
        int kind = !strncmp(kn, "linear_gemv_", 12)   ? 1
                   : !strncmp(kn, "linear_f8tc_", 12) || !strncmp(kn, "linear_tc_", 10) ? 2
                   : !strncmp(kn, "mla_qabsorb_", 12) || !strncmp(kn, "mla_vabsorb_", 12) ? 4
                   : !strncmp(kn, "mla_attn_", 9) || !strncmp(kn, "attn_h", 6)             ? 8
                   : strstr(kn, "rms_norm_") != NULL                                      ? 16
                                                                                          : 0;
        check_prefetch(c.src.data, kn, T <= CG_PREFETCH_MAX_T ? pf : 0,
                       kind && !(kind == 8 && sparse),
                       kind == 8   ? "pos slots block_table max_blocks kvpool pepool kpool vpool "
                                     "window"
                       : kind == 4 ? "kv_b"
                                   : "w ws");
        seen |= kind;
        moec_buf_printf(names, "%s\n", kn);
    }
    if (c.src.data)
        moec_buf_printf(prog, "%s", c.src.data);
    cg_ctx_free(&c);
    return seen;
}

/* The weight-streaming kernels of 1 to 8 tokens prefetch their blocks'
 * weight rows before the wait (cg_emit_prefetch), others and larger
 * buckets and MOEC_PREFETCH_KB=0 none: the few-token linear (bf16, its act
 * silu_mul form, fp8 with its scales), the absorptions, the staged fp8
 * linear (one block a slab, and clusters of K splits), the add_rms_norm
 * its weight (a block a row at D 2050), compiled by NVRTC with the
 * default cap; and the attention kernels their cache rows (GQA,
 * MLA on CUDA and tensor cores, with a window; not over a token
 * selection), compiled by test_real_shapes and test_odd_shapes. */
static void test_prefetch(void)
{
    km_spec lin = {.name = "pf_lin", .vocab = 8, .LN = 100, .LK = 256, .ldt = "bf16",
                   .AH = 3, .ADN = 16, .ADV = 37, .AR = 96, .AN = 2050, .an_alpha = 1.0};
    km_spec act = {.name = "pf_act", .vocab = 8, .LN = 37, .LK = 200, .ldt = "bf16", .lact = 1};
    km_spec f8 = {.name = "pf_f8", .vocab = 8, .LN = 336, .LK = 640, .ldt = "f8e4m3", .BN = 48,
                  .BK = 64};
    km_spec mla = {.name = "pf_mla", .vocab = 8, .attn = KM_MLA, .H = 16, .R = 512, .DR = 64,
                   .attn_scale = 0.1352};
    km_spec mla_odd = {.name = "pf_mla_odd", .vocab = 8, .attn = KM_MLA, .H = 3, .R = 36, .DR = 6,
                       .window = 3, .attn_scale = 0.3};
    km_spec gqa = {.name = "pf_gqa", .vocab = 8, .attn = KM_GQA, .H = 32, .HKV = 4, .DK = 128,
                   .DV = 128, .attn_scale = 0.0883883};
    km_spec gqa_odd = {.name = "pf_gqa_odd", .vocab = 8, .attn = KM_GQA, .H = 6, .HKV = 2,
                       .DK = 24, .DV = 40, .window = 5, .attn_scale = 0.2};
    km_spec dsa = {.name = "pf_dsa", .vocab = 8, .attn = KM_MLA, .H = 3, .R = 36, .DR = 6,
                   .attn_scale = 0.3, .TOPK = 5, .HI = 3, .DI = 12, .dsa_scale = 0.5,
                   .dsa_wscale = -0.7};
    const km_spec *specs[] = {&lin, &act, &f8, &mla, &mla_odd, &gqa, &gqa_odd, &dsa};
    /* the default cap, none, 1 KiB, and the default with the long rows'
       norms prefetching their weight instead of reading it before the
       wait (MOEC_NORM_WPRE=0) */
    static const char *const knob[] = {NULL, "0", "1", NULL};
    static const int Ts[] = {1, 2, 8, 16};
    for (int kn = 0; kn < 4; kn++) {
        if (knob[kn])
            setenv("MOEC_PREFETCH_KB", knob[kn], 1);
        if (kn == 3)
            setenv("MOEC_NORM_WPRE", "0", 1);
        long long pf = 1024LL * (knob[kn] ? atoi(knob[kn]) : CG_PREFETCH_KB);
        for (int si = 0; si < 8; si++) {
            ir_module *m = km_module(specs[si]);
            T_CHECK(m != NULL);
            if (!m)
                continue;
            moec_buf prog = {0}, names = {0};
            cg_emit_prologue(&prog);
            for (int ti = 0; ti < 4; ti++) {
                int T = Ts[ti];
                int seen = prefetch_bucket(m, T, si >= 3, pf, specs[si]->TOPK > 0, &prog, &names);
                /* the kernels each case means to cover: the few-token
                   kernels up to 4 tokens (the absorptions 2, then their
                   tensor-core form), then the bf16 tensor-core linear at
                   8 and cuBLASLt at 16, or the staged kernel for fp8 */
                T_CHECK(si >= 3  ? seen == 8
                        : si == 0 ? seen == (T <= 4 ? 21 : 20)
                        : si == 1 ? seen == (T <= 4 ? 1 : 0)
                                  : seen == (T <= 4 ? 1 : 2));
            }
            /* the linears' and absorptions' programs with the default cap */
            if (kn == 0 && si < 3 && n_jobs < MAX_JOBS && !prog.oom && !names.oom) {
                compile_job *j = &jobs[n_jobs++];
                memset(j, 0, sizeof *j);
                j->label = strdup(specs[si]->name);
                j->src = prog.data;
                j->names = names;
            } else {
                moec_buf_free(&prog);
                moec_buf_free(&names);
            }
            ir_module_free(m);
        }
        unsetenv("MOEC_PREFETCH_KB");
        unsetenv("MOEC_NORM_WPRE");
    }
}

/* cg_add_pdl_waits: the wait goes first in every kernel body, nowhere else,
 * but where the body places its own (k3, after its prefetch); MOEC_PDL_EARLY
 * puts the trigger first in the kernels it names. */
static void test_pdl_waits(void)
{
    moec_buf b = {0};
    moec_buf_printf(&b, "__device__ int f() { return 1; }\n"
                      "// k1\nextern \"C\" __global__ void __launch_bounds__(256)\nk1(int *x)\n{\n"
                      "    x[0] = f();\n}\n\n"
                      "extern \"C\" __global__ void __launch_bounds__(64) k2(int *x)\n{\n"
                      "    if (x) { x[1] = 2; }\n}\n"
                      "extern \"C\" __global__ void k3(const int *w)\n{\n"
                      "    moec_prefetch_l2(w, 64);\n    moec_pdl_enter();\n}\n");
    cg_add_pdl_waits(&b);
    T_CHECK(!b.oom && b.data);
    if (b.data)
        T_CHECK(!strcmp(b.data, "__device__ int f() { return 1; }\n"
                                "// k1\nextern \"C\" __global__ void __launch_bounds__(256)\nk1(int *x)\n{"
                                "\n    moec_pdl_enter();\n    x[0] = f();\n}\n\n"
                                "extern \"C\" __global__ void __launch_bounds__(64) k2(int *x)\n{"
                                "\n    moec_pdl_enter();\n    if (x) { x[1] = 2; }\n}\n"
                                "extern \"C\" __global__ void k3(const int *w)\n{\n"
                                "    moec_prefetch_l2(w, 64);\n    moec_pdl_enter();\n}\n"));
    moec_buf_free(&b);
    /* MOEC_PDL_EARLY: the kernels whose names begin with a listed prefix
       trigger first, before their wait or prefetch (names on their own
       line, after cluster dims, or a prefix longer than the name: none) */
    moec_buf_printf(&b, "extern \"C\" __global__ void __cluster_dims__(8, 1, 1) "
                        "__launch_bounds__(32)\nadd_x(int *x)\n{\n    x[0] = 1;\n}\n"
                        "extern \"C\" __global__ void comb_y(const int *w)\n{\n"
                        "    moec_prefetch_l2(w, 64);\n    moec_pdl_enter();\n}\n"
                        "extern \"C\" __global__ void add(int *x)\n{\n}\n"
                        "extern \"C\" __global__ void other(int *x)\n{\n}\n");
    setenv("MOEC_PDL_EARLY", "add_+comb", 1);
    cg_add_pdl_waits(&b);
    unsetenv("MOEC_PDL_EARLY");
    T_CHECK(!b.oom && b.data);
    if (b.data)
        T_CHECK(!strcmp(b.data, "extern \"C\" __global__ void __cluster_dims__(8, 1, 1) "
                                "__launch_bounds__(32)\nadd_x(int *x)\n{\n    moec_pdl_trigger();\n"
                                "    moec_pdl_enter();\n    x[0] = 1;\n}\n"
                                "extern \"C\" __global__ void comb_y(const int *w)\n{\n"
                                "    moec_pdl_trigger();\n"
                                "    moec_prefetch_l2(w, 64);\n    moec_pdl_enter();\n}\n"
                                "extern \"C\" __global__ void add(int *x)\n{\n    moec_pdl_enter();\n}\n"
                                "extern \"C\" __global__ void other(int *x)\n{\n    moec_pdl_enter();\n}\n"));
    moec_buf_free(&b);
}

int main(void)
{
    test_pdl_waits();
    test_prefetch();
    test_real_shapes();
    test_odd_shapes();
    test_fp8_shapes();
    test_gv_forms();
    test_prologue();
    test_gqa_prologue();
    test_dsa_fused();
    test_tiny_models();
    test_errors();
    test_argmax_nonfinite();
    test_norm_cluster();
    test_linear_mma();
    test_sampler();
    compile_all();
    return t_finish("test_codegen_kernels");
}
