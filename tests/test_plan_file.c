/* test_plan_file.c — plan files: a written plan reads back field for field,
 * and every damaged or foreign plan is refused with its own error: not a
 * plan, truncated anywhere, a flipped byte, a newer format version, a header
 * that is not JSON, a step that points nowhere, another checkpoint. */
#include <string.h>

#include "compiler/frontend.h"
#include "runtime/plan_file.h"
#include "testlib.h"

static const char *IR_TEXT =
    "module tiny {\n"
    "  meta vocab_size = 8\n"
    "  input %tokens : i32[T]\n"
    "  input %positions : i32[T]\n"
    "  weight %emb : bf16[8, 4] = \"model.embed_tokens.weight\"\n"
    "  %x : f32[T, 4] = embedding(%tokens, %emb)\n"
    "  %y : f32[T, 8] = linear(%x, %emb)\n"
    "  output %y\n"
    "}\n";

/* A plan with two buckets, a kernel step and a GEMM step. */
static rt_plan *make_plan(ir_module *m)
{
    rt_plan *p = calloc(1, sizeof *p);
    p->module = m;
    p->compute_dtype = IR_DTYPE_BF16;
    snprintf(p->arch, sizeof p->arch, "sm_90");
    p->kv_block_size = 64;
    p->pdl = 1;
    p->n_buckets = 2;
    p->buckets = calloc(2, sizeof *p->buckets);
    for (int b = 0; b < 2; b++) {
        rt_bucket *bk = &p->buckets[b];
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
        rt_step *k = &bk->steps[0];
        k->kind = RT_STEP_KERNEL;
        k->op_id = 0;
        k->grid[0] = (unsigned)bk->T;
        k->grid[1] = k->grid[2] = 1;
        k->block[0] = 128;
        k->block[1] = k->block[2] = 1;
        k->smem = 64;
        k->n_args = 3;
        k->args[0] = (rt_arg){RT_ARG_INPUT, RT_INPUT_TOKENS, 0, 0};
        k->args[1] = (rt_arg){RT_ARG_WEIGHT, 2, 0, 0};
        k->args[2] = (rt_arg){RT_ARG_F32, 0, 0, 0.125};
        rt_step *g = &bk->steps[1];
        g->kind = RT_STEP_GEMM;
        g->stream = 1;
        g->op_id = 1;
        g->gemm = (rt_gemm){1, 0, 8, bk->T, 4, 1, 4, 4, 8, 0, 0, 0, IR_DTYPE_BF16, IR_DTYPE_BF16,
                            IR_DTYPE_F32, 0.5f, {RT_ARG_WEIGHT, 2, 0, 0}, {RT_ARG_ACT, 3, 0, 0},
                            {RT_ARG_ACT, 4, 0, 0}, 0, {RT_ARG_I32, 0, -5, 0}, IR_DTYPE_F32};
        bk->arena_bytes = 48 * (size_t)bk->T;
        bk->scratch_bytes = 16;
    }
    return p;
}

