/* test_shard.c — tensor and expert parallelism on the CPU (issue 13):
 *   - every tiny model split over ranks (tp 1, 2, 4; ep 2, 4; tp 4 x ep 2),
 *     every rank's interpreter in step with the collectives in memory,
 *     gives the unsharded model's logits to 1e-5 of each row (fp32) on
 *     random tokens, prefill then decode (the goldens: test_golden.c); the
 *     fp8 tiny models whose dims follow the 128-blocks at every split that
 *     keeps to the blocks (issue 11);
 *   - each rank's module: its weights name boxes of the checkpoint tensors
 *     (and of an fp8 weight's scales) that together cover each split tensor
 *     once, and read exactly those elements; the collectives it runs; its
 *     text parses back;
 *   - the shapes that do not split evenly are refused naming the field, and
 *     fp8 splits that cut a block naming the weight, rank, box and block;
 *   - the collectives' semantics and the group's errors, on hand-built
 *     modules. */
#include <math.h>
#include <string.h>

#include "compiler/api_internal.h"
#include "compiler/frontend.h"
#include "compiler/passes.h"
#include "runtime/interp.h"
#include "runtime/safetensors.h"
#include "runtime/weights.h"
#include "passlib.h"
#include "testlib.h"

static const char *MODELS[] = {"deepseek_v2", "deepseek_v2_qlora", "deepseek_v3", "qwen2_moe",
                               "qwen3_moe"};

static const moec_parallel SPLITS[] = {{1, 0, 0, 0}, {2, 0, 0, 0}, {4, 0, 0, 0}, {2, 2, 0, 0},
                                       {4, 4, 0, 0}, {4, 2, 0, 0}, {1, 1, 0, 0},
                                       /* the MoE combine as reduce_scatter + all_gather */
                                       {2, 2, 0, MOEC_EP_COMBINE_REDUCE_SCATTER},
                                       {4, 4, 0, MOEC_EP_COMBINE_REDUCE_SCATTER},
                                       {4, 2, 0, MOEC_EP_COMBINE_REDUCE_SCATTER}};

/* The fp8 tiny models whose dims follow the 128 x 128 blocks, and the
 * splits whose boxes keep to them (the others: check_fp8_refused). */
static const struct {
    const char *name;
    int n;
    moec_parallel par[6];
} FP8_SPLITS[] = {
    {"deepseek_v3_fp8_tp", 4, {{1, 0, 0, 0}, {2, 0, 0, 0}, {2, 2, 0, 0}, {1, 1, 0, 0}}},
    {"qwen3_moe_fp8_tp", 6, {{1, 0, 0, 0}, {2, 0, 0, 0}, {2, 2, 0, 0}, {4, 4, 0, 0}, {4, 2, 0, 0}, {1, 1, 0, 0}}},
};

/* ---- sharded == unsharded ------------------------------------------------------ */

static void check_agree(const char *name, const moec_parallel *par)
{
    const char *dir;
    moec_model_t *m = t_open_tiny(name, &dir);
    if (!m)
        return;
    moec_session_t *a = NULL, *b = NULL;
    T_OK(moec_session_init(m, dir, MOEC_BACKEND_CPU, 32, &a));
    T_OK(moec_session_init_parallel(m, dir, MOEC_BACKEND_CPU, 32, par, &b));
    int V = moec_model_vocab_size(m);
    float *ra = malloc(sizeof *ra * (size_t)V * 16), *rb = malloc(sizeof *rb * (size_t)V * 16);
    uint64_t seed = 1234 + (uint64_t)par->tp * 7 + (uint64_t)par->ep;
    int32_t ids[16];
    for (int i = 0; i < 16; i++)
        ids[i] = (int32_t)(t_rand_u64(&seed) % (uint64_t)V);
    double worst = 0;
    int ok = a && b && ra && rb;
    /* a prefill of 11, then 5 decode steps */
    for (int step = 0, at = 0; ok && step < 6; step++) {
        int n = step == 0 ? 11 : 1;
        ok = moec_session_forward(a, ids + at, n, ra) == MOEC_OK &&
             moec_session_forward(b, ids + at, n, rb) == MOEC_OK;
        for (int r = 0; ok && r < n; r++)
            worst = fmax(worst, t_row_error(rb + (size_t)r * V, ra + (size_t)r * V, V));
        at += n;
    }
    T_CHECK(ok);
    if (!ok)
        fprintf(stderr, "%s tp %d ep %d: %s\n", name, par->tp, par->ep, moec_last_error());
    printf("%-18s tp %d ep %d%s: max row error %.3g against the unsharded model (limit 1e-5)\n",
           name, par->tp, par->ep, par->ep_combine ? " (combine: reduce-scatter)" : "", worst);
    T_CHECK(worst <= 1e-5);
    free(ra);
    free(rb);
    moec_session_free(a);
    moec_session_free(b);
    moec_model_free(m);
}

/* Every rank interpreted in its planned memory arena (plan_memory's offsets,
 * collectives included) gives the unsharded model's logits. */
static void check_planned(const char *name, const moec_parallel *par)
{
    const char *dir;
    moec_model_t *m = t_open_tiny(name, &dir);
    if (!m)
        return;
    moec_session_t *a = NULL;
    T_OK(moec_session_init(m, dir, MOEC_BACKEND_CPU, 16, &a));
    ir_module *mods[IR_MAX_RANKS];
    rt_interp *g = NULL;
    T_OK(moec_fuse_ranks_cpu(m, par, mods));
    T_OK(rt_interp_init_ranks(mods, par->tp, dir, 16, &g));
    if (g)
        T_OK(rt_interp_use_plan(g, 1));
    int V = moec_model_vocab_size(m);
    float *ra = malloc(sizeof *ra * (size_t)V * 9), *rb = malloc(sizeof *rb * (size_t)V * 9);
    int32_t ids[9] = {5, 17, 3, 250, 9, 77, 1, 0, 128}, pos[9];
    for (int i = 0; i < 9; i++)
        pos[i] = i;
    double worst = 1;
    if (a && g && moec_session_forward(a, ids, 9, ra) == MOEC_OK &&
        rt_interp_forward(g, ids, pos, 9, rb) == MOEC_OK) {
        worst = 0;
        for (int r = 0; r < 9; r++)
            worst = fmax(worst, t_row_error(rb + (size_t)r * V, ra + (size_t)r * V, V));
    }
    printf("%-18s tp %d ep %d, planned arenas: max row error %.3g (limit 1e-5)\n", name, par->tp,
           par->ep, worst);
    T_CHECK(worst <= 1e-5);
    free(ra);
    free(rb);
    rt_interp_free(g);
    moec_session_free(a);
    moec_model_free(m);
}

