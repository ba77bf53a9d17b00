/* test_plan_file.c — plan files: a written plan reads back field for field,
 * and every damaged or foreign plan is refused with its own error: not a
 * plan, truncated anywhere, a flipped byte, a newer format version, a header
 * that is not JSON, a step that points nowhere, another checkpoint. */
#include <string.h>
#include <sys/stat.h>

#include "compiler/frontend.h"
#include "runtime/plan_check.h"
#include "testlib.h"

static const char *IR_TEXT =
    "module tiny {\n"
    "  meta vocab_size = 8\n"
    "  meta eos_token_id = [1, 2]\n"
    "  input %tokens : i32[T]\n"
    "  input %positions : i32[T]\n"
    "  weight %emb : bf16[8, 4] = \"model.embed_tokens.weight\"\n"
    "  %x : f32[T, 4] = embedding(%tokens, %emb)\n"
    "  %y : f32[T, 8] = linear(%x, %emb)\n"
    "  output %y\n"
    "}\n";

/* A plan with two buckets, a kernel step and a GEMM step. */
static ir_plan *make_plan(ir_module *m)
{
    ir_plan *p = calloc(1, sizeof *p);
    p->module = m;
    p->compute_dtype = IR_DTYPE_BF16;
    snprintf(p->arch, sizeof p->arch, "sm_90");
    p->kv_block_size = 64;
    p->pdl = 1;
    p->n_buckets = 2;
    p->buckets = calloc(2, sizeof *p->buckets);
    for (int b = 0; b < 2; b++) {
        ir_bucket *bk = &p->buckets[b];
        bk->T = b ? 8 : 1;
        bk->cubin_size = 37 + (size_t)b * 100;
        bk->cubin = malloc(bk->cubin_size);
        for (size_t i = 0; i < bk->cubin_size; i++)
            ((uint8_t *)bk->cubin)[i] = (uint8_t)(i * 7 + (size_t)b);
        bk->n_kernels = 1;
        bk->kernel_names = calloc(1, sizeof *bk->kernel_names);
        bk->kernel_names[0] = strdup(b ? "embedding_v8_h4_t8_bf16" : "embedding_v8_h4_t1_bf16");
        bk->n_steps = 2;
        bk->steps = calloc(2, sizeof *bk->steps);
        ir_step *k = &bk->steps[0];
        k->kind = IR_STEP_KERNEL;
        k->op_id = 0;
        k->grid[0] = (unsigned)bk->T;
        k->grid[1] = k->grid[2] = 1;
        k->block[0] = 128;
        k->block[1] = k->block[2] = 1;
        k->smem = 64;
        k->n_args = 3;
        k->args[0] = (ir_arg){IR_ARG_INPUT, IR_INPUT_TOKENS, 0, 0};
        k->args[1] = (ir_arg){IR_ARG_WEIGHT, 2, 0, 0};
        k->args[2] = (ir_arg){IR_ARG_F32, 0, 0, 0.125};
        ir_step *g = &bk->steps[1];
        g->kind = IR_STEP_GEMM;
        g->stream = 1;
        g->op_id = 1;
        g->gemm = (ir_gemm){1, 0, 8, bk->T, 4, 1, 4, 4, 8, 0, 0, 0, IR_DTYPE_BF16, IR_DTYPE_BF16,
                            IR_DTYPE_F32, 0.5f, {IR_ARG_WEIGHT, 2, 0, 0}, {IR_ARG_ACT, 3, 0, 0},
                            {IR_ARG_ACT, 4, 0, 0}, 0, {IR_ARG_I32, 0, -5, 0}, IR_DTYPE_F32};
        bk->arena_bytes = 48 * (size_t)bk->T;
        bk->scratch_bytes = 16;
    }
    return p;
}