static void check_same(const rt_plan *a, const rt_plan *b)
{
    T_CHECK(!strcmp(a->arch, b->arch) && a->compute_dtype == b->compute_dtype &&
            a->kv_block_size == b->kv_block_size && a->pdl == b->pdl &&
            a->n_buckets == b->n_buckets);
    for (int i = 0; i < a->n_buckets && i < b->n_buckets; i++) {
        const rt_bucket *x = &a->buckets[i], *y = &b->buckets[i];
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
    rt_plan *p = NULL;
    ir_module *m = NULL;
    rt_plan_meta meta;
    T_ERR(rt_plan_read(path, &p, &m, &meta), st, needle);
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

/* The plan good (n bytes) with the first `from` in its header text
 * rewritten in place to `to` (as long), resealed, is refused with needle. */
static void expect_rewrite_error(const uint8_t *good, size_t n, const char *bad, const char *from,
                                 const char *to, const char *needle)
{
    uint8_t *d = malloc(n);
    memcpy(d, good, n);
    char *at = strstr((char *)d + 24, from);
    T_CHECK(at != NULL && strlen(from) == strlen(to));
    if (at) {
        memcpy(at, to, strlen(to));
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
    rt_plan *p = make_plan(m);
    rt_plan_meta meta = {RT_PLAN_FORMAT, "0123456789abcdef", "fedcba9876543210", ""};
    T_OK(rt_plan_write(path, p, &meta));

    rt_plan *q = NULL;
    ir_module *qm = NULL;
    rt_plan_meta qmeta;
    T_OK(rt_plan_read(path, &q, &qm, &qmeta));
    if (q) {
        check_same(p, q);
        T_CHECK(!strcmp(qmeta.config_hash, meta.config_hash) &&
                !strcmp(qmeta.weights_hash, meta.weights_hash) && qmeta.format == RT_PLAN_FORMAT);
        rt_plan_free(q);
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
    d[8] = RT_PLAN_FORMAT + 1;
    reseal(d, n);
    t_write_file(bad, d, n);
    expect_read_error(bad, MOEC_ERR_UNSUPPORTED, "has format version 2; this moec reads version 1");
    /* A header that is not JSON. */
    memcpy(d, good, n);
    d[24] = '!';
    reseal(d, n);
    t_write_file(bad, d, n);
    expect_read_error(bad, MOEC_ERR_FORMAT, "the header is not JSON");
    free(d);
    /* A step pointing at a kernel that does not exist: "kernel" of the first
     * step is its 4th number. */
    expect_rewrite_error(good, n, bad, "\"steps\":[[0,0,0,0,", "\"steps\":[[0,0,0,7,",
                         "a step refers to something that does not exist");
    /* Numbers no field holds, which the reader once converted regardless
     * (undefined behaviour; found writing fuzz_plan_file): 9e9 threads a block,
     * 1.5 threads, -9 arena bytes. */
    expect_rewrite_error(good, n, bad, ",1,1,1,128,1,1,", ",1,1,1,9e9,1,1,",
                         "bad.moec is corrupt: a number is out of range or not whole");
    expect_rewrite_error(good, n, bad, ",1,1,1,128,1,1,", ",1,1,1,1.5,1,1,",
                         "is corrupt: a number is out of range or not whole");
    expect_rewrite_error(good, n, bad, "\"arena_bytes\":48,", "\"arena_bytes\":-9,",
                         "is corrupt: a number is out of range or not whole");
    free(good);
    expect_read_error("/nonexistent/x.moec", MOEC_ERR_IO, "/nonexistent/x.moec");

    /* Checkpoint hashes: the same model agrees with itself, another does not. */
    ir_module *v3 = NULL;
    T_OK(fe_model_load(t_src("tests/data/deepseek_v3"), &v3));
    if (v3) {
        rt_plan_meta mine = {RT_PLAN_FORMAT, "", "", ""};
        T_OK(rt_hash_config(t_src("tests/data/deepseek_v3"), mine.config_hash));
        T_OK(rt_hash_weights(v3, t_src("tests/data/deepseek_v3"), mine.weights_hash));
        T_OK(rt_plan_check_checkpoint(&mine, v3, path, t_src("tests/data/deepseek_v3")));
        T_ERR(rt_plan_check_checkpoint(&mine, v3, path, t_src("tests/data/qwen3_moe")),
              MOEC_ERR_MISMATCH, "was compiled for another config");
        rt_plan_meta other = mine;
        other.weights_hash[0] = other.weights_hash[0] == '0' ? '1' : '0';
        T_ERR(rt_plan_check_checkpoint(&other, v3, path, t_src("tests/data/deepseek_v3")),
              MOEC_ERR_MISMATCH, "was compiled for another checkpoint");
        ir_module_free(v3);
    }
    rt_plan_free(p);
    ir_module_free(m);
    return t_finish("test_plan_file");
}