/* The CPU engine over groups of ranks gives the unsharded engine's tokens. */
static void check_engine(void)
{
    const char *dir;
    moec_model_t *m = t_open_tiny("deepseek_v3", &dir);
    if (!m)
        return;
    moec_engine_options o = {.backend = MOEC_BACKEND_CPU, .max_seqs = 2, .max_seq_len = 16};
    moec_engine_t *a = NULL, *b = NULL;
    T_OK(moec_engine_open(m, dir, &o, &a));
    o.par = (moec_parallel){2, 2, 0, 0};
    T_OK(moec_engine_open(m, dir, &o, &b));
    int32_t tok[4] = {5, 9, 7, 200}, pos[4] = {0, 1, 0, 1}, slot[4] = {0, 0, 1, 1};
    int32_t na[4] = {0}, nb[4] = {1};
    if (a && b) {
        T_OK(moec_engine_step(a, 4, tok, pos, slot, na, NULL));
        T_OK(moec_engine_step(b, 4, tok, pos, slot, nb, NULL));
        T_CHECK(!memcmp(na, nb, sizeof na));
    }
    o.par = (moec_parallel){2, 3, 0, 0};
    moec_engine_t *c = NULL;
    T_ERR(moec_engine_open(m, dir, &o, &c), MOEC_ERR_INVALID_ARG, "ep 3 must divide tp 2");
    T_CHECK(c == NULL);
    /* on CUDA a split from a model is compiled into a scratch plan
     * (moec_compile_scratch) once the machine is seen to have the GPUs */
    int n_dev = 0;
    moec_status dc = moec_cuda_device_count(&n_dev);
    o.par = (moec_parallel){2, 1, 0, 0};
    o.backend = MOEC_BACKEND_CUDA;
    moec_session_t *s = NULL;
    if (dc != MOEC_OK) {
        T_ERR(moec_engine_open(m, dir, &o, &c), MOEC_ERR_NO_DEVICE, "no CUDA device");
        T_ERR(moec_session_init_parallel(m, dir, MOEC_BACKEND_CUDA, 8, &o.par, &s),
              MOEC_ERR_NO_DEVICE, "no CUDA device");
    } else if (n_dev < 2) {
        T_ERR(moec_engine_open(m, dir, &o, &c), MOEC_ERR_NO_DEVICE,
              "the model split over 2 ranks (tp 2, ep 1) needs 2 GPUs, this machine has 1");
        T_ERR(moec_session_init_parallel(m, dir, MOEC_BACKEND_CUDA, 8, &o.par, &s),
              MOEC_ERR_NO_DEVICE, "needs 2 GPUs, this machine has 1");
    }
    T_CHECK(c == NULL && s == NULL);
    moec_engine_free(a);
    moec_engine_free(b);
    moec_model_free(m);
}

/* ---- each rank's module ---------------------------------------------------------- */

static ir_module *rank_module_par(const char *name, const moec_parallel *par, int rank)
{
    const char *dir;
    moec_model_t *m = t_open_tiny(name, &dir);
    if (!m)
        return NULL;
    cg_options co;
    ir_module *r = NULL;
    T_OK(moec_cg_options(IR_DTYPE_F32, NULL, &co));
    T_OK(moec_fuse_rank(moec_model_module(m), &co, par, rank, &r));
    moec_model_free(m);
    return r;
}

static ir_module *rank_module(const char *name, int tp, int ep, int rank)
{
    moec_parallel par = {tp, ep, 0, 0};
    return rank_module_par(name, &par, rank);
}

/* --ep-combine reduce-scatter: each MoE block's all_reduce becomes a
 * reduce_scatter along the hidden axis (each rank its share: hidden / tp
 * columns) and an all_gather of the shares; the other collectives stay. */
static void check_combine_scattered(const char *name, int tp, int ep)
{
    moec_parallel par = {tp, ep, 0, MOEC_EP_COMBINE_REDUCE_SCATTER};
    for (int r = 0; r < tp; r++) {
        ir_module *m = rank_module_par(name, &par, r);
        if (!m)
            return;
        int layers = (int)ir_module_meta_int(m, "num_hidden_layers", 0);
        int moe = t_count_ops(m, IR_OP_MOE_ROUTED);
        T_CHECK(moe > 0);
        T_CHECK(t_count_ops(m, IR_OP_REDUCE_SCATTER) == moe);
        T_CHECK(t_count_ops(m, IR_OP_ALL_GATHER) == 1 + moe);
        T_CHECK(t_count_ops(m, IR_OP_ALL_REDUCE) == 1 + 2 * layers - moe);
        int64_t hidden = ir_module_meta_int(m, "hidden_size", 0);
        for (int i = 0; i < m->n_ops; i++) {
            const ir_op *op = m->ops[i];
            if (op->kind != IR_OP_REDUCE_SCATTER)
                continue;
            const ir_type *t = &op->out[0]->type;
            T_CHECK(ir_op_attr_int(op, "ranks", 0) == tp &&
                    ir_op_attr_int(op, "axis", 0) == t->rank - 1 &&
                    t->dims[t->rank - 1] * tp == hidden);
            /* its shares gathered back, whole */
            int gathered = 0;
            for (int j = i + 1; j < m->n_ops; j++)
                gathered |= m->ops[j]->kind == IR_OP_ALL_GATHER && m->ops[j]->in[0] == op->out[0];
            T_CHECK(gathered);
        }
        ir_module_free(m);
    }
}

/* Per layer one all_reduce after attention and one after the MLP or MoE,
 * one for the embedding, one all_gather of the logits, nothing else; every
 * collective over tp ranks; the metas say which rank; GQA's prologue fused
 * on every rank. */
static void check_collectives(const char *name, int tp, int ep)
{
    for (int r = 0; r < tp; r++) {
        ir_module *m = rank_module(name, tp, ep, r);
        if (!m)
            return;
        int layers = (int)ir_module_meta_int(m, "num_hidden_layers", 0);
        T_CHECK(t_count_ops(m, IR_OP_ALL_REDUCE) == 1 + 2 * layers);
        T_CHECK(t_count_ops(m, IR_OP_ALL_GATHER) == 1);
        T_CHECK(t_count_ops(m, IR_OP_REDUCE_SCATTER) == 0 && t_count_ops(m, IR_OP_ALL_TO_ALL) == 0);
        for (int i = 0; i < m->n_ops; i++) {
            const ir_op *op = m->ops[i];
            if (op->kind == IR_OP_ALL_REDUCE || op->kind == IR_OP_ALL_GATHER)
                T_CHECK(ir_op_attr_int(op, "ranks", 0) == tp);
        }
        T_CHECK(ir_module_meta_int(m, "tp", 0) == tp && ir_module_meta_int(m, "ep", 0) == ep &&
                ir_module_meta_int(m, "rank", -1) == r);
        /* GQA with one qkv projection: each rank's heads fused into one
           attn_prologue a layer (pass fuse_attn_prologue after shard) */
        if (t_count_ops(m, IR_OP_ATTENTION) == layers && ir_module_find_value(m, "l0.attn.qkv"))
            T_CHECK(t_count_ops(m, IR_OP_ATTN_PROLOGUE) == layers &&
                    t_count_ops(m, IR_OP_ROPE) == 0);
        T_CHECK(m->n_outputs == 1 && !strcmp(m->outputs[0]->name, "logits") &&
                m->outputs[0]->def->kind == IR_OP_ALL_GATHER);
        /* the text form parses back to the same module */
        char *text = ir_module_print_str(m);
        ir_module *back = NULL;
        T_OK(ir_module_parse(text, name, &back));
        char *again = back ? ir_module_print_str(back) : NULL;
        T_CHECK(again && !strcmp(again, text));
        free(again);
        free(text);
        ir_module_free(back);
        ir_module_free(m);
    }
}

/* One box of a checkpoint tensor a rank reads. */
typedef struct tbox {
    char name[200];
    int rank;
    int64_t lo[IR_MAX_RANK], n[IR_MAX_RANK]; /* n 0: the whole dim */
} tbox;

/* The boxes of the tensors leaf b of rank r reads, appended to *out. */
static void leaf_boxes(const ir_binding *b, int rank, tbox *out, int *n, int cap)
{
    int stacked = b->kind == IR_BIND_STACK;
    int64_t e0 = 0, ne = stacked ? b->count : 1;
    if (stacked && b->box_rank && b->box_size[0]) {
        e0 = b->box_start[0];
        ne = b->box_size[0];
    }
    for (int64_t e = e0; e < e0 + ne && *n < cap; e++) {
        tbox *t = &out[(*n)++];
        memset(t, 0, sizeof *t);
        t->rank = rank;
        const char *at = stacked ? strstr(b->name, "{e}") : NULL;
        if (at)
            snprintf(t->name, sizeof t->name, "%.*s%lld%s", (int)(at - b->name), b->name,
                     (long long)e, at + 3);
        else
            snprintf(t->name, sizeof t->name, "%s", b->name);
        for (int d = stacked; d < b->box_rank; d++) {
            t->lo[d - stacked] = b->box_start[d];
            t->n[d - stacked] = b->box_size[d];
        }
    }
}