static void check_same(const ir_plan *a, const ir_plan *b)
{
    T_CHECK(!strcmp(a->arch, b->arch) && a->compute_dtype == b->compute_dtype &&
            a->kv_block_size == b->kv_block_size && a->pdl == b->pdl &&
            a->n_buckets == b->n_buckets);
    for (int i = 0; i < a->n_buckets && i < b->n_buckets; i++) {
        const ir_bucket *x = &a->buckets[i], *y = &b->buckets[i];
        T_CHECK(x->T == y->T && x->cubin_size == y->cubin_size &&
                !memcmp(x->cubin, y->cubin, x->cubin_size) && x->n_kernels == y->n_kernels &&
                !strcmp(x->kernel_names[0], y->kernel_names[0]) && x->n_steps == y->n_steps &&
                x->arena_bytes == y->arena_bytes && x->scratch_bytes == y->scratch_bytes);
        for (int s = 0; s < x->n_steps && s < y->n_steps; s++)
            T_CHECK(!memcmp(&x->steps[s], &y->steps[s], sizeof x->steps[s]));
    }
    char *ta = ir_module_print_str(a->module), *tb = ir_module_print_str(b->module);
    T_CHECK(ta && tb && !strcmp(ta, tb));
    free(ta);
    free(tb);
}

static void expect_read_error(const char *path, moec_status st, const char *needle)
{
    ir_plan *p = NULL;
    ir_module *m = NULL;
    ir_plan_meta meta;
    T_ERR(ir_plan_read(path, &p, &m, &meta), st, needle);
    T_CHECK(p == NULL && m == NULL);
}

static uint64_t fnv(const uint8_t *d, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ d[i]) * 0x100000001b3ull;
    return h;
}

/* Rewrites the trailing checksum so that only the intended damage shows. */
static void reseal(uint8_t *d, size_t n)
{
    uint64_t h = fnv(d, n - 8);
    memcpy(d + n - 8, &h, 8);
}

/* Writes the plan image good[0, n) to bad with the first `find` of its
 * header overwritten, just after its text `after`, by repl (no longer than
 * what it covers), resealed; expects a FORMAT error with needle. */
static void expect_header_edit(const uint8_t *good, size_t n, const char *bad, const char *find,
                               const char *after, const char *repl, const char *needle)
{
    uint8_t *d = malloc(n);
    memcpy(d, good, n);
    char *hit = strstr((char *)d + 24, find);
    char *at = hit ? strstr(hit, after) : NULL;
    T_CHECK(at != NULL);
    if (at) {
        memcpy(at + strlen(after), repl, strlen(repl));
        reseal(d, n);
        t_write_file(bad, d, n);
        expect_read_error(bad, MOEC_ERR_FORMAT, needle);
    }
    free(d);
}

