/* pass_fuse.c — the fusion passes. Projections that read one input become
 * one GEMM over a concatenated weight (fuse_qkv_a, fuse_gate_up, and the
 * routed experts' gate_up), silu(gate) * up becomes silu_mul, and the router
 * weights move inside the expert op (moe_routed), so decode reads each weight
 * once per step and writes no [T, K, H] intermediate.
 *
 * Patterns are matched by structure (op kinds, operands, single users),
 * never by value names; names only shape the readable names of what is new.
 * Fused weights are CONCAT bindings over the checkpoint tensors, which the
 * loader assembles at load time; block-scaled (fp8) weights fuse only where
 * their scale grids join too (every part but the last spans whole blocks
 * along the axis), their scales a CONCAT of the parts' scales. A rewritten op keeps its result value (its
 * name, type and users): a linear folded into a fused GEMM becomes a slice of
 * the GEMM's output, silu becomes silu_mul, reduce_sum becomes moe_routed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/passes.h"
#include "err.h"

/* Most projections fused into one GEMM. */
#define FUSE_MAX_GROUP 8

/* ---- helpers -------------------------------------------------------------- */

/* The op that defines v, when v is an op result. */
static ir_op *def_of(const ir_value *v)
{
    return v && v->kind == IR_VALUE_OP ? v->def : NULL;
}

/* 1 when some op of kind k reads v. */
static int feeds_kind(const ir_module *m, const ir_value *v, ir_op_kind k)
{
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *op = m->ops[i];
        if (op->kind != k)
            continue;
        for (int j = 0; j < op->n_in; j++)
            if (op->in[j] == v)
                return 1;
    }
    return 0;
}

/* A weight bound to one checkpoint tensor or one stack of them: what a CONCAT
 * binding may hold as a part. */
static int is_leaf_weight(const ir_value *v)
{
    return v && v->kind == IR_VALUE_WEIGHT &&
           (v->bind.kind == IR_BIND_TENSOR || v->bind.kind == IR_BIND_STACK);
}

/* linear(x, w[, b]) without alpha whose weight (and bias) are single tensors. */
static int is_plain_linear(const ir_op *op)
{
    if (!op || op->kind != IR_OP_LINEAR || ir_op_attr(op, "alpha"))
        return 0;
    if (!is_leaf_weight(op->in[1]) || op->in[1]->bind.kind != IR_BIND_TENSOR)
        return 0;
    return op->n_in < 3 || (is_leaf_weight(op->in[2]) && op->in[2]->bind.kind == IR_BIND_TENSOR);
}

/* The extent of one scale block of block-scaled w along axis (1 on an axis
 * the blocks do not cover, such as the experts'). */
static int64_t block_along(const ir_value *w, int axis)
{
    int r = w->type.rank;
    return axis >= r - 2 ? w->scale.block[axis - (r - 2)] : 1;
}

/* The rows a scale block of the weight that joins block-scaled parts
 * ws[0..n-1] along axis: their own where every part but the last spans
 * whole blocks; else, along the rows, the largest divisor of it that
 * they all span, if the kernels' 16-row tiles still lie in one block
 * (ir_block_scale_tiles): V2-Lite's dense gate and up, 10944 rows (85.5
 * blocks of 128), join in blocks of 64 (ir_weight_refine_block_scale);
 * 0 when they cannot join. */
static int64_t join_rows(ir_value *const *ws, int n, int axis)
{
    const char *knob = getenv("MOEC_FUSE_REFINE");
    int refine = !(knob && !strcmp(knob, "0"));
    int r = ws[0]->type.rank;
    int64_t blk = block_along(ws[0], axis), g = blk;
    for (int i = 0; i + 1 < n; i++)
        g = ir_gcd(g, ws[i]->type.dims[axis]);
    if (g == blk)
        return ws[0]->scale.block[0];
    return refine && axis == r - 2 && g % 16 == 0 ? g : 0;
}

/* MOEC_FUSE_REFINE: 0 joins fp8 parts in the checkpoint's blocks only (an
 * A/B knob); 1 or unset, join_rows' finer blocks too. */
static moec_status refine_knob(void)
{
    const char *knob = getenv("MOEC_FUSE_REFINE");
    if (knob && *knob && strcmp(knob, "0") && strcmp(knob, "1"))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "MOEC_FUSE_REFINE=\"%s\": not 0 or 1", knob);
    return MOEC_OK;
}

