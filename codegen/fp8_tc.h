/* fp8_tc.h — fp8 (block-scaled e4m3) weights on tensor cores with the
 * activations staged in shared memory (codegen/fp8_tc.c): the dense linear
 * (called by codegen/linear.c; bf16 weights too) and the routed experts'
 * gate_up and down GEMMs (called by codegen/moe_routed.c). Each block
 * copies its tokens' x (bf16) into shared memory once and streams a slab
 * of weight rows with 16-byte loads, several 64-wide k chunks in flight
 * per lane, the codes widened exactly to bf16 in registers
 * (moec_e4m3x4_bf16, no conversion unit) and each chunk's m16n8k16
 * products added times its block scale (moec_tc_chunk). */
#ifndef MOEC_CG_FP8_TC_H
#define MOEC_CG_FP8_TC_H

#include "codegen/moe_routed.h"

/* Whether linear op (x [T, K] bf16, w [N, K] fp8 or bf16) fits the
 * staged kernel: K a multiple of 64, an fp8 w's scale blocks whole
 * 64-wide k chunks and 16-row tiles, act silu_mul (x [T, 2K]) only with a
 * bf16 w and compute dtype, an arch with bf16 tensor cores and cp.async,
 * x within the shared memory at 8 tokens a group. The caller checks that
 * y and the bias are not integers. */
int cg_tc_linear_fits(const cg_ctx *c, const ir_op *op);
/* y = alpha x w^T (+ bias) of every token of the bucket: one kernel, its
 * blocks a slab of rows and (on sm_90) a share of K, the shares of a slab
 * a thread block cluster that sums them in distributed shared memory.
 * `io` is the kernel-name suffix of x, y and bias dtypes and the blocks;
 * `decl` declares W8 and the block scales' constants (SBN, SBK, SC; with
 * a bf16 w, ws null). Where no L2 prefetch runs before the programmatic
 * wait, the warps' first weights load there (MOEC_LINEAR_TC_PRE=0: not). */
moec_status cg_tc_linear(cg_ctx *c, const ir_op *op, double alpha, const char *io,
                         const char *decl);
/* The arguments of a tensor-core linear's step (this one and
 * codegen/linear.c's emit_mma): x, the weight (fp8 codes or bf16), where
 * `scales` the codes' block scales, the bias (the weight, unread, without
 * one), alpha, y. */
void cg_mma_linear_args(ir_step *s, const ir_op *op, double alpha, int scales);

/* Whether the experts of d fit the staged kernels with blocks of bm slots:
 * bf16 x, fp8 gate, up and down in 64-wide k chunks and 16-row tiles
 * inside their blocks (up from row `urow` of gate_up), H and I multiples
 * of 64, a block's x and h rows within the shared memory. */
int cg_fp8_tc_moe_fits(const cg_ctx *c, const cg_moe_desc *d, long long urow, int bm);
/* The slots per expert block of the staged kernels: the bucket's mean
 * slots per expert (times MOEC_FP8_TC_BM_HEAD, an A/B knob, default 1) as
 * a power of two in [8, 64] (8 below), halved while a block's rows do not
 * fit the shared memory; 0 when 8 do not. */
int cg_fp8_tc_moe_rows(const cg_ctx *c, const cg_moe_desc *d, long long urow);
/* The gate_up (silu(gate x) * up x into h, bf16) and down (h into y)
 * steps of the staged experts over l's expert blocks. */
moec_status cg_fp8_tc_moe_gate_up(cg_ctx *c, const cg_moe_desc *d, const cg_moe_layout *l);
moec_status cg_fp8_tc_moe_down(cg_ctx *c, const cg_moe_desc *d, const cg_moe_layout *l);

#endif