int main(void)
{
    const char *dir = t_tmpdir("plan");
    char path[4096], bad[4096];
    snprintf(path, sizeof path, "%s/model.moec", dir);
    snprintf(bad, sizeof bad, "%s/bad.moec", dir);

    ir_module *m = NULL;
    T_OK(ir_module_parse(IR_TEXT, "tiny.mir", &m));
    if (!m)
        return t_finish("test_plan_file");
    ir_plan *p = make_plan(m);
    ir_plan_meta meta = {IR_PLAN_FORMAT, "0123456789abcdef", "fedcba9876543210", ""};
    T_OK(ir_plan_write(path, p, &meta));

    ir_plan *q = NULL;
    ir_module *qm = NULL;
    ir_plan_meta qmeta;
    T_OK(ir_plan_read(path, &q, &qm, &qmeta));
    if (q) {
        check_same(p, q);
        /* The eos ids are the module's, in the plan's IR. */
        const int64_t *eos;
        T_CHECK(ir_module_meta_ints(q->module, "eos_token_id", &eos) == 2 && eos[0] == 1 &&
                eos[1] == 2);
        T_CHECK(!strcmp(qmeta.config_hash, meta.config_hash) &&
                !strcmp(qmeta.weights_hash, meta.weights_hash) && qmeta.format == IR_PLAN_FORMAT);
        ir_plan_free(q);
    }
    ir_module_free(qm);

    size_t n;
    uint8_t *good = (uint8_t *)t_read_file(path, &n);

    /* Not a plan at all. */
    t_write_file(bad, "{\"hello\": 1}", 12);
    expect_read_error(bad, MOEC_ERR_FORMAT, "is not a moec plan");
    /* Truncated at many points. */
    for (size_t cut = 8; cut < n; cut += n / 23 + 1) {
        t_write_file(bad, good, cut);
        expect_read_error(bad, MOEC_ERR_FORMAT, "bad.moec");
    }
    t_write_file(bad, good, n - 1);
    expect_read_error(bad, MOEC_ERR_FORMAT, "checksum mismatch");
    /* A flipped byte in a cubin. */
    uint8_t *d = malloc(n);
    memcpy(d, good, n);
    d[n - 20] ^= 0x40;
    t_write_file(bad, d, n);
    expect_read_error(bad, MOEC_ERR_FORMAT, "corrupt or truncated (checksum mismatch)");
    /* A newer format version. */
    memcpy(d, good, n);
    d[8] = IR_PLAN_FORMAT + 1;
    reseal(d, n);
    t_write_file(bad, d, n);
    expect_read_error(bad, MOEC_ERR_UNSUPPORTED, "has format version 2; this moec reads version 1");
    /* A header that is not JSON. */
    memcpy(d, good, n);
    d[24] = '!';
    reseal(d, n);
    t_write_file(bad, d, n);
    expect_read_error(bad, MOEC_ERR_FORMAT, "the header is not JSON");
    /* A step pointing at a kernel that does not exist: "kernel" of the first
     * step is its 4th number; rewrite the header text in place. */
    memcpy(d, good, n);
    char *hdr = (char *)d + 24;
    char *steps = strstr(hdr, "\"steps\":[[0,0,0,0,");
    T_CHECK(steps != NULL);
    if (steps) {
        steps[strlen("\"steps\":[[0,0,0,")] = '7';
        reseal(d, n);
        t_write_file(bad, d, n);
        expect_read_error(bad, MOEC_ERR_FORMAT, "a step refers to something that does not exist");
    }
    /* A step field that is not an integer: block[0] (128) of the first step. */
    expect_header_edit(good, n, bad, "\"steps\":[[0,0,0,0,1,1,1,128,", "1,1,1,", "1.5",
                       "is corrupt: a step field is 1.5, not an integer in [0, 4294967295]");
    /* A key twice in the header: "arch" renamed "moec". */
    expect_header_edit(good, n, bad, "\"arch\":", "", "\"moec\"",
                       "bad.moec: key \"moec\" appears twice");
    /* Integers out of range are reported as the file has them, never wrapped:
     * a bucket's arena -1. */
    expect_header_edit(good, n, bad, "\"arena_bytes\":48", ":", "-1",
                       "header field 'arena_bytes' is -1, not an integer in [0, "
                       "9007199254740992]");
    /* A number no field holds (found writing fuzz_plan_file): 9e9 threads a
     * block, reported as the file has it. */
    expect_header_edit(good, n, bad, "\"steps\":[[0,0,0,0,1,1,1,128,", "1,1,1,", "9e9",
                       "is corrupt: a step field is ");
    free(d);
    free(good);
    expect_read_error("/nonexistent/x.moec", MOEC_ERR_IO, "/nonexistent/x.moec");

    /* kv_block_size 12345 rewritten 1e+30 (it was reported wrapped to int). */
    p->kv_block_size = 12345;
    T_OK(ir_plan_write(bad, p, &meta));
    p->kv_block_size = 64;
    d = (uint8_t *)t_read_file(bad, &n);
    char want[4400];
    snprintf(want, sizeof want,
             "plan %s is corrupt: header field 'kv_block_size' is 1e+30, not an integer in "
             "[1, 2147483647]",
             bad);
    expect_header_edit(d, n, bad, "\"kv_block_size\":12345", ":", "1e+30", want);
    free(d);
    /* A FIFO in place of a plan is refused, not waited on. */
    remove(bad);
    T_CHECK(mkfifo(bad, 0600) == 0);
    expect_read_error(bad, MOEC_ERR_IO, "bad.moec is not a regular file (it is a FIFO)");
    remove(bad);

    /* Checkpoint hashes: the same model agrees with itself, another does not. */
    ir_module *v3 = NULL;
    T_OK(fe_model_load(t_src("tests/data/deepseek_v3"), &v3));
    if (v3) {
        ir_plan_meta mine = {IR_PLAN_FORMAT, "", "", ""};
        T_OK(rt_hash_config(t_src("tests/data/deepseek_v3"), mine.config_hash));
        T_OK(rt_hash_weights(v3, t_src("tests/data/deepseek_v3"), mine.weights_hash));
        T_OK(rt_plan_check_checkpoint(&mine, v3, path, t_src("tests/data/deepseek_v3")));
        T_ERR(rt_plan_check_checkpoint(&mine, v3, path, t_src("tests/data/qwen3_moe")),
              MOEC_ERR_MISMATCH, "was compiled for another config");
        /* generation_config.json (its eos ids) is part of the config hash:
         * a folder without one hashes as config.json alone always did. */
        const char *gdir = t_tmpdir("plan-gen");
        char cfg[4200], gen[4200], h[17];
        snprintf(cfg, sizeof cfg, "%s/config.json", gdir);
        snprintf(gen, sizeof gen, "%s/generation_config.json", gdir);
        size_t cn;
        char *ctext = t_read_file(t_src("tests/data/deepseek_v3/config.json"), &cn);
        t_write_file(cfg, ctext, cn);
        free(ctext);
        T_OK(rt_hash_config(gdir, h));
        T_CHECK(!strcmp(h, mine.config_hash));
        t_write_file(gen, "{\"eos_token_id\": [1, 2]}", 24);
        T_OK(rt_hash_config(gdir, h));
        T_CHECK(strcmp(h, mine.config_hash) != 0);
        T_ERR(rt_plan_check_checkpoint(&mine, v3, path, gdir), MOEC_ERR_MISMATCH,
              "was compiled for another config");
        remove(gen);
        T_CHECK(mkfifo(gen, 0600) == 0);
        T_ERR(rt_hash_config(gdir, h), MOEC_ERR_IO,
              "generation_config.json is not a regular file (it is a FIFO)");
        remove(gen);
        remove(cfg);
        remove(gdir);
        ir_plan_meta other = mine;
        other.weights_hash[0] = other.weights_hash[0] == '0' ? '1' : '0';
        T_ERR(rt_plan_check_checkpoint(&other, v3, path, t_src("tests/data/deepseek_v3")),
              MOEC_ERR_MISMATCH, "was compiled for another checkpoint");
        ir_module_free(v3);
    }
    /* An fp8 checkpoint's hash covers its scale tensors: a weight bound to
     * other scales hashes differently, and missing ones are named. */
    ir_module *f8 = NULL;
    const char *f8dir = t_src("tests/data/deepseek_v3_fp8");
    T_OK(fe_model_load(f8dir, &f8));
    ir_value *o = f8 ? ir_module_find_value(f8, "l0.attn.o_proj") : NULL;
    T_CHECK(o && o->scale.block[0] == 128 && o->scale.bind.kind == IR_BIND_TENSOR);
    if (o) {
        char h1[17], h2[17];
        T_OK(rt_hash_weights(f8, f8dir, h1));
        const char *kept = o->scale.bind.name;
        o->scale.bind.name = "model.layers.1.self_attn.o_proj.weight_scale_inv";
        T_OK(rt_hash_weights(f8, f8dir, h2));
        T_CHECK(strcmp(h1, h2) != 0);
        o->scale.bind.name = "model.layers.0.self_attn.o_proj.no_scale";
        T_ERR(rt_hash_weights(f8, f8dir, h2), MOEC_ERR_MISMATCH,
              "tensor 'model.layers.0.self_attn.o_proj.no_scale' not found in");
        o->scale.bind.name = kept;
        T_OK(rt_hash_weights(f8, f8dir, h2));
        T_CHECK(!strcmp(h1, h2));
    }
    ir_module_free(f8);
    ir_plan_free(p);
    ir_module_free(m);
    return t_finish("test_plan_file");
}
