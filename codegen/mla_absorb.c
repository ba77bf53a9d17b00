/* mla_absorb.c — MLA's absorbed up-projections as one strided-batched
 * cuBLASLt GEMM over the H heads (no generated kernel). kv_b [H*(dn+dv), r]
 * holds per head h the rows W_UK[h] (dn of them) then W_UV[h] (dv).
 *
 * mla_qabsorb, q_c[t,h,:] = q_nope[t,h,:] W_UK[h] ([dn, r] row-major): in
 * cuBLASLt's column-major terms per head C (r x T, ldc = H*r) = A (W_UK[h]
 * read as r x dn, lda = r, not transposed) * B (q_nope[:,h,:] read as dn x T,
 * ldb = H*dn); batch strides (dn+dv)*r, dn, r.
 *
 * mla_vabsorb, o[t,h,:] = W_UV[h] ([dv, r]) o_c[t,h,:]: C (dv x T, ldc =
 * H*dv) = A^T (W_UV[h] read as r x dv, lda = r, transposed) * B (o_c[:,h,:]
 * read as r x T, ldb = H*r); batch strides (dn+dv)*r, r, dv. A starts dn
 * rows into kv_b: the weight argument's i is that byte offset. */
#include "codegen/cg.h"
#include "err.h"

moec_status cg_emit_mla_absorb(cg_ctx *c, const ir_op *op)
{
    int q = op->kind == IR_OP_MLA_QABSORB;
    const ir_value *x = op->in[0], *kv_b = op->in[1], *y = op->out[0];
    int64_t dn = ir_op_attr_int(op, "qk_nope_head_dim", -1),
            dv = ir_op_attr_int(op, "v_head_dim", -1);
    if (x->type.rank != 3 || kv_b->type.rank != 2 || y->type.rank != 3 || dn < 1 || dv < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s %%%s: wants x [T, H, d], kv_b [H*(dn+dv), r] and the head dims",
                        ir_op_name(op->kind), y->name);
    int64_t H = x->type.dims[1], r = kv_b->type.dims[1];
    if (kv_b->type.dims[0] != H * (dn + dv) || x->type.dims[2] != (q ? dn : r) ||
        y->type.dims[1] != H || y->type.dims[2] != (q ? r : dv))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s %%%s: shapes do not agree with kv_b %%%s [%lld, %lld] for %lld heads "
                        "of dn %lld, dv %lld",
                        ir_op_name(op->kind), y->name, kv_b->name, (long long)kv_b->type.dims[0],
                        (long long)r, (long long)H, (long long)dn, (long long)dv);
    ir_dtype da = cg_storage(c, kv_b), db = cg_storage(c, x), dc = cg_storage(c, y);
    if (da != db || da == IR_DTYPE_I32 || dc == IR_DTYPE_I32)
        return MOEC_ERR(
            MOEC_ERR_UNSUPPORTED,
            "%s %%%s: kv_b %%%s is stored %s but %%%s %s; cuBLASLt wants one input type",
            ir_op_name(op->kind), y->name, kv_b->name, ir_dtype_name(da), x->name,
            ir_dtype_name(db));
    if (H * (dn + dv) * r > INT32_MAX)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "%s %%%s: kv_b is too large", ir_op_name(op->kind),
                        y->name);
    ir_step *s = cg_step(c, IR_STEP_GEMM, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: out of memory", ir_op_name(op->kind), y->name);
    ir_gemm *g = &s->gemm;
    g->n = c->T;
    g->batch = (int)H;
    g->lda = r;
    g->stride_a = (dn + dv) * r;
    g->type_a = da;
    g->type_b = db;
    g->type_c = dc;
    g->alpha = 1.0f;
    g->a = cg_arg_act(kv_b);
    g->b = cg_arg_act(x);
    g->c = cg_arg_act(y);
    if (q) {
        g->trans_a = 0;
        g->m = (int)r;
        g->k = (int)dn;
        g->ldb = H * dn;
        g->stride_b = dn;
        g->ldc = H * r;
        g->stride_c = r;
    } else {
        g->trans_a = 1;
        g->m = (int)dv;
        g->k = (int)r;
        g->ldb = H * r;
        g->stride_b = r;
        g->ldc = H * dv;
        g->stride_c = dv;
        g->a.i = dn * r * (int64_t)ir_dtype_size(da);
    }
    return MOEC_OK;
}
