/* moe_experts.c — the unfused MoE experts op (docs/IR.md, moe_experts): each
 * chosen expert's output [T, K, H], without router weights or the sum over
 * k. Passes fuse it into moe_routed in compiled models; this emitter exists
 * so the op can be run and tested on its own. It reuses the grouped
 * kernels of moe_routed.c (align, gate_up, down), the down GEMM writing each
 * slot's row straight into the result. */
#include "codegen/moe_routed.h"

#include <string.h>

#include "err.h"

moec_status cg_emit_moe_experts(cg_ctx *c, const ir_op *op)
{
    if (op->n_in != 4 && op->n_in != 5)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moe_experts %%%s: %d operands (4 or 5)",
                        op->out[0]->name, op->n_in);
    const char *act = ir_op_attr_str(op, "act", "silu");
    if (strcmp(act, "silu") != 0)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "moe_experts %%%s: act \"%s\" (only silu)",
                        op->out[0]->name, act);
    cg_moe_desc d = {
        .op = op,
        .x = op->in[0],
        .ids = op->in[1],
        .w = NULL,
        .gate = op->in[2],
        .up = op->n_in == 5 ? op->in[3] : NULL,
        .down = op->in[op->n_in - 1],
        .out = op->out[0],
        .scale = 1.0,
    };
    return cg_moe_emit(c, &d);
}