/* The ranks together read every checkpoint tensor the unsharded module
 * reads (fp8 scales included), and each either whole on every rank
 * (replicated) or in disjoint boxes that cover it once (split): each rank
 * reads only its part. */
static void check_weight_cover(const char *name, int tp, int ep)
{
    enum { CAP = 8192 };
    tbox *boxes = calloc(CAP, sizeof *boxes);
    int n = 0;
    for (int r = 0; r < tp; r++) {
        ir_module *m = rank_module(name, tp, ep, r);
        for (int i = 0; m && i < m->n_values; i++) {
            const ir_value *w = m->values[i];
            if (w->kind != IR_VALUE_WEIGHT)
                continue;
            /* the codes and, of a block-scaled weight, the scales */
            for (int k = 0; k < (w->scale.block[0] > 0 ? 2 : 1); k++) {
                const ir_binding *b = k ? &w->scale.bind : &w->bind;
                if (b->kind != IR_BIND_CONCAT)
                    leaf_boxes(b, r, boxes, &n, CAP);
                for (int p = 0; b->kind == IR_BIND_CONCAT && p < b->n_parts; p++)
                    leaf_boxes(&b->parts[p], r, boxes, &n, CAP);
            }
        }
        ir_module_free(m);
    }
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/%s", name);
    rt_safetensors *st = NULL;
    T_OK(rt_safetensors_open_dir(t_src(rel), &st));
    int tensors = 0, bad = 0;
    for (int i = 0; st && i < n; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++)
            first = strcmp(boxes[j].name, boxes[i].name) != 0;
        if (!first)
            continue;
        tensors++;
        const rt_st_tensor *t = rt_safetensors_find(st, boxes[i].name);
        T_CHECK(t != NULL);
        if (!t)
            continue;
        int64_t numel = 1, sum = 0;
        for (int d = 0; d < t->rank; d++)
            numel *= t->shape[d];
        /* boxes pairwise equal (copies on several ranks) or disjoint; the
         * distinct ones cover the tensor once, each on as many ranks */
        int count = 0, distinct = 0, copies = -1, ok = 1;
        for (int j = i; j < n; j++) {
            if (strcmp(boxes[j].name, boxes[i].name))
                continue;
            tbox *b = &boxes[j];
            for (int d = 0; d < t->rank; d++)
                if (!b->n[d])
                    b->n[d] = t->shape[d];
        }
        for (int j = i; j < n; j++) {
            if (strcmp(boxes[j].name, boxes[i].name))
                continue;
            const tbox *b = &boxes[j];
            count++;
            int same = 0, first_copy = 1;
            for (int q = i; q < n; q++) {
                if (q == j || strcmp(boxes[q].name, b->name))
                    continue;
                int eq = 1, meet = 1;
                for (int d = 0; d < t->rank; d++) {
                    eq &= boxes[q].lo[d] == b->lo[d] && boxes[q].n[d] == b->n[d];
                    meet &= boxes[q].lo[d] < b->lo[d] + b->n[d] &&
                            b->lo[d] < boxes[q].lo[d] + boxes[q].n[d];
                }
                ok &= eq || !meet;
                same += eq;
                if (eq && q < j)
                    first_copy = 0;
            }
            if (copies < 0)
                copies = same + 1;
            ok &= copies == same + 1;
            if (first_copy) {
                distinct++;
                int64_t k = 1;
                for (int d = 0; d < t->rank; d++)
                    k *= b->n[d];
                sum += k;
            }
        }
        ok &= sum == numel && copies >= 1 && tp % copies == 0 && distinct * copies == count;
        if (!ok) {
            bad++;
            fprintf(stderr, "%s tp %d ep %d: tensor %s: %d boxes, %d distinct, of %lld elements "
                            "(%lld)\n",
                    name, tp, ep, boxes[i].name, count, distinct, (long long)sum,
                    (long long)numel);
        }
    }
    T_CHECK(bad == 0);
    /* and every tensor of the checkpoint the model reads */
    const char *dir;
    moec_model_t *m = t_open_tiny(name, &dir);
    T_CHECK(m && tensors == moec_model_tensor_count(m));
    moec_model_free(m);
    rt_safetensors_free(st);
    free(boxes);
}

/* A rank's weight reads exactly its box of the checkpoint: o_proj's columns,
 * the experts of its group, a fused gate_up's rows of gate and of up. */
static void check_weight_values(void)
{
    const char *dir = t_src("tests/data/deepseek_v2");
    ir_module *whole = rank_module("deepseek_v2", 0, 0, 0);
    ir_module *part = rank_module("deepseek_v2", 4, 2, 3);
    rt_weights *ww = NULL, *wp = NULL;
    if (whole && part) {
        T_OK(rt_weights_open(whole, dir, &ww));
        T_OK(rt_weights_open(part, dir, &wp));
    }
    if (!ww || !wp)
        goto out;
    /* o_proj [64, 64]: rank 3 of 4 reads columns 48..63 */
    const ir_value *fo = ir_module_find_value(whole, "l0.attn.o_proj");
    const ir_value *po = ir_module_find_value(part, "l0.attn.o_proj");
    float *a = malloc(64 * 64 * sizeof *a), *b = malloc(64 * 64 * sizeof *b);
    T_OK(rt_weights_read_f32(ww, fo, a));
    T_OK(rt_weights_read_f32(wp, po, b));
    int same = po->type.dims[1] == 16;
    for (int i = 0; same && i < 64; i++)
        same = !memcmp(b + i * 16, a + i * 64 + 48, 16 * sizeof *a);
    T_CHECK(same);
    free(a);
    free(b);
    /* experts gate_up [8, 64, 64] (gate rows 0..31, up 32..63): rank 3 of tp 4
     * ep 2 holds experts 4..7, rows 16..31 of gate and of up */
    const ir_value *fg = ir_module_find_value(whole, "l1.moe.experts.gate_up");
    const ir_value *pg = ir_module_find_value(part, "l1.moe.experts.gate_up");
    a = malloc(8 * 64 * 64 * sizeof *a);
    b = malloc(4 * 32 * 64 * sizeof *b);
    T_OK(rt_weights_read_f32(ww, fg, a));
    T_OK(rt_weights_read_f32(wp, pg, b));
    same = pg->type.dims[0] == 4 && pg->type.dims[1] == 32;
    for (int e = 0; same && e < 4; e++)
        for (int row = 0; same && row < 32; row++) {
            int src = row < 16 ? 16 + row : 32 + 16 + (row - 16);
            same = !memcmp(b + ((size_t)e * 32 + row) * 64, a + ((size_t)(4 + e) * 64 + src) * 64,
                           64 * sizeof *a);
        }
    T_CHECK(same);
    free(a);
    free(b);
out:
    rt_weights_free(ww);
    rt_weights_free(wp);
    ir_module_free(whole);
    ir_module_free(part);
}

/* 1 when the [rows x cols] row-major block of whole (of width wcols) from
 * (r0, c0) equals part (of width cols), elements of esize bytes. */
static int same_box(const void *whole, int64_t wcols, int64_t r0, int64_t c0, const void *part,
                    int64_t rows, int64_t cols, size_t esize)
{
    for (int64_t r = 0; r < rows; r++)
        if (memcmp((const char *)part + (size_t)(r * cols) * esize,
                   (const char *)whole + (size_t)((r0 + r) * wcols + c0) * esize,
                   (size_t)cols * esize))
            return 0;
    return 1;
}

