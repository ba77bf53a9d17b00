/* test_plan_file.c — plan files: a written plan reads back field for field,
 * and every damaged or foreign plan is refused with its own error: not a
 * plan, truncated anywhere, a flipped byte, a newer format version, a header
 * that is not JSON, a step that points nowhere, another checkpoint. Plans
 * split over ranks (format 2): a plan per rank with its collective steps,
 * identical cubins stored once, each rank's IR checked to be its rank's;
 * a format 1 file (one plan, no ranks, no sampler) still reads. */
#include <cjson/cJSON.h>
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
    p->sampler = 1;
    p->fp8_tiles = IR_FP8_TILES_DOWN | IR_FP8_TILES_LINEAR;
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
        k->plain = b; /* launched plainly in the second bucket */
        k->prio = !b; /* at the greatest priority in the first */
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

/* IR_TEXT as rank r of tp 2 (ep 1): metas and the embedding's vocab_start. */
static ir_module *rank_module(int r)
{
    char text[1024];
    snprintf(text, sizeof text,
             "module tiny {\n  meta vocab_size = 8\n  meta tp = 2\n  meta ep = 1\n"
             "  meta rank = %d\n  input %%tokens : i32[T]\n  input %%positions : i32[T]\n"
             "  weight %%emb : bf16[4, 4] = \"model.embed_tokens.weight\"[%d:%d, :]\n"
             "  %%x : f32[T, 4] = embedding(%%tokens, %%emb) {vocab_start = %d, vocab_size = 8}\n"
             "  %%s : f32[T, 4] = all_reduce(%%x) {ranks = 2}\n  output %%s\n}\n",
             r, 4 * r, 4 * r + 4, 4 * r);
    ir_module *m = NULL;
    T_OK(ir_module_parse(text, "rank.mir", &m));
    return m;
}

