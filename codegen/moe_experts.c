/* moe_experts.c — placeholder until the moe_experts emitter lands: reports that this op has
 * no CUDA code generator yet, so that the library links and cg_emit_op gives
 * a clear error. */
#include "codegen/cg.h"
#include "err.h"

moec_status cg_emit_moe_experts(cg_ctx *c, const ir_op *op)
{
    (void)c;
    return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "moe_experts %%%s: CUDA code generation is not implemented yet",
                    op->out[0]->name);
}