/* 1 when weights ws[0..n-1] are leaves of one dtype and rank whose dims agree
 * on every axis but `axis`: they can be one CONCAT binding. Block-scaled
 * ones must share the block, and every part but the last span whole blocks
 * along axis, so that their scale grids join into the fused weight's (in
 * finer blocks of rows where that is what joins them: join_rows). */
static int concatenable(ir_value *const *ws, int n, int axis)
{
    for (int i = 0; i < n; i++) {
        if (!is_leaf_weight(ws[i]) || ws[i]->type.dtype != ws[0]->type.dtype ||
            ws[i]->type.rank != ws[0]->type.rank ||
            ws[i]->scale.block[0] != ws[0]->scale.block[0] ||
            ws[i]->scale.block[1] != ws[0]->scale.block[1] || ws[i]->scale.stored[0] ||
            ws[i]->scale.stored[1])
            return 0;
        for (int d = 0; d < ws[0]->type.rank; d++)
            if (d != axis && ws[i]->type.dims[d] != ws[0]->type.dims[d])
                return 0;
    }
    return ws[0]->scale.block[0] == 0 || join_rows(ws, n, axis) > 0;
}

/* Length of the longest common prefix of a and b that ends with '.'. */
static size_t dot_prefix(const char *a, const char *b)
{
    size_t keep = 0;
    for (size_t i = 0; a[i] && a[i] == b[i]; i++)
        if (a[i] == '.')
            keep = i + 1;
    return keep;
}

/* A fresh name: the dotted prefix the names share, then suffix
 * ("l0.mlp.gate", "l0.mlp.up" + "gate_up" -> "l0.mlp.gate_up"). NULL when
 * memory is exhausted. */
static const char *fused_name(ir_module *m, const char *const *names, int n, const char *suffix)
{
    size_t keep = dot_prefix(names[0], names[0]);
    for (int i = 1; i < n; i++) {
        size_t k = dot_prefix(names[0], names[i]);
        if (k < keep)
            keep = k;
    }
    char buf[512];
    snprintf(buf, sizeof buf, "%.*s%s", (int)keep, names[0], suffix);
    return ir_module_unique_name(m, buf);
}

/* 1 when some name ends with suffix. */
static int any_ends_with(const char *const *names, int n, const char *suffix)
{
    size_t ls = strlen(suffix);
    for (int i = 0; i < n; i++) {
        size_t ln = strlen(names[i]);
        if (ln >= ls && !strcmp(names[i] + ln - ls, suffix))
            return 1;
    }
    return 0;
}

/* A new weight `name`: the bindings of ws[0..n-1] (concatenable) joined
 * along axis, and their scales' bindings likewise when block-scaled. NULL
 * with the error recorded. */
static ir_value *concat_weight(ir_module *m, const char *name, ir_value *const *ws, int n, int axis)
{
    ir_binding parts[FUSE_MAX_GROUP], scales[FUSE_MAX_GROUP];
    ir_type t = ws[0]->type;
    t.dims[axis] = 0;
    for (int i = 0; i < n; i++) {
        parts[i] = ws[i]->bind;
        scales[i] = ws[i]->scale.bind;
        t.dims[axis] += ws[i]->type.dims[axis];
    }
    ir_binding b = {.kind = IR_BIND_CONCAT, .axis = axis, .n_parts = n, .parts = parts};
    ir_value *v = ir_module_add_weight_bound(m, name, t, &b);
    if (!v || ws[0]->scale.block[0] == 0)
        return v;
    ir_binding sb = {.kind = IR_BIND_CONCAT, .axis = axis, .n_parts = n, .parts = scales};
    const int64_t *blk = ws[0]->scale.block;
    int64_t rows = join_rows(ws, n, axis);
    if (ir_weight_set_block_scale(m, v, blk[0], blk[1], &sb) != MOEC_OK ||
        (rows != blk[0] && ir_weight_refine_block_scale(m, v, rows, blk[1]) != MOEC_OK))
        return NULL;
    return v;
}

/* Turns op, in place, into kind(in[0..n_in-1]) with no attributes; its
 * results stay the same values. The caller sets attributes, then calls
 * finish_same_type. */
static void op_reset(ir_op *op, ir_op_kind kind, ir_value *const *in, int n_in)
{
    ir_value *copy[IR_MAX_OPERANDS];
    for (int i = 0; i < n_in; i++)
        copy[i] = in[i];
    op->kind = kind;
    op->n_in = n_in;
    for (int i = 0; i < IR_MAX_OPERANDS; i++)
        op->in[i] = i < n_in ? copy[i] : NULL;
    op->n_attr = 0;
    memset(op->attrs, 0, sizeof op->attrs);
}