/* A rank's box of a block-scaled weight reads exactly that box of the
 * whole: dequantized (rt_weights_read_f32) and as stored (rt_weights_read_f8:
 * its codes, and the scales of the blocks it touches). q_b_proj [768, 256]
 * (f8e4m3): rank 1 of tp 2 reads rows 384..767, scale rows 3..5; o_proj
 * [256, 512]: columns 256..511, scale columns 2..3; the experts' gate_up
 * [4, 512, 256] (gate rows 0..255, up 256..511) at tp 2 ep 2: experts 2, 3
 * whole; the dense gate_up [1024, 256] at tp 2: rows 256..511 of gate and
 * of up; kv_b [1024, 128] (dequantized at load into f32): rows 512..1023. */
static void check_fp8_weight_values(void)
{
    const char *dir = t_src("tests/data/deepseek_v3_fp8_tp");
    ir_module *whole = rank_module("deepseek_v3_fp8_tp", 0, 0, 0);
    ir_module *tp2 = rank_module("deepseek_v3_fp8_tp", 2, 1, 1);
    ir_module *ep2 = rank_module("deepseek_v3_fp8_tp", 2, 2, 1);
    rt_weights *ww = NULL, *w2 = NULL, *we = NULL;
    if (whole && tp2 && ep2) {
        T_OK(rt_weights_open(whole, dir, &ww));
        T_OK(rt_weights_open(tp2, dir, &w2));
        T_OK(rt_weights_open(ep2, dir, &we));
    }
    static const struct {
        const char *name;
        int ep;              /* the module: 1 tp2, 2 tp 2 ep 2 */
        int64_t r0, c0;      /* where the rank's box starts in the whole (per expert) */
        int64_t e0;          /* the first expert */
        int64_t half, off;   /* a fused gate_up: rows per half in the rank, and where up
                                starts in the whole (0: not fused) */
    } cases[] = {
        {"l0.attn.q_b_proj", 1, 384, 0, 0, 0, 0},
        {"l1.attn.o_proj", 1, 0, 256, 0, 0, 0},
        {"l0.attn.kv_b_proj", 1, 512, 0, 0, 0, 0},
        {"l1.moe.experts.gate_up", 2, 0, 0, 2, 0, 0},
        {"l1.moe.experts.down", 2, 0, 0, 2, 0, 0},
        {"l0.mlp.gate_up_proj", 1, 256, 0, 0, 256, 512},
        {"l1.moe.shared.down_proj", 1, 0, 128, 0, 0, 0},
    };
    for (size_t i = 0; ww && w2 && we && i < sizeof cases / sizeof *cases; i++) {
        const ir_module *pm = cases[i].ep == 2 ? ep2 : tp2;
        rt_weights *pw = cases[i].ep == 2 ? we : w2;
        const ir_value *fv = ir_module_find_value(whole, cases[i].name);
        const ir_value *pv = ir_module_find_value(pm, cases[i].name);
        T_CHECK(fv && pv && pv->scale.block[0] == 128);
        if (!fv || !pv)
            continue;
        int r = fv->type.rank, stacked = r == 3;
        int64_t R = fv->type.dims[r - 2], C = fv->type.dims[r - 1];
        int64_t pr = pv->type.dims[r - 2], pc = pv->type.dims[r - 1];
        int64_t ne = stacked ? pv->type.dims[0] : 1;
        size_t fn = (size_t)ir_type_numel(&fv->type, 0), pn = (size_t)ir_type_numel(&pv->type, 0);
        float *a = malloc(fn * sizeof *a), *b = malloc(pn * sizeof *b);
        T_OK(rt_weights_read_f32(ww, fv, a));
        T_OK(rt_weights_read_f32(pw, pv, b));
        /* the box's rows: one run, or a fused gate_up's two halves */
        int ok = 1, runs = cases[i].off ? 2 : 1;
        int64_t run = cases[i].off ? cases[i].half : pr;
        for (int64_t e = 0; e < ne; e++)
            for (int h = 0; h < runs; h++)
                ok &= same_box(a + (size_t)((cases[i].e0 + e) * R * C), C,
                               cases[i].r0 + h * cases[i].off, cases[i].c0,
                               b + (size_t)((e * pr + h * run) * pc), run, pc, sizeof *a);
        T_CHECK(ok);
        if (!ok)
            fprintf(stderr, "fp8 box of %%%s: dequantized values differ\n", cases[i].name);
        free(a);
        free(b);
        if (fv->type.dtype != IR_DTYPE_F8E4M3)
            continue;
        /* as stored: codes, then the scales' box of the grid */
        ir_type fs = ir_block_scale_type(fv), ps = ir_block_scale_type(pv);
        size_t fsn = (size_t)ir_type_numel(&fs, 0), psn = (size_t)ir_type_numel(&ps, 0);
        uint8_t *qa = malloc(fn), *qb = malloc(pn);
        float *sa = malloc(fsn * sizeof *sa), *sb = malloc(psn * sizeof *sb);
        T_OK(rt_weights_read_f8(ww, fv, qa, sa));
        T_OK(rt_weights_read_f8(pw, pv, qb, sb));
        int64_t SR = fs.dims[r - 2], SC = fs.dims[r - 1];
        int64_t sr = ps.dims[r - 2], sc = ps.dims[r - 1];
        ok = 1;
        for (int64_t e = 0; e < ne; e++)
            for (int h = 0; h < runs; h++) {
                ok &= same_box(qa + (size_t)((cases[i].e0 + e) * R * C), C,
                               cases[i].r0 + h * cases[i].off, cases[i].c0,
                               qb + (size_t)((e * pr + h * run) * pc), run, pc, 1);
                ok &= same_box(sa + (size_t)((cases[i].e0 + e) * SR * SC), SC,
                               (cases[i].r0 + h * cases[i].off) / 128, cases[i].c0 / 128,
                               sb + (size_t)((e * sr + h * run / 128) * sc), run / 128, sc,
                               sizeof *sa);
            }
        T_CHECK(ok);
        if (!ok)
            fprintf(stderr, "fp8 box of %%%s: codes or scales differ\n", cases[i].name);
        free(qa);
        free(qb);
        free(sa);
        free(sb);
    }
    rt_weights_free(ww);
    rt_weights_free(w2);
    rt_weights_free(we);
    ir_module_free(whole);
    ir_module_free(tp2);
    ir_module_free(ep2);
}

/* A rank checks every tensor it binds whole, though it reads only its
 * boxes: a NaN among the scales of rank 0's blocks of q_b_proj refuses
 * rank 1's weights too, naming the scale tensor (nothing is run on a bad
 * checkpoint). */
static void check_fp8_checkpoint_checked(void)
{
    const char *dst = t_tmpdir("fp8nan");
    t_write_nan_model(t_src("tests/data/deepseek_v3_fp8_tp"), dst,
                      "model.layers.0.self_attn.q_b_proj.weight_scale_inv", 0);
    ir_module *r1 = rank_module("deepseek_v3_fp8_tp", 2, 1, 1);
    rt_weights *w = NULL;
    if (r1)
        T_ERR(rt_weights_open(r1, dst, &w), MOEC_ERR_MISMATCH,
              "weight %l0.attn.q_b_proj: scale tensor "
              "'model.layers.0.self_attn.q_b_proj.weight_scale_inv' in ");
    if (r1)
        T_ERR(rt_weights_open(r1, dst, &w), MOEC_ERR_MISMATCH,
              "holds nan at element 0; scales must be finite");
    T_CHECK(w == NULL);
    ir_module_free(r1);
}

