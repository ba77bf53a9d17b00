/* moe_routed.h — the grouped expert kernels of codegen/moe_routed.c (align by
 * expert, gate_up with silu_mul, down, sum over k), shared with
 * codegen/moe_experts.c, which runs them without the router weights. */
#ifndef MOEC_CG_MOE_ROUTED_H
#define MOEC_CG_MOE_ROUTED_H

#include "codegen/cg.h"

/* One MoE expert computation: x [T, H], ids i32[T, K], gate_up [E, 2I, H]
 * (up NULL) or gate and up [E, I, H], down [E, H, I]. With w (f32[T, K])
 * the result is [T, H]: sum_k scale * w[t,k] * expert output (unsummed:
 * [T, K, H], each slot's scale * w[t,k] * expert output); without, it is
 * [T, K, H], the expert outputs themselves. */
typedef struct cg_moe_desc {
    const ir_op *op;
    const ir_value *x, *ids, *w, *gate, *up, *down, *out;
    double scale;
    int64_t e0; /* the first expert of the weights (expert parallel; ids are global) */
    int unsummed; /* routed: out is [T, K, H], the weighted outputs unsummed */
} cg_moe_desc;

moec_status cg_moe_emit(cg_ctx *c, const cg_moe_desc *d);

/* Buckets up to this many tokens align a moe_routed's slots in the kernel
 * of the moe_topk before it (codegen/moe_topk.c). (H100, 2026-11-24,
 * V2-Lite step, graph replay: 2.703 ms against 2.722 without it at batch
 * 1, but 7.529 against 7.400 at batch 8, where one block of a warp per
 * token is slower than the separate top-k and align: 1.) */
#define CG_MOE_TOPK_ALIGN_MAX_T 1

/* The moe_routed that moe_topk op `topk` can align the slots of in its own
 * kernel, NULL if none: the bucket has at most max_t tokens
 * (CG_MOE_TOPK_ALIGN_MAX_T, or more where the router's logits are computed
 * in the same kernel, codegen/moe_topk.c), that op alone reads the ids and weights, it follows topk on its
 * stream with nothing of that stream between them, and its weights hold
 * every expert (and MOEC_MOE_TOPK_ALIGN is not 0, for comparisons). Its
 * rows per expert block and block count in *bm, *nb.
 * The moe_topk reserves the three scratch arrays (sorted slots, block
 * experts, count used) and records them in c (moe_aligned,
 * moe_align_off); that moe_routed then launches no align kernel. */
const ir_op *cg_moe_topk_routed(const cg_ctx *c, const ir_op *topk, int max_t, int *bm,
                               long long *nb);
/* The moe_routed whose slots moe_topk op `topk`'s kernel aligns in this
 * bucket (cg_moe_topk_routed up to CG_MOE_TOPK_ALIGN_MAX_T tokens, or up
 * to the bucket's where that kernel computes the router's logits too),
 * NULL if none; *bm, *nb as there. */
const ir_op *cg_moe_topk_aligned(const cg_ctx *c, const ir_op *topk, int *bm, long long *nb);
/* 1 when linear lin is the router whose logits the aligning top-k kernel
 * after it computes itself (codegen/moe_topk.c): lin then emits no step. */
int cg_linear_in_topk(const cg_ctx *c, const ir_op *lin);

/* The align kernel's body (sorted, blk_expert, n_used from ids): constants
 * E, E0, K, T, BM, NB and NT (threads) in scope. */
extern const char CG_MOE_ALIGN_BODY[];

/* What cg_moe_emit's steps share: the shapes, the expert blocks (nb of
 * bm slots) and the scratch offsets of the sorted slots, the blocks'
 * experts, the count used, h [T*K, I] and (routed) y [T*K, H]. */
typedef struct cg_moe_layout {
    long long H, K, E, I, nb;
    int bm, fused;
    int h16; /* h (silu(gate) * up) stored as bf16, else f32 */
    size_t off_sorted, off_blk, off_used, off_h, off_y;
} cg_moe_layout;

/* The gate_up step's arguments (x, gate, up, with `scales` their block
 * scales, the sorted slots, the blocks' experts, the count used, h) and the
 * down step's (h, down, with `scales` its block scales, the sorted slots,
 * the blocks' experts, the count used, then the router weights, the scale
 * and y (the result when unsummed) when routed, else the result). */
void cg_moe_gate_up_args(ir_step *s, const cg_moe_desc *d, const cg_moe_layout *l, int scales);
void cg_moe_down_args(ir_step *s, const cg_moe_desc *d, const cg_moe_layout *l, int scales);

/* A step of expert GEMM kernel k: l's expert blocks by nd output rows in
 * blocks of `rows`, nw warps a block, smem bytes of dynamic shared memory
 * (its arguments left to the caller); NULL out of memory. */
ir_step *cg_moe_gemm_step(cg_ctx *c, const cg_moe_desc *d, const cg_moe_layout *l, int k, int nw,
                          long long rows, long long nd, size_t smem);

/* Whether the kernels address fp8 weight w (an expert's or a dense
 * linear's) in fragment tiles (cg_options.fp8_tiles and ir_weight_tiled,
 * unless MOEC_FP8_ROWS_TIMING=1 for an A/B in time) */
int cg_weight_tl(const cg_ctx *c, const ir_value *w);
/* An expert weight's block scales as kernel constants (W8, SBN, SBK, SR,
 * SC, UROW: up's first row in a fused gate_up; TL: its codes lie in
 * fragment tiles, cg_weight_tl, addressed through moec_woff) and the
 * kernel-name tag of its blocks (and "_tl"); W8 and TL false and null
 * `names` (the kernel's scale parameters) for a weight not kept in fp8. */
void cg_moe_scale_consts(const cg_ctx *c, const ir_value *w, long long urow, const char *names,
                         char *tag, size_t tcap, char *decl, size_t dcap);

#endif