/* Infers a rewritten op's result types and checks they are what they were:
 * its users were typed against them. */
static moec_status finish_same_type(ir_module *m, ir_op *op)
{
    ir_type was[IR_MAX_RESULTS];
    for (int i = 0; i < op->n_out; i++)
        was[i] = op->out[i]->type;
    moec_status st = ir_op_finish(m, op, NULL);
    if (st != MOEC_OK)
        return moec_err_wrap(st, "rewriting %%%s as %s", op->out[0]->name, ir_op_name(op->kind));
    for (int i = 0; i < op->n_out; i++) {
        if (!ir_type_equal(&was[i], &op->out[i]->type)) {
            char a[96], b[96];
            ir_type_format(&was[i], a, sizeof a);
            ir_type_format(&op->out[i]->type, b, sizeof b);
            return MOEC_ERR(MOEC_ERR_INTERNAL, "rewriting %%%s as %s changed its type from %s to %s",
                            op->out[i]->name, ir_op_name(op->kind), a, b);
        }
    }
    return MOEC_OK;
}

/* Replaces the linears ops[0..n-1] (one input; weights, and biases when all
 * have one, concatenable along axis 0) by one linear over CONCAT weights,
 * placed just before the first of them; each original becomes a slice of
 * its columns of the fused output, so its result keeps its name and users. */
static moec_status fuse_linears(ir_module *m, ir_op *const *ops, int n, const char *act_suffix,
                                const char *w_suffix)
{
    ir_value *ws[FUSE_MAX_GROUP], *bs[FUSE_MAX_GROUP];
    const char *outs[FUSE_MAX_GROUP], *wnames[FUSE_MAX_GROUP];
    const ir_op *first = ops[0];
    for (int i = 0; i < n; i++) {
        ws[i] = ops[i]->in[1];
        bs[i] = ops[i]->n_in > 2 ? ops[i]->in[2] : NULL;
        outs[i] = ops[i]->out[0]->name;
        wnames[i] = ws[i]->name;
        if (ops[i]->id < first->id)
            first = ops[i];
    }
    const char *act = fused_name(m, outs, n, act_suffix);
    const char *wname = fused_name(m, wnames, n, w_suffix);
    if (!act || !wname)
        return MOEC_ERR(MOEC_ERR_OOM, "fusing %%%s: out of memory", outs[0]);
    ir_value *in[3] = {ops[0]->in[0], concat_weight(m, wname, ws, n, 0), NULL};
    if (!in[1])
        return moec_err_wrap(MOEC_ERR_INTERNAL, "fusing %%%s", act);
    if (bs[0]) {
        char bname[512];
        snprintf(bname, sizeof bname, "%s.bias", wname);
        const char *unique = ir_module_unique_name(m, bname);
        if (!unique)
            return MOEC_ERR(MOEC_ERR_OOM, "fusing %%%s: out of memory", act);
        if (!(in[2] = concat_weight(m, unique, bs, n, 0)))
            return moec_err_wrap(MOEC_ERR_INTERNAL, "fusing %%%s", act);
    }
    ir_op *fused = ir_module_add_op(m, IR_OP_LINEAR, in, bs[0] ? 3 : 2, &act, 1);
    if (!fused || ir_op_finish(m, fused, NULL) != MOEC_OK)
        return moec_err_wrap(MOEC_ERR_INTERNAL, "fusing %%%s", act);
    MOEC_TRY(ir_module_move_op_before(m, fused, first));
    int64_t start = 0;
    for (int i = 0; i < n; i++) {
        int64_t size = ws[i]->type.dims[0];
        op_reset(ops[i], IR_OP_SLICE, &fused->out[0], 1);
        MOEC_TRY(ir_op_set_int(m, ops[i], "axis", 1));
        MOEC_TRY(ir_op_set_int(m, ops[i], "start", start));
        MOEC_TRY(ir_op_set_int(m, ops[i], "size", size));
        MOEC_TRY(finish_same_type(m, ops[i]));
        start += size;
    }
    return MOEC_OK;
}

/* ---- fuse_qkv_a ----------------------------------------------------------- */

/* 1 when v is operand 0 (the query) of a dsa_topk, directly or through
 * reshapes and ropes. */
