/* pass_fold_scale.c — fold_routed_scale: DeepSeek's routed_scaling_factor s
 * (the router's `scaling`) applied exactly once, where it costs nothing.
 *
 * In bf16 and f32 it moves from the router weights into moe_routed's
 * `scale`, which multiplies the router weight in the down GEMM's epilogue.
 * In f16, scaling the routed sum by s (2.5 in DeepSeek-V3) can overflow, so,
 * as vLLM does (seed 001), the routed sum stays unscaled, the shared
 * expert's down_proj is divided by s and the residual add multiplies the
 * MoE output by s: residual + s * (routed + shared / s). Without a shared
 * expert (or where that shape does not match), f16 takes the plain form.
 *
 * Needs moe_routed (fuse_router_weight); a router whose weights reach
 * anything else keeps its scaling. */

#include "compiler/passes.h"
#include "err.h"

/* The dtype the module is compiled for: its compute_dtype meta (set by the
 * pipeline driver), else the options', else bf16. */
static ir_dtype compute_dtype(const ir_module *m, const pass_options *opt)
{
    const ir_attr *a = ir_module_meta(m, "compute_dtype");
    ir_dtype dt;
    if (a && a->kind == IR_ATTR_STR && a->s && ir_dtype_from_name(a->s, &dt) == 0)
        return dt;
    return opt ? opt->compute_dtype : IR_DTYPE_BF16;
}

/* The op defining v, when v is an op result. */
static ir_op *def_of(const ir_value *v)
{
    return v && v->kind == IR_VALUE_OP ? v->def : NULL;
}

/* An add that has no alpha yet (or alpha 1). */
static int is_plain_add(const ir_op *op)
{
    return op && op->kind == IR_OP_ADD && ir_op_attr_float(op, "alpha", 1.0) == 1.0;
}

/* The f16 form's shape around routed (a moe_routed result):
 *   moe_out = add(routed, shared) (either order), shared = linear(...) only used there,
 *   resid = add(residual, moe_out) (either order), moe_out only used there,
 * with the operands of resid of one type (so they can swap). The shared
 * linear into *shared_lin, the residual add into *resid, moe_out into *moe_out. */
static int match_shared(const ir_module *m, const ir_value *routed, ir_op **shared_lin,
                        ir_op **resid, ir_value **moe_out)
{
    ir_op *join = ir_module_single_user(m, routed);
    if (!is_plain_add(join) || join->in[0] == join->in[1])
        return 0;
    ir_value *shared = join->in[0] == routed ? join->in[1] : join->in[0];
    ir_op *lin = def_of(shared);
    if (!lin || lin->kind != IR_OP_LINEAR || ir_op_attr_float(lin, "alpha", 1.0) != 1.0 ||
        ir_module_single_user(m, shared) != join)
        return 0;
    ir_op *add = ir_module_single_user(m, join->out[0]);
    if (!is_plain_add(add) || add->in[0] == add->in[1] ||
        !ir_type_equal(&add->in[0]->type, &add->in[1]->type))
        return 0;
    *shared_lin = lin;
    *resid = add;
    *moe_out = join->out[0];
    return 1;
}

moec_status pass_fold_routed_scale(ir_module *m, const pass_options *opt)
{
    ir_dtype dt = compute_dtype(m, opt);
    for (int i = 0; i < m->n_ops; i++) {
        ir_op *routed = m->ops[i];
        if (routed->kind != IR_OP_MOE_ROUTED)
            continue;
        ir_op *topk = def_of(routed->in[2]);
        if (!topk || topk->kind != IR_OP_MOE_TOPK || topk->out[1] != routed->in[2] ||
            ir_module_single_user(m, routed->in[2]) != routed)
            continue;
        double s = ir_op_attr_float(topk, "scaling", 1.0);
        if (s == 1.0)
            continue;
        /* The factor the routed sum carries in all: the router's and any
         * scale moe_routed already has. */
        double total = s * ir_op_attr_float(routed, "scale", 1.0);
        ir_op *lin, *resid;
        ir_value *moe_out;
        MOEC_TRY(ir_op_set_float(m, topk, "scaling", 1.0));
        if (dt == IR_DTYPE_F16 && match_shared(m, routed->out[0], &lin, &resid, &moe_out)) {
            /* resid = residual + total * moe_out: moe_out goes second. */
            if (resid->in[0] == moe_out) {
                resid->in[0] = resid->in[1];
                resid->in[1] = moe_out;
            }
            MOEC_TRY(ir_op_set_float(m, routed, "scale", 1.0));
            MOEC_TRY(ir_op_set_float(m, lin, "alpha", 1.0 / total));
            MOEC_TRY(ir_op_set_float(m, resid, "alpha", total));
        } else {
            MOEC_TRY(ir_op_set_float(m, routed, "scale", total));
        }
    }
    return ir_module_dce(m);
}