/* A box that does not fit the checkpoint tensor, and malformed boxes. */
static void check_box_errors(void)
{
    const char *head = "module t {\n  input %tokens : i32[T]\n  input %positions : i32[T]\n";
    char text[1024];
    snprintf(text, sizeof text,
             "%s  weight %%e : bf16[128, 64] = \"model.embed_tokens.weight\"[200:328, :]\n"
             "  %%x : f32[T, 64] = embedding(%%tokens, %%e) {vocab_start = 0, vocab_size = 512}\n"
             "  output %%x\n}\n",
             head);
    ir_module *m = NULL;
    T_OK(ir_module_parse(text, "box.mir", &m));
    rt_weights *w = NULL;
    if (m)
        T_ERR(rt_weights_open(m, t_src("tests/data/deepseek_v2"), &w), MOEC_ERR_MISMATCH,
              "weight %e: tensor 'model.embed_tokens.weight' in ");
    if (m)
        T_ERR(rt_weights_open(m, t_src("tests/data/deepseek_v2"), &w), MOEC_ERR_MISMATCH,
              "has shape [256, 64], which the slice [200:328, :] does not fit");
    ir_module_free(m);
    static const struct {
        const char *type, *bind, *err;
    } bad[] = {
        {"f32[4, 8]", "\"a\"[0:4]", "weight %w: slice has 1 dims, the weight has 2"},
        {"f32[4, 8]", "\"a\"[0:4, 0:3]", "weight %w: slice dim 1 [0:3] has 3 entries, the weight 8"},
        {"f32[2, 8]", "stack(\"a{e}\", 2)[1:3, :]",
         "weight %w: slice dim 0 [1:3] is outside the stack's 2"},
        {"f32[4, 8]", "\"a\"[4:2, :]", "slice end 2 out of range [5, 2147483647]"},
        {"f32[4, 8]", "\"a\"[0:4 :]", "expected ',' or ']' in the slice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(text, sizeof text, "%s  weight %%w : %s = %s\n  output %%tokens\n}\n", head,
                 bad[i].type, bad[i].bind);
        m = NULL;
        T_ERR(ir_module_parse(text, "box.mir", &m), MOEC_ERR_FORMAT, bad[i].err);
        ir_module_free(m);
    }
}

/* ---- refusals ----------------------------------------------------------------------- */

/* tests/data/<model>/config.json with `key: value` pairs replaced, written
 * to a fresh folder (config only: the IR needs no weights). */
static moec_model_t *edited_model(const char *model, const char *const *kv, int n)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/%s/config.json", model);
    char *text = t_read_file(t_src(rel), NULL);
    for (int i = 0; i < n; i++) {
        char key[128];
        snprintf(key, sizeof key, "\"%s\":", kv[2 * i]);
        char *at = strstr(text, key);
        T_CHECK(at != NULL);
        if (!at)
            continue;
        char *v = at + strlen(key), *end = v;
        while (*end && *end != ',' && *end != '\n' && *end != '}')
            end++;
        size_t len = strlen(text) + strlen(kv[2 * i + 1]) + 4;
        char *next = malloc(len);
        snprintf(next, len, "%.*s %s%s", (int)(v - text), text, kv[2 * i + 1], end);
        free(text);
        text = next;
    }
    const char *dir = t_tmpdir("shard");
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    t_write_file(path, text, strlen(text));
    free(text);
    moec_model_t *m = NULL;
    T_OK(moec_model_open_config(path, &m));
    return m;
}

static void refuse(const char *model, const char *const *kv, int n, int tp, int ep,
                   const char *err)
{
    moec_model_t *m = edited_model(model, kv, n);
    if (!m)
        return;
    FILE *null = fopen("/dev/null", "w");
    moec_parallel par = {tp, ep, 0, 0};
    T_ERR(moec_model_dump_ir_rank(m, NULL, NULL, &par, null), MOEC_ERR_INVALID_ARG, err);
    /* the same from a session: nothing half made */
    moec_session_t *s = NULL;
    T_ERR(moec_session_init_parallel(m, t_src("tests/data/deepseek_v3"), MOEC_BACKEND_CPU, 8, &par,
                                     &s),
          MOEC_ERR_INVALID_ARG, err);
    T_CHECK(s == NULL);
    fclose(null);
    moec_model_free(m);
}

/* A split of an fp8 checkpoint whose boxes cut a 128 x 128 block is refused
 * naming the weight, the rank, its rows or columns, the checkpoint tensor
 * and the block: from a session, an engine and dump-ir, nothing half made.
 * The fp8 tiny models whose heads do not fill blocks at tp 2; the aligned
 * ones at tp 4 (q_b_proj's heads, the experts' intermediate); and edited
 * configs: a part of a merged weight (the dense gate_up's gate, Qwen's
 * fused qkv's k) and columns (o_proj). (A gate and up the frontend does
 * not merge, their parts not filling blocks, are replicated, not split.) */