static int feeds_dsa_query(const ir_module *m, const ir_value *v, int depth)
{
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *op = m->ops[i];
        for (int j = 0; j < op->n_in; j++) {
            if (op->in[j] != v)
                continue;
            if (op->kind == IR_OP_DSA_TOPK && j == 0)
                return 1;
            if ((op->kind == IR_OP_RESHAPE || op->kind == IR_OP_ROPE) && depth < 4 &&
                feeds_dsa_query(m, op->out[0], depth + 1))
                return 1;
        }
    }
    return 0;
}

/* The rule: every group of two or more plain linears (no alpha; weight, and
 * bias if any, bound to single checkpoint tensors) that read the same
 * activation becomes one GEMM — unless a member's result feeds silu, mul or
 * moe_topk directly. Those groups are the MLP's gate/up pairs (fuse_gate_up's
 * work, which also fuses silu * up after) and the MoE block's input, where
 * the router gate has to stay its own small GEMM. What remains, in the
 * families, is the attention's input projections: DeepSeek's q_a_proj (or
 * q_proj) with kv_a_proj_with_mqa (in V3.2 with the indexer's wk and
 * weights_proj too), Qwen's q, k and v. A linear whose result is a
 * dsa_topk's query (through reshapes and ropes: V3.2's indexer wq_b) stays
 * its own GEMM: fused into q_b_proj, which reads the same q LoRA latent, it
 * would save only the re-read of that latent (q_lora_rank values a token, a
 * few KB at decode), and on its own it can run on the side stream with the
 * rest of the indexer beside q_b (assign_streams). A group holds the
 * linears whose weight has the seed's dtype and scale blocks (V3.2's fp8
 * projections fuse without the bf16 weights_proj); they must all have a bias
 * or none, otherwise the group is left. fp8 parts but the last span whole
 * blocks, or blocks of rows refined to what they all span (join_rows: V3.2's
 * fp8 q_a, kv_a, whose 576 rows end in half a block, and the indexer's wk,
 * in blocks of 64 rows): the group is the longest run of its first members
 * that does, the rest left to themselves. */
static int qkv_group(const ir_module *m, const ir_op *seed, ir_op **group)
{
    const ir_value *x = seed->in[0], *sw = seed->in[1];
    int n = 0;
    for (int i = 0; i < m->n_ops; i++) {
        ir_op *op = m->ops[i];
        if (op->kind != IR_OP_LINEAR || op->in[0] != x || !is_plain_linear(op) ||
            feeds_dsa_query(m, op->out[0], 0))
            continue;
        const ir_value *w = op->in[1];
        if (w->type.dtype != sw->type.dtype || w->scale.block[0] != sw->scale.block[0] ||
            w->scale.block[1] != sw->scale.block[1])
            continue;
        if (n == 0 && op != seed)
            return 0; /* seen from its first member */
        if (n == FUSE_MAX_GROUP)
            return 0;
        group[n++] = op;
    }
    if (n < 2)
        return 0;
    ir_value *ws[FUSE_MAX_GROUP], *bs[FUSE_MAX_GROUP];
    for (int i = 0; i < n; i++) {
        const ir_value *y = group[i]->out[0];
        if (feeds_kind(m, y, IR_OP_SILU) || feeds_kind(m, y, IR_OP_MUL) ||
            feeds_kind(m, y, IR_OP_MOE_TOPK))
            return 0;
        if ((group[i]->n_in > 2) != (group[0]->n_in > 2))
            return 0;
        ws[i] = group[i]->in[1];
        bs[i] = group[i]->n_in > 2 ? group[i]->in[2] : NULL;
    }
    while (n >= 2 && (!concatenable(ws, n, 0) || (bs[0] && !concatenable(bs, n, 0))))
        n--;
    return n;
}

moec_status pass_fuse_qkv_a(ir_module *m, const pass_options *opt)
{
    (void)opt;
    MOEC_TRY(refine_knob());
    for (int i = 0; i < m->n_ops; i++) {
        ir_op *op = m->ops[i];
        if (!is_plain_linear(op))
            continue;
        ir_op *group[FUSE_MAX_GROUP];
        int n = qkv_group(m, op, group);
        if (n < 2)
            continue;
        const char *outs[FUSE_MAX_GROUP];
        for (int j = 0; j < n; j++)
            outs[j] = group[j]->out[0]->name;
        /* Named after DeepSeek's "a" projections (kv_a, q_a): qkv_a. */
        int lora = any_ends_with(outs, n, "_a");
        MOEC_TRY(fuse_linears(m, group, n, lora ? "qkv_a" : "qkv", lora ? "qkv_a_proj" : "qkv_proj"));
    }
    return ir_module_dce(m);
}

