/* pass_fuse_launch.c — two ops folded into the op that reads them, one
 * kernel launch less each per MoE layer at small batch (issue 15), both
 * after assign_streams and fuse_add3_rms_norm:
 *
 * fuse_moe_sum: a moe_routed read only by an add_rms_norm as its b keeps
 * its K weighted expert outputs (`unsummed`, [T, K, H], fp32) and the
 * add_rms_norm sums them while it reads its row, where the expert kernels
 * summed them in a launch of their own (docs/IR.md, add_rms_norm).
 *
 * fuse_silu_mul_linear: a silu_mul read only by a linear (the shared
 * expert's down projection) becomes that linear's `act`: the few-token
 * kernel computes silu(gate) * up while it loads its input (larger buckets
 * run the silu_mul ahead of their GEMM, codegen/linear.c). An fp8 weight
 * only with MOEC_FUSE_SILU_FP8=1, and where the staged kernel of larger
 * buckets can compute h as it loads x too (codegen/fp8_tc.c: a bf16
 * compute dtype, K in 64s, scale blocks of 16 rows and 64 columns at
 * least, the staged kernels not turned off by MOEC_FP8_KERNEL=old): its
 * few-token and staged kernels with act were slower than the silu_mul
 * kernel before the plain ones (H200, 2026-11-29, fp8 V2-Lite step: 1.564
 * against 1.520 ms at batch 1, 6.518 against 6.396 at 32; again on
 * 2026-11-30, 3.794 / 5.623 / 6.809 against 3.625 / 5.570 / 6.635 at 8 /
 * 32 / 64), so fp8's silu_mul keeps its kernel by default.
 *
 * Matched by structure, never by value names; the interpreter computes the
 * fused ops exactly as the pairs they replace. */
#include <stdlib.h>
#include <string.h>

#include "compiler/passes.h"
#include "err.h"

/* A moe_routed result that add_rms_norm n reads as b and nothing else
 * reads, its weights holding every expert, on n's stream. */
static ir_op *summable_routed(const ir_module *m, const ir_op *n)
{
    const ir_value *b = n->in[1];
    ir_op *r = pass_def_of(b, IR_OP_MOE_ROUTED);
    if (!r || r->stream != n->stream || b->type.rank != 2 || ir_module_single_user(m, b) != n ||
        (n->n_in == 4 && n->in[3] == b) || ir_op_attr_int(r, "unsummed", 0))
        return NULL;
    int64_t E = r->in[r->n_in - 1]->type.dims[0];
    if (ir_op_attr_int(r, "expert_start", 0) != 0 || ir_op_attr_int(r, "n_experts", E) != E)
        return NULL;
    return r;
}

moec_status pass_fuse_moe_sum(ir_module *m, const pass_options *opt)
{
    (void)opt;
    for (int i = 0; i < m->n_ops; i++) {
        ir_op *n = m->ops[i];
        ir_op *r = n->kind == IR_OP_ADD_RMS_NORM ? summable_routed(m, n) : NULL;
        if (!r)
            continue;
        MOEC_TRY(ir_op_set_int(m, r, "unsummed", 1));
        moec_status st = ir_op_finish(m, r, NULL);
        if (st == MOEC_OK)
            st = ir_op_finish(m, n, NULL);
        if (st != MOEC_OK)
            return moec_err_wrap(st, "fuse_moe_sum %%%s", r->out[0]->name);
    }
    return MOEC_OK;
}

/* Whether the linear of fp8 weight w and input width k may take act
 * silu_mul (the header's conditions; on: MOEC_FUSE_SILU_FP8=1). */
static int fp8_act_fits(const ir_value *w, int64_t k, const pass_options *opt, int on)
{
    const char *fk = getenv("MOEC_FP8_KERNEL");
    return on && opt->compute_dtype == IR_DTYPE_BF16 && k % 64 == 0 && ir_block_scale_tiles(w) &&
           !(fk && !strcmp(fk, "old"));
}

moec_status pass_fuse_silu_mul_linear(ir_module *m, const pass_options *opt)
{
    pass_options dflt;
    if (!opt) {
        pass_options_default(&dflt);
        opt = &dflt;
    }
    const char *knob = getenv("MOEC_FUSE_SILU_FP8");
    if (knob && *knob && strcmp(knob, "0") && strcmp(knob, "1"))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "MOEC_FUSE_SILU_FP8=\"%s\": not 0 or 1", knob);
    int fp8_on = knob && !strcmp(knob, "1"), changed = 0;
    for (int i = 0; i < m->n_ops; i++) {
        ir_op *l = m->ops[i];
        if (l->kind != IR_OP_LINEAR || ir_op_attr(l, "act"))
            continue;
        const ir_value *h = l->in[0];
        ir_op *sm = pass_def_of(h, IR_OP_SILU_MUL);
        if (!sm || sm->stream != l->stream || h->type.rank != 2 ||
            ir_module_single_user(m, h) != l ||
            (l->in[1]->type.dtype == IR_DTYPE_F8E4M3 &&
             !fp8_act_fits(l->in[1], h->type.dims[1], opt, fp8_on)))
            continue;
        l->in[0] = sm->in[0];
        MOEC_TRY(ir_op_set_str(m, l, "act", "silu_mul"));
        moec_status st = ir_op_finish(m, l, NULL);
        if (st != MOEC_OK)
            return moec_err_wrap(st, "fuse_silu_mul_linear %%%s", l->out[0]->name);
        changed = 1;
    }
    return changed ? ir_module_dce(m) : MOEC_OK;
}
