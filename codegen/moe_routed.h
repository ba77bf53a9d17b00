/* moe_routed.h — the grouped expert kernels of codegen/moe_routed.c (align by
 * expert, gate_up with silu_mul, down, sum over k), shared with
 * codegen/moe_experts.c, which runs them without the router weights. */
#ifndef MOEC_CG_MOE_ROUTED_H
#define MOEC_CG_MOE_ROUTED_H

#include "codegen/cg.h"

/* One MoE expert computation: x [T, H], ids i32[T, K], gate_up [E, 2I, H]
 * (up NULL) or gate and up [E, I, H], down [E, H, I]. With w (f32[T, K])
 * the result is [T, H]: sum_k scale * w[t,k] * expert output; without, it
 * is [T, K, H], the expert outputs themselves. */
typedef struct cg_moe_desc {
    const ir_op *op;
    const ir_value *x, *ids, *w, *gate, *up, *down, *out;
    double scale;
    int64_t e0; /* the first expert of the weights (expert parallel; ids are global) */
} cg_moe_desc;

moec_status cg_moe_emit(cg_ctx *c, const cg_moe_desc *d);

#endif