/* ---- fuse_gate_up --------------------------------------------------------- */

/* mul(silu(linear(x, Wg)), linear(x, Wu)) with mul's operands in either
 * order: the gate and up linears into *g and *u. */
static int match_gate_up(const ir_op *mul, ir_op **g, ir_op **u)
{
    for (int order = 0; order < 2; order++) {
        ir_op *silu = def_of(mul->in[order]);
        ir_op *up = def_of(mul->in[1 - order]);
        if (!silu || silu->kind != IR_OP_SILU || !is_plain_linear(up))
            continue;
        ir_op *gate = def_of(silu->in[0]);
        if (!is_plain_linear(gate) || gate == up || gate->in[0] != up->in[0] ||
            gate->n_in != up->n_in)
            continue;
        ir_value *ws[2] = {gate->in[1], up->in[1]};
        if (!concatenable(ws, 2, 0) || ws[0]->type.dims[0] != ws[1]->type.dims[0])
            continue;
        if (gate->n_in > 2) {
            ir_value *bs[2] = {gate->in[2], up->in[2]};
            if (!concatenable(bs, 2, 0))
                continue;
        }
        *g = gate;
        *u = up;
        return 1;
    }
    return 0;
}

/* moe_experts(x, ids, gate, up, down) or moe_routed(x, ids, w, gate, up,
 * down): gate and up [E, I, H] become one gate_up [E, 2I, H] weight, a
 * CONCAT along axis 1 of the two stacks; other ops are left. */
static moec_status fuse_expert_gate_up(ir_module *m, ir_op *op)
{
    int gi;
    if (op->kind == IR_OP_MOE_EXPERTS && op->n_in == 5)
        gi = 2;
    else if (op->kind == IR_OP_MOE_ROUTED && op->n_in == 6)
        gi = 3;
    else
        return MOEC_OK;
    ir_value *ws[2] = {op->in[gi], op->in[gi + 1]};
    if (ws[0]->type.rank != 3 || !concatenable(ws, 2, 1) ||
        ws[0]->type.dims[1] != ws[1]->type.dims[1])
        return MOEC_OK;
    const char *names[2] = {ws[0]->name, ws[1]->name};
    const char *name = fused_name(m, names, 2, "gate_up");
    if (!name)
        return MOEC_ERR(MOEC_ERR_OOM, "fusing the experts of %%%s: out of memory", op->out[0]->name);
    ir_value *gate_up = concat_weight(m, name, ws, 2, 1);
    if (!gate_up)
        return moec_err_wrap(MOEC_ERR_INTERNAL, "fusing the experts of %%%s", op->out[0]->name);
    op->in[gi] = gate_up;
    for (int i = gi + 1; i < op->n_in - 1; i++)
        op->in[i] = op->in[i + 1];
    op->in[--op->n_in] = NULL;
    return finish_same_type(m, op);
}

moec_status pass_fuse_gate_up(ir_module *m, const pass_options *opt)
{
    (void)opt;
    MOEC_TRY(refine_knob());
    for (int i = 0; i < m->n_ops; i++) {
        ir_op *op = m->ops[i];
        ir_op *pair[2];
        if (op->kind == IR_OP_MUL && match_gate_up(op, &pair[0], &pair[1])) {
            MOEC_TRY(fuse_linears(m, pair, 2, "gate_up", "gate_up_proj"));
        } else {
            MOEC_TRY(fuse_expert_gate_up(m, op));
        }
    }
    return ir_module_dce(m);
}

/* ---- fuse_silu_and_mul ---------------------------------------------------- */

/* slice(gu) over gu's last axis from start for size; gu into *src. */
static int is_last_axis_slice(const ir_op *op, int64_t start, int64_t size, ir_value **src)
{
    if (!op || op->kind != IR_OP_SLICE)
        return 0;
    const ir_type *t = &op->in[0]->type;
    if (ir_op_attr_int(op, "axis", -1) != t->rank - 1 || ir_op_attr_int(op, "start", -1) != start ||
        ir_op_attr_int(op, "size", -1) != size)
        return 0;
    *src = op->in[0];
    return 1;
}

/* mul(silu(slice(gu, first half)), slice(gu, second half)), the halves of
 * gu's last axis, mul's operands in either order: silu into *silu_out. The
 * silu result must have mul as its only user (it is about to change). */