static void check_same(const ir_plan *a, const ir_plan *b)
{
    T_CHECK(!strcmp(a->arch, b->arch) && a->compute_dtype == b->compute_dtype &&
            a->kv_block_size == b->kv_block_size && a->pdl == b->pdl &&
            a->sampler == b->sampler && a->fp8_tiles == b->fp8_tiles &&
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

/* Each step of the buckets in array `buckets` without its items from
 * `from` (12: prio; 11: plain too). */
static void drop_step_items(cJSON *buckets, int from)
{
    cJSON *bk, *st;
    cJSON_ArrayForEach(bk, buckets)
        cJSON_ArrayForEach(st, cJSON_GetObjectItem(bk, "steps"))
            for (int i = 12; i >= from; i--)
                cJSON_DeleteItemFromArray(st, i);
}

/* A copy of the file image d[0, n) of one plan in an older layout: format
 * 1, "ir" and "buckets" at the top of the header, no tp, ep, ranks,
 * sampler, steps of 13 items (no plain, no prio); format 4, steps of 14
 * (no prio). */
static uint8_t *as_format(const uint8_t *d, size_t n, size_t *out_n, uint32_t fmt)
{
    uint64_t hlen;
    memcpy(&hlen, d + 16, 8);
    size_t base = (24 + (size_t)hlen + 15) & ~(size_t)15;
    cJSON *h = cJSON_ParseWithLength((const char *)d + 24, (size_t)hlen);
    if (fmt == 1) {
        cJSON *rank0 = cJSON_DetachItemFromArray(cJSON_GetObjectItem(h, "ranks"), 0);
        cJSON_DeleteItemFromObject(h, "ranks");
        cJSON_DeleteItemFromObject(h, "tp");
        cJSON_DeleteItemFromObject(h, "ep");
        cJSON_DeleteItemFromObject(h, "sampler");
        cJSON_DeleteItemFromObject(h, "fp8_tiles");
        cJSON_AddItemToObject(h, "ir", cJSON_DetachItemFromObject(rank0, "ir"));
        cJSON *buckets = cJSON_DetachItemFromObject(rank0, "buckets");
        drop_step_items(buckets, 11);
        cJSON_AddItemToObject(h, "buckets", buckets);
        cJSON_Delete(rank0);
    } else {
        cJSON *rank;
        cJSON_ArrayForEach(rank, cJSON_GetObjectItem(h, "ranks"))
            drop_step_items(cJSON_GetObjectItem(rank, "buckets"), 12);
    }
    cJSON_ReplaceItemInObject(h, "format", cJSON_CreateNumber(fmt));
    char *text = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    uint64_t nl = strlen(text);
    size_t nbase = (24 + (size_t)nl + 15) & ~(size_t)15, blobs = n - 8 - base;
    *out_n = nbase + blobs + 8;
    uint8_t *o = calloc(1, *out_n);
    memcpy(o, d, 8);
    memcpy(o + 8, &fmt, 4);
    memcpy(o + 16, &nl, 8);
    memcpy(o + 24, text, nl);
    memcpy(o + nbase, d + base, blobs);
    free(text);
    reseal(o, *out_n);
    return o;
}

/* Plans of two ranks in one file, and the format 1 layout. */
static void test_rank_plans(const char *dir, const ir_plan *single)
{
    char path[4096], bad[4096];
    snprintf(path, sizeof path, "%s/ranks.moec", dir);
    snprintf(bad, sizeof bad, "%s/bad_ranks.moec", dir);
    ir_module *mods[2] = {rank_module(0), rank_module(1)};
    if (!mods[0] || !mods[1])
        return;
    ir_plan *plans[2] = {make_plan(mods[0]), make_plan(mods[1])};
    /* a collective step in rank 1's first bucket */
    ir_step *st = &plans[1]->buckets[0].steps[1];
    memset(st, 0, sizeof *st);
    st->kind = IR_STEP_COLLECTIVE;
    st->op_id = 1;
    st->grid[0] = st->grid[1] = st->grid[2] = st->block[0] = st->block[1] = st->block[2] = 1;
    st->coll = (ir_coll){IR_OP_ALL_REDUCE, IR_DTYPE_BF16, 4, 2, {IR_ARG_ACT, 4, 0, 0},
                         {IR_ARG_ACT, 5, 0, 0}};
    ir_plan_meta meta = {IR_PLAN_FORMAT, "0123456789abcdef", "fedcba9876543210", "", 2, 1};
    T_ERR(ir_plan_write(path, plans[0], &meta), MOEC_ERR_INVALID_ARG,
          "ir_plan_write: one plan for tp 2");
    T_OK(ir_plan_write_ranks(path, (const ir_plan *const *)plans, &meta));
    ir_plan *back[IR_MAX_RANKS];
    ir_module *bm[IR_MAX_RANKS];
    ir_plan_meta bmeta;
    T_OK(ir_plan_read_ranks(path, back, bm, &bmeta));
    T_CHECK(bmeta.tp == 2 && bmeta.ep == 1 && ir_plan_meta_ranks(&bmeta) == 2);
    for (int r = 0; r < 2 && back[0]; r++) {
        check_same(plans[r], back[r]);
        T_CHECK(ir_module_meta_int(bm[r], "rank", -1) == r);
        ir_plan_free(back[r]);
        ir_module_free(bm[r]);
    }
    /* the ranks' cubins are alike (make_plan's): stored once, so the file
     * is the one-rank file plus the second rank's IR and header part */
    struct stat sa, sb;
    char one[4200];
    snprintf(one, sizeof one, "%s/one.moec", dir);
    ir_plan_meta meta1 = meta;
    meta1.tp = 0;
    meta1.ep = 0;
    ir_module *plain = NULL;
    T_OK(ir_module_parse(IR_TEXT, "tiny.mir", &plain));
    T_OK(ir_plan_write(one, single, &meta1));
    T_CHECK(stat(path, &sa) == 0 && stat(one, &sb) == 0 && sa.st_size < sb.st_size + 2048 &&
            sa.st_size > sb.st_size);
    /* the header's tp and the ranks' IR must agree */
    ir_plan_meta liar = meta;
    liar.tp = 1;
    ir_plan *solo[1] = {plans[1]};
    T_OK(ir_plan_write_ranks(bad, (const ir_plan *const *)solo, &liar));
    T_ERR(ir_plan_read_ranks(bad, back, bm, &bmeta), MOEC_ERR_FORMAT,
          "the IR of rank 0 is not rank 0 of tp 1 ep 1");
    T_CHECK(back[0] == NULL && bm[0] == NULL);
    size_t n;
    uint8_t *good = (uint8_t *)t_read_file(path, &n);
    expect_header_edit(good, n, bad, "\"tp\":2", ":", "3", "the ranks' plans do not match tp");
    expect_header_edit(good, n, bad, "\"ep\":1", ":", "3", "ep does not divide tp");
    /* the collective step's op made add_rms_norm (not a collective) */
    char coll[32], other[32];
    snprintf(coll, sizeof coll, "[%d,%d,4,2,", (int)IR_OP_ALL_REDUCE, (int)IR_DTYPE_BF16);
    snprintf(other, sizeof other, "[%d,%d,4,2,", (int)IR_OP_ADD_RMS_NORM, (int)IR_DTYPE_BF16);
    expect_header_edit(good, n, bad, coll, "", other,
                       "a collective step is none of all_reduce, all_gather, reduce_scatter, all_to_all");
    free(good);
    /* a one-plan reader refuses a split plan by name */
    ir_plan *p1 = NULL;
    ir_module *m1 = NULL;
    T_ERR(ir_plan_read(path, &p1, &m1, &bmeta), MOEC_ERR_UNSUPPORTED,
          "ranks.moec is split over 2 ranks (tp 2, ep 1)");
    /* format 1: one plan at the top of the header, still read; format 4:
       steps without prio, still read */
    good = (uint8_t *)t_read_file(one, &n);
    for (uint32_t fmt = 1; fmt <= 4; fmt += 3) {
        size_t n1;
        uint8_t *f1 = as_format(good, n, &n1, fmt);
        t_write_file(bad, f1, n1);
        T_OK(ir_plan_read(bad, &p1, &m1, &bmeta));
        T_CHECK(bmeta.format == (int)fmt && bmeta.tp == 0 && p1);
        if (p1) {
            /* format 1: no device sampler (its requests sample on the
               host), every kernel as the plan's pdl says; none at the
               greatest priority */
            T_CHECK(fmt != 1 || (p1->sampler == 0 && p1->fp8_tiles == 0));
            p1->sampler = single->sampler;
            p1->fp8_tiles = single->fp8_tiles;
            for (int b = 0; b < p1->n_buckets && b < single->n_buckets; b++)
                for (int s = 0; s < p1->buckets[b].n_steps && s < single->buckets[b].n_steps;
                     s++) {
                    ir_step *x = &p1->buckets[b].steps[s];
                    const ir_step *y = &single->buckets[b].steps[s];
                    T_CHECK((fmt == 1 ? x->plain == 0 : x->plain == y->plain) && x->prio == 0);
                    x->plain = y->plain;
                    x->prio = y->prio;
                }
            check_same(single, p1);
        }
        ir_plan_free(p1);
        ir_module_free(m1);
        p1 = NULL;
        m1 = NULL;
        free(f1);
    }
    free(good);
    remove(bad);
    remove(one);
    remove(path);
    for (int r = 0; r < 2; r++) {
        ir_plan_free(plans[r]);
        ir_module_free(mods[r]);
    }
    ir_module_free(plain);
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
    ir_plan_meta meta = {IR_PLAN_FORMAT, "0123456789abcdef", "fedcba9876543210", "", 0, 0};
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
    expect_read_error(bad, MOEC_ERR_UNSUPPORTED, "has format version 8; this moec reads version 7");
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
    /* plain (the twelfth number) is 0 or 1: the second bucket's first step;
       prio (the thirteenth) too: the first bucket's */
    expect_header_edit(good, n, bad, "\"steps\":[[0,0,0,0,8,1,1,128,1,1,64,", "64,", "2",
                       "is corrupt: a step field is 2, not an integer in [0, 1]");
    expect_header_edit(good, n, bad, "\"steps\":[[0,0,0,0,1,1,1,128,1,1,64,0,", "64,0,", "2",
                       "is corrupt: a step field is 2, not an integer in [0, 1]");
    /* fp8_tiles is 0 to 7 (IR_FP8_TILES_*) */
    expect_header_edit(good, n, bad, "\"fp8_tiles\":6", ":", "8",
                       "header field 'fp8_tiles' is 8, not an integer in [0, 7]");
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
        ir_plan_meta mine = {IR_PLAN_FORMAT, "", "", "", 0, 0};
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
    test_rank_plans(dir, p);
    ir_plan_free(p);
    ir_module_free(m);
    return t_finish("test_plan_file");
}