static void check_fp8_refused(void)
{
    static const char tail[] = "a rank reads whole blocks of an fp8 checkpoint";
    static const char v3_tp2[] =
        "shard: weight %l0.attn.q_b_proj is block-scaled fp8 (blocks of 128 x 128): rank 0's "
        "rows 0..64 of \"model.layers.0.self_attn.q_b_proj.weight\" (128 rows) end neither on "
        "a block boundary nor at the tensor's end (tp 2, ep 1): a rank reads whole blocks of an "
        "fp8 checkpoint";
    const char *dir;
    moec_model_t *m = t_open_tiny("deepseek_v3_fp8", &dir);
    if (!m)
        return;
    moec_parallel par = {2, 0, 0, 0};
    moec_session_t *s = NULL;
    T_ERR(moec_session_init_parallel(m, dir, MOEC_BACKEND_CPU, 8, &par, &s),
          MOEC_ERR_UNSUPPORTED, v3_tp2);
    moec_engine_options o = {.backend = MOEC_BACKEND_CPU, .max_seqs = 2, .par = {2, 2, 0}};
    moec_engine_t *e = NULL;
    T_ERR(moec_engine_open(m, dir, &o, &e), MOEC_ERR_UNSUPPORTED,
          "rank 0's rows 0..64 of \"model.layers.0.self_attn.q_b_proj.weight\" (128 rows) end "
          "neither on a block boundary nor at the tensor's end (tp 2, ep 2)");
    FILE *null = fopen("/dev/null", "w");
    T_ERR(moec_model_dump_ir_rank(m, NULL, NULL, &par, null), MOEC_ERR_UNSUPPORTED, v3_tp2);
    par.rank = 1;
    T_ERR(moec_model_dump_ir_rank(m, NULL, NULL, &par, null), MOEC_ERR_UNSUPPORTED,
          "shard: weight %l0.attn.q_b_proj is block-scaled fp8 (blocks of 128 x 128): rank 1's "
          "rows 64..128 of \"model.layers.0.self_attn.q_b_proj.weight\" (128 rows) do not start "
          "on a block boundary (tp 2, ep 1): a rank reads whole blocks of an fp8 checkpoint");
    T_CHECK(s == NULL && e == NULL);
    moec_model_free(m);

    static const struct {
        const char *model;
        const char *kv[6];
        int n_kv, tp, ep, rank;
        const char *err;
    } cases[] = {
        {"qwen3_moe_fp8", {NULL}, 0, 2, 1, 0,
         "shard: weight %l0.attn.qkv_proj is block-scaled fp8 (blocks of 128 x 128): rank 0's "
         "rows 0..96 of \"model.layers.0.self_attn.q_proj.weight\" (192 rows) end neither on a "
         "block boundary nor at the tensor's end (tp 2, ep 1)"},
        {"deepseek_v3_fp8_tp", {NULL}, 0, 4, 4, 0,
         "shard: weight %l0.attn.q_b_proj is block-scaled fp8 (blocks of 128 x 128): rank 0's "
         "rows 0..192 of \"model.layers.0.self_attn.q_b_proj.weight\" (768 rows) end neither "
         "on a block boundary nor at the tensor's end (tp 4, ep 4)"},
        {"deepseek_v3_fp8_tp", {NULL}, 0, 4, 2, 3,
         "rank 3's rows 576..768 of \"model.layers.0.self_attn.q_b_proj.weight\" (768 rows) do "
         "not start on a block boundary (tp 4, ep 2)"},
        {"qwen3_moe_fp8_tp", {NULL}, 0, 4, 1, 1,
         "shard: weight %l1.moe.experts.gate_up is block-scaled fp8 (blocks of 128 x 128): rank "
         "1's rows 64..128 of \"model.layers.1.mlp.experts.{e}.gate_proj.weight\" (256 rows) do "
         "not start on a block boundary (tp 4, ep 1)"},
        {"deepseek_v3_fp8_tp", {"intermediate_size", "384"}, 1, 2, 1, 0,
         "shard: weight %l0.mlp.gate_up_proj is block-scaled fp8 (blocks of 128 x 128): rank 0's "
         "rows 0..192 of \"model.layers.0.mlp.gate_proj.weight\" (384 rows) end neither on a "
         "block boundary nor at the tensor's end (tp 2, ep 1)"},
        {"qwen3_moe_fp8_tp", {"head_dim", "64"}, 1, 2, 2, 1,
         "shard: weight %l0.attn.qkv_proj is block-scaled fp8 (blocks of 128 x 128): rank 1's "
         "rows 64..128 of \"model.layers.0.self_attn.k_proj.weight\" (128 rows) do not start on "
         "a block boundary (tp 2, ep 2)"},
        {"deepseek_v3_fp8_tp",
         {"qk_nope_head_dim", "32", "qk_rope_head_dim", "32", "v_head_dim", "32"}, 3, 2, 1, 1,
         "shard: weight %l0.attn.o_proj is block-scaled fp8 (blocks of 128 x 128): rank 1's "
         "columns 64..128 of \"model.layers.0.self_attn.o_proj.weight\" (128 columns) do not "
         "start on a block boundary (tp 2, ep 1)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        moec_model_t *cm = edited_model(cases[i].model, cases[i].kv, cases[i].n_kv);
        par = (moec_parallel){cases[i].tp, cases[i].ep, cases[i].rank, 0};
        if (cm) {
            T_ERR(moec_model_dump_ir_rank(cm, NULL, NULL, &par, null), MOEC_ERR_UNSUPPORTED,
                  cases[i].err);
            T_ERR(moec_model_dump_ir_rank(cm, NULL, NULL, &par, null), MOEC_ERR_UNSUPPORTED,
                  tail);
        }
        moec_model_free(cm);
    }
    fclose(null);
}

/* The published shapes in fp8 (tests/data/configs with DeepSeek-V3's
 * quantization_config added): DeepSeek-V3 at tp 8 (16 heads of q_b's 192
 * rows: 24 blocks) and at tp 8 ep 8; Qwen3-30B-A3B at tp 4 ep 4, but not
 * tp 4 inside its experts (768 / 4 = 192 rows). */
static void check_fp8_real_configs(void)
{
    static const struct {
        const char *config;
        moec_parallel par;
        const char *err; /* NULL: splits */
    } cases[] = {
        {"deepseek_v3.json", {8, 1, 7, 0}, NULL},
        {"deepseek_v3.json", {8, 8, 5, 0}, NULL},
        {"qwen3_30b_a3b.json", {4, 4, 1, 0}, NULL},
        {"qwen3_30b_a3b.json", {4, 1, 1, 0},
         "shard: weight %l0.moe.experts.gate_up is block-scaled fp8 (blocks of 128 x 128): rank "
         "1's rows 192..384 of \"model.layers.0.mlp.experts.{e}.gate_proj.weight\" (768 rows) do "
         "not start on a block boundary (tp 4, ep 1)"},
    };
    FILE *null = fopen("/dev/null", "w");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/data/configs/%s", cases[i].config);
        char *text = t_read_file(t_src(rel), NULL);
        char *brace = strchr(text, '{');
        T_CHECK(brace != NULL);
        if (!brace) {
            free(text);
            continue;
        }
        static const char q[] = "{\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": "
                                "\"e4m3\", \"activation_scheme\": \"dynamic\", "
                                "\"weight_block_size\": [128, 128]},";
        size_t len = strlen(text) + sizeof q;
        char *fp8 = malloc(len);
        snprintf(fp8, len, "%s%s", q, brace + 1);
        const char *dir = t_tmpdir("fp8cfg");
        char path[4200];
        snprintf(path, sizeof path, "%s/config.json", dir);
        t_write_file(path, fp8, strlen(fp8));
        free(fp8);
        free(text);
        moec_model_t *m = NULL;
        T_OK(moec_model_open_config(path, &m));
        if (m && cases[i].err)
            T_ERR(moec_model_dump_ir_rank(m, NULL, NULL, &cases[i].par, null),
                  MOEC_ERR_UNSUPPORTED, cases[i].err);
        else if (m)
            T_OK(moec_model_dump_ir_rank(m, NULL, NULL, &cases[i].par, null));
        moec_model_free(m);
    }
    fclose(null);
}

static void check_refusals(void)
{
    static const char *const none[] = {NULL};
    refuse("deepseek_v3", none, 0, 3, 1,
           "tp 3 does not divide num_attention_heads 4 (%l0.attn.o_c): the shard pass splits it "
           "evenly over the ranks");
    static const char *const kv[] = {"num_attention_heads", "6", "num_key_value_heads", "3"};
    refuse("qwen3_moe", kv, 2, 2, 1,
           "tp 2 and num_key_value_heads 3 (%l0.attn.ctx): one must divide the other");
    static const char *const inter[] = {"intermediate_size", "90"};
    refuse("qwen3_moe", inter, 1, 4, 1, "tp 4 does not divide intermediate_size 90 (%l1.mlp.act)");
    static const char *const shared_q[] = {"shared_expert_intermediate_size", "50"};
    refuse("qwen2_moe", shared_q, 1, 4, 1,
           "tp 4 does not divide shared_expert_intermediate_size 50 (%l1.moe.shared.act)");
    static const char *const shared_d[] = {"moe_intermediate_size", "30"};
    refuse("deepseek_v3", shared_d, 1, 4, 1,
           "tp 4 does not divide moe_intermediate_size * n_shared_experts 30 "
           "(%l1.moe.shared.act)");
    static const char *const experts[] = {"num_experts", "6"};
    refuse("qwen3_moe", experts, 1, 4, 4, "ep 4 does not divide num_experts 6 (%l0.moe.routed)");
    static const char *const dexperts[] = {"n_routed_experts", "10"};
    refuse("deepseek_v2", dexperts, 1, 4, 4,
           "ep 4 does not divide n_routed_experts 10 (%l1.moe.routed)");
    static const char *const moe_i[] = {"moe_intermediate_size", "31"};
    refuse("qwen3_moe", moe_i, 1, 4, 2,
           "tp / ep = 4 / 2 = 2 does not divide moe_intermediate_size 31 (%l0.moe.routed)");
    static const char *const vocab[] = {"vocab_size", "250"};
    refuse("qwen2_moe", vocab, 1, 4, 1, "tp 4 does not divide vocab_size 250 (%embed)");
    /* the numbers themselves */
    refuse("qwen2_moe", none, 0, 4, 3, "ep 3 must divide tp 4");
    refuse("qwen2_moe", none, 0, 65, 1, "tp 65 out of range [1, 64]");
    moec_model_t *m = edited_model("qwen2_moe", none, 0);
    moec_parallel par = {2, 1, 2, 0};
    FILE *null = fopen("/dev/null", "w");
    if (m)
        T_ERR(moec_model_dump_ir_rank(m, NULL, NULL, &par, null), MOEC_ERR_INVALID_ARG,
              "rank 2 out of range [0, 2) (tp 2)");
    par = (moec_parallel){0, 2, 0, 0};
    if (m)
        T_ERR(moec_model_dump_ir_rank(m, NULL, NULL, &par, null), MOEC_ERR_INVALID_ARG,
              "ep 2 and rank 0 need tp");
    fclose(null);
    moec_model_free(m);
    check_fp8_refused();
    check_fp8_real_configs();
    /* a module sharded twice */
    ir_module *r = rank_module("qwen2_moe", 2, 1, 0);
    pass_options po;
    pass_options_default(&po);
    po.tp = 2;
    if (r)
        T_ERR(pass_shard(r, &po), MOEC_ERR_INVALID_ARG, "is sharded already (meta tp)");
    ir_module_free(r);
}