static int match_silu_mul(const ir_module *m, const ir_op *mul, ir_op **silu_out, ir_value **gu)
{
    for (int order = 0; order < 2; order++) {
        ir_op *silu = def_of(mul->in[order]);
        if (!silu || silu->kind != IR_OP_SILU || ir_module_single_user(m, silu->out[0]) != mul)
            continue;
        const ir_op *gate = def_of(silu->in[0]);
        const ir_op *up = def_of(mul->in[1 - order]);
        if (!gate || gate->kind != IR_OP_SLICE)
            continue;
        const ir_type *t = &gate->in[0]->type;
        int64_t full = t->dims[t->rank - 1];
        ir_value *a, *b;
        if (full % 2 || !is_last_axis_slice(gate, 0, full / 2, &a) ||
            !is_last_axis_slice(up, full / 2, full / 2, &b) || a != b)
            continue;
        *silu_out = silu;
        *gu = a;
        return 1;
    }
    return 0;
}

moec_status pass_fuse_silu_and_mul(ir_module *m, const pass_options *opt)
{
    (void)opt;
    for (int i = 0; i < m->n_ops; i++) {
        ir_op *mul = m->ops[i];
        ir_op *silu;
        ir_value *gu;
        if (mul->kind != IR_OP_MUL || !match_silu_mul(m, mul, &silu, &gu))
            continue;
        /* The silu op becomes silu_mul(gu): its result, same name and type,
         * now holds silu(gate) * up, and mul's users read it. */
        op_reset(silu, IR_OP_SILU_MUL, &gu, 1);
        MOEC_TRY(finish_same_type(m, silu));
        ir_module_replace_uses(m, mul->out[0], silu->out[0]);
    }
    return ir_module_dce(m);
}

/* ---- fuse_router_weight --------------------------------------------------- */

/* reduce_sum(mul(moe_experts(x, ids, ...), reshape(w [T, K]) [T, K, 1])) {axis = 1}
 * with single users along the way: the expert op into *experts, w into *w. */
static int match_routed(const ir_module *m, const ir_op *sum, ir_op **experts, ir_value **w)
{
    if (sum->kind != IR_OP_REDUCE_SUM || ir_op_attr_int(sum, "axis", -1) != 1)
        return 0;
    const ir_op *mul = def_of(sum->in[0]);
    if (!mul || mul->kind != IR_OP_MUL || ir_module_single_user(m, mul->out[0]) != sum)
        return 0;
    ir_op *ex = def_of(mul->in[0]);
    const ir_op *rs = def_of(mul->in[1]);
    if (!ex || ex->kind != IR_OP_MOE_EXPERTS || !rs || rs->kind != IR_OP_RESHAPE ||
        ir_module_single_user(m, ex->out[0]) != mul || ir_module_single_user(m, rs->out[0]) != mul)
        return 0;
    if (strcmp(ir_op_attr_str(ex, "act", "silu"), "silu"))
        return 0;
    const ir_type *et = &ex->out[0]->type, *wt = &rs->in[0]->type, *w3 = &rs->out[0]->type;
    const ir_type *it = &ex->in[1]->type;
    if (et->rank != 3 || wt->rank != 2 || w3->rank != 3 || wt->dtype != IR_DTYPE_F32)
        return 0;
    if (wt->dims[1] != et->dims[1] || w3->dims[1] != et->dims[1] || w3->dims[2] != 1 ||
        it->rank != 2 || it->dims[1] != et->dims[1])
        return 0;
    *experts = ex;
    *w = rs->in[0];
    return 1;
}

moec_status pass_fuse_router_weight(ir_module *m, const pass_options *opt)
{
    (void)opt;
    for (int i = 0; i < m->n_ops; i++) {
        ir_op *sum = m->ops[i];
        ir_op *ex;
        ir_value *w;
        if (!match_routed(m, sum, &ex, &w))
            continue;
        /* reduce_sum becomes moe_routed(x, ids, w, <expert weights>): same
         * result value, the weighted sum over the k experts. */
        ir_value *in[IR_MAX_OPERANDS];
        int n = 0;
        in[n++] = ex->in[0];
        in[n++] = ex->in[1];
        in[n++] = w;
        for (int j = 2; j < ex->n_in; j++)
            in[n++] = ex->in[j];
        op_reset(sum, IR_OP_MOE_ROUTED, in, n);
        MOEC_TRY(ir_op_set_float(m, sum, "scale", 1.0));
        MOEC_TRY(finish_same_type(m, sum));
    }
    return ir_module_dce(m);
}