/* ---- collectives and groups on hand-built modules ---------------------------------- */

/* rank r of n: x = embedding(tokens, table [4, 4]) (row t of rank r's table
 * holds 100 r + 10 t + c), y = kind(x), output y. */
static ir_module *coll_module(ir_op_kind kind, int n, int r, int axis)
{
    ir_module *m = ir_module_init("coll");
    ir_type it = {IR_DTYPE_I32, 1, {IR_DIM_T}};
    ir_type wt = {IR_DTYPE_F32, 2, {4, 4}};
    ir_value *tok = ir_module_add_input(m, "tokens", it);
    ir_module_add_input(m, "positions", it);
    ir_value *tab = ir_module_add_weight(m, "table", wt, "t");
    ir_value *in[2] = {tok, tab};
    ir_value *x = ir_build(m, IR_OP_EMBEDDING, "x", in, 2);
    const char *name = "y";
    ir_op *op = ir_module_add_op(m, kind, &x, 1, &name, 1);
    if (kind != IR_OP_ALL_REDUCE)
        T_OK(ir_op_set_int(m, op, "axis", axis));
    T_OK(ir_op_set_int(m, op, "ranks", n));
    T_OK(ir_op_finish(m, op, NULL));
    T_OK(ir_module_add_output(m, op->out[0]));
    T_OK(ir_module_set_meta_int(m, "tp", n));
    T_OK(ir_module_set_meta_int(m, "rank", r));
    T_OK(ir_module_verify(m));
    return m;
}

/* The group of n ranks of coll_module, tables filled, run on tokens 1, 3;
 * mods gets the modules (the group's). */
static rt_interp *coll_group(ir_op_kind kind, int n, float *out, ir_module **mods)
{
    for (int r = 0; r < n; r++)
        mods[r] = coll_module(kind, n, r, 1);
    rt_interp *g = NULL;
    T_OK(rt_interp_init_ranks(mods, n, NULL, 4, &g));
    for (int r = 0; g && r < n; r++) {
        rt_interp *in = rt_interp_rank(g, r);
        float tab[16];
        for (int i = 0; i < 16; i++)
            tab[i] = (float)(100 * r + 10 * (i / 4) + i % 4);
        T_OK(rt_interp_set_weight(in, ir_module_find_value(mods[r], "table"), tab));
    }
    int32_t tok[2] = {1, 3}, pos[2] = {0, 1};
    if (g)
        T_OK(rt_interp_forward(g, tok, pos, 2, out));
    return g;
}

static void check_collective_semantics(void)
{
    float y[2 * 16];
    ir_module *mods[4];
    /* all_reduce over 2: row t is 10 t + c + (10 t + c + 100) */
    rt_interp *g = coll_group(IR_OP_ALL_REDUCE, 2, y, mods);
    T_CHECK(g && y[0] == 10 + 110 && y[7] == 33 + 133);
    rt_interp_free(g);
    /* all_gather over 2, axis 1: [T, 8], rank 0's 4 then rank 1's */
    g = coll_group(IR_OP_ALL_GATHER, 2, y, mods);
    T_CHECK(g && y[0] == 10 && y[3] == 13 && y[4] == 110 && y[8] == 30 && y[15] == 133);
    /* rank 1 sees the same */
    const ir_value *y1 = g ? mods[1]->outputs[0] : NULL;
    const float *v1 = y1 ? rt_interp_value(rt_interp_rank(g, 1), y1) : NULL;
    T_CHECK(v1 && v1[4] == 110);
    rt_interp_free(g);
    /* reduce_scatter over 2, axis 1: rank 0 gets columns 0, 1 of the sum */
    g = coll_group(IR_OP_REDUCE_SCATTER, 2, y, mods);
    T_CHECK(g && y[0] == 120 && y[1] == 122 && y[2] == 160);
    const ir_value *s1 = g ? mods[1]->outputs[0] : NULL;
    const float *w1 = s1 ? rt_interp_value(rt_interp_rank(g, 1), s1) : NULL;
    T_CHECK(w1 && w1[0] == 124 && w1[1] == 126);
    rt_interp_free(g);
    /* all_to_all over 2, axis 1: rank 0's block 1 is rank 1's block 0 */
    g = coll_group(IR_OP_ALL_TO_ALL, 2, y, mods);
    T_CHECK(g && y[0] == 10 && y[1] == 11 && y[2] == 110 && y[3] == 111);
    rt_interp_free(g);
    /* one rank alone: a collective of one is a copy */
    g = coll_group(IR_OP_ALL_GATHER, 1, y, mods);
    T_CHECK(g && y[0] == 10 && y[4] == 30);
    rt_interp_free(g);
}

static void check_group_errors(void)
{
    /* a collective over 2 ranks in an interpreter alone */
    ir_module *m = coll_module(IR_OP_ALL_REDUCE, 2, 0, 1);
    rt_interp *in = NULL;
    T_OK(rt_interp_init(m, NULL, 4, &in));
    int32_t tok[1] = {0}, pos[1] = {0};
    float y[16];
    if (in)
        T_ERR(rt_interp_forward(in, tok, pos, 1, y), MOEC_ERR_INVALID_ARG,
              "y: all_reduce over 2 ranks, but the interpreter runs 1");
    rt_interp_free(in);
    ir_module_free(m);
    /* the ranks run different collectives */
    ir_module *mods[2] = {coll_module(IR_OP_ALL_REDUCE, 2, 0, 1),
                          coll_module(IR_OP_ALL_GATHER, 2, 1, 1)};
    rt_interp *g = NULL;
    T_OK(rt_interp_init_ranks(mods, 2, NULL, 4, &g));
    if (g)
        T_ERR(rt_interp_forward(g, tok, pos, 1, y), MOEC_ERR_INVALID_ARG,
              "rank 1 reached all_gather y of f32[T, 4] while rank 0 reached all_reduce y of "
              "f32[T, 4]: the ranks' modules do not run the same collectives");
    rt_interp_free(g);
    /* modules in the wrong order: taken and freed all the same */
    ir_module *swapped[2] = {coll_module(IR_OP_ALL_REDUCE, 2, 1, 1),
                             coll_module(IR_OP_ALL_REDUCE, 2, 0, 1)};
    g = NULL;
    T_ERR(rt_interp_init_ranks(swapped, 2, NULL, 4, &g), MOEC_ERR_INVALID_ARG,
          "module 0 of a group of 2 ranks is rank 1 of tp 2");
    T_CHECK(g == NULL);
    /* a failing rank ends the forward with its error, naming it */
    ir_module *ok[2] = {coll_module(IR_OP_ALL_REDUCE, 2, 0, 1),
                        coll_module(IR_OP_ALL_REDUCE, 2, 1, 1)};
    T_OK(rt_interp_init_ranks(ok, 2, NULL, 4, &g));
    int32_t badtok[1] = {9};
    if (g)
        T_ERR(rt_interp_forward(g, badtok, pos, 1, y), MOEC_ERR_INVALID_ARG,
              "rank 0: ");
    if (g)
        T_ERR(rt_interp_forward(g, badtok, pos, 1, y), MOEC_ERR_INVALID_ARG,
              "token id 9 is outside the vocabulary [0, 4) of table");
    rt_interp_free(g);
}

/* Shape inference of the collectives, the embedding's and moe_routed's new
 * attributes. */
static void check_inference(void)
{
    const char *head = "module t {\n  input %tokens : i32[T]\n  input %positions : i32[T]\n"
                       "  weight %e : f32[4, 6] = \"e\"\n"
                       "  weight %gu : f32[4, 4, 6] = \"gu\"\n"
                       "  weight %d : f32[4, 6, 2] = \"d\"\n"
                       "  %x : f32[T, 6] = embedding(%tokens, %e)\n";
    static const struct {
        const char *op, *err;
    } cases[] = {
        {"%y : f32[T, 6] = all_reduce(%x) {ranks = 0}", "%y: all_reduce: ranks 0 out of range [1, 64]"},
        {"%y : f32[T, 6] = all_reduce(%x)", "missing required attribute 'ranks'"},
        {"%y : f32[T, 12] = all_gather(%x) {axis = 0, ranks = 2}", "axis 0 out of range [1, 1]"},
        {"%y : f32[T, 1] = reduce_scatter(%x) {axis = 1, ranks = 4}",
         "dim 1 of %x (f32[T, 6]) does not split into 4 ranks"},
        {"%y : f32[T, 6] = all_to_all(%x) {axis = 1, ranks = 4}",
         "dim 1 of %x (f32[T, 6]) does not split into 4 ranks"},
        {"%y : f32[T, 6] = embedding(%tokens, %e) {vocab_start = 2, vocab_size = 5}",
         "table %e's 4 rows from vocab_start 2 do not fit vocab_size 5"},
        {"%y : f32[T, 12] = all_gather(%x) {axis = 1, ranks = 3}", "f32[T, 18]"},
        {"%l : f32[T, 4] = linear(%x, %e)\n"
         "  %i : i32[T, 2], %w : f32[T, 2] = moe_topk(%l) {scoring = \"softmax\", top_k = 2}\n"
         "  %y : f32[T, 6] = moe_routed(%x, %i, %w, %gu, %d) {expert_start = 2, n_experts = 5}",
         "%y: moe_routed: 4 experts from expert_start 2 do not fit n_experts 5"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[1024];
        snprintf(text, sizeof text, "%s  %s\n  output %%y\n}\n", head, cases[i].op);
        ir_module *m = NULL;
        T_ERR(ir_module_parse(text, "c.mir", &m), MOEC_ERR_FORMAT, cases[i].err);
        ir_module_free(m);
    }
    char text[1024];
    /* a sharded module's collectives span its ranks */
    static const struct {
        const char *metas, *err;
    } ranks[] = {
        {"  meta tp = 2\n", "%v: all_reduce over 3 ranks in a module of tp 2"},
        {"  meta tp = 3\n  meta ep = 2\n",
         "module t: meta tp 3, ep 2, rank 0 do not make a rank of a split"},
        {"  meta tp = 3\n  meta rank = 3\n", "meta tp 3, ep 1, rank 3 do not make a rank"},
    };
    for (size_t i = 0; i < sizeof ranks / sizeof *ranks; i++) {
        snprintf(text, sizeof text,
                 "module t {\n%s  input %%tokens : i32[T]\n  input %%positions : i32[T]\n"
                 "  weight %%e : f32[4, 6] = \"e\"\n"
                 "  %%x : f32[T, 6] = embedding(%%tokens, %%e)\n"
                 "  %%v : f32[T, 6] = all_reduce(%%x) {ranks = 3}\n  output %%v\n}\n",
                 ranks[i].metas);
        ir_module *m = NULL;
        T_ERR(ir_module_parse(text, "r.mir", &m), MOEC_ERR_FORMAT, ranks[i].err);
        ir_module_free(m);
    }
    snprintf(text, sizeof text,
             "%s  %%y : f32[T, 18] = all_gather(%%x) {axis = 1, ranks = 3}\n"
             "  %%z : f32[T, 6] = reduce_scatter(%%y) {axis = 1, ranks = 3}\n"
             "  %%w : f32[T, 6] = all_to_all(%%z) {axis = 1, ranks = 3}\n"
             "  %%v : f32[T, 6] = all_reduce(%%w) {ranks = 3}\n  output %%v\n}\n",
             head);
    ir_module *m = NULL;
    T_OK(ir_module_parse(text, "c.mir", &m));
    ir_module_free(m);
}

/* DeepSeek-V3.2 (deepseek_v32): pass shard leaves the indexer replicated
 * (every rank selects the same tokens for its heads) and assign_streams
 * puts it on stream 1 in every rank's module: each dsa_topk there, read
 * through a join by its layer's mla_attention. */
static void check_indexer(int tp)
{
    for (int r = 0; r < tp; r++) {
        ir_module *m = rank_module("deepseek_v32", tp, 1, r);
        if (!m)
            return;
        int dsa = 0, side = 0;
        for (int k = 0; k < m->n_ops; k++) {
            const ir_op *d = m->ops[k];
            if (d->kind != IR_OP_DSA_TOPK)
                continue;
            dsa++;
            const ir_op *j = ir_module_single_user(m, d->out[0]);
            const ir_op *a = j ? ir_module_single_user(m, j->out[0]) : NULL;
            const ir_op *q = d->in[0]->def;
            /* all heads of the indexer's query (index_n_heads 8 x index_head_dim
               16): wq_b whole on each rank */
            side += d->stream == 1 && j && j->kind == IR_OP_JOIN && j->stream == 0 && a &&
                    a->kind == IR_OP_MLA_ATTENTION && q && q->kind == IR_OP_LINEAR &&
                    q->stream == 1 && q->in[1]->type.dims[0] == 8 * 16 &&
                    (q->in[1]->bind.box_rank == 0 || q->in[1]->bind.box_size[0] == 0);
        }
        printf("deepseek_v32       tp %d rank %d: %d indexers on stream 1 of %d\n", tp, r, side,
               dsa);
        T_CHECK(dsa == 3 && side == dsa);
        ir_module_free(m);
    }
}

int main(void)
{
    check_agree("deepseek_v32", &SPLITS[1]);
    check_planned("deepseek_v32", &SPLITS[1]);
    check_indexer(2);
    for (size_t i = 0; i < sizeof MODELS / sizeof *MODELS; i++) {
        for (size_t k = 0; k < sizeof SPLITS / sizeof *SPLITS; k++)
            check_agree(MODELS[i], &SPLITS[k]);
        check_planned(MODELS[i], &SPLITS[1]);
        check_planned(MODELS[i], &SPLITS[5]);
        check_collectives(MODELS[i], 2, 1);
        check_collectives(MODELS[i], 4, 2);
        check_combine_scattered(MODELS[i], 2, 2);
        check_combine_scattered(MODELS[i], 4, 4);
        check_weight_cover(MODELS[i], 2, 1);
        check_weight_cover(MODELS[i], 4, 4);
        check_weight_cover(MODELS[i], 4, 2);
    }
    for (size_t i = 0; i < sizeof FP8_SPLITS / sizeof *FP8_SPLITS; i++) {
        const char *name = FP8_SPLITS[i].name;
        for (int k = 0; k < FP8_SPLITS[i].n; k++)
            check_agree(name, &FP8_SPLITS[i].par[k]);
        check_planned(name, &FP8_SPLITS[i].par[2]);
        check_collectives(name, 2, 1);
        check_weight_cover(name, 2, 1);
        check_weight_cover(name, 2, 2);
    }
    check_collectives("qwen3_moe_fp8_tp", 4, 2);
    check_weight_cover("qwen3_moe_fp8_tp", 4, 4);
    check_weight_cover("qwen3_moe_fp8_tp", 4, 2);
    check_engine();
    check_weight_values();
    check_fp8_weight_values();
    check_fp8_checkpoint_checked();
    check_box_errors();
    check_refusals();
    check_collective_semantics();
    check_group_errors();
    check_inference();
    return t_finish("test_shard");
}
