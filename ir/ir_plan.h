/* plan.h — what the CUDA runtime executes: per batch bucket, one cubin and
 * a launch table of steps (generated kernels, cuBLASLt GEMMs, stream fork
 * and join), with every pointer described symbolically (an activation at its
 * planned arena offset, a weight, a KV pool, a step input) so that the plan
 * can be built on a machine with no GPU, written to a file, and bound to
 * device memory at load. codegen/ builds it; runtime/ executes it and never
 * depends on codegen/. See docs/CUDA.md. */
#ifndef MOEC_IR_PLAN_H
#define MOEC_IR_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "ir/ir.h"

typedef enum ir_arg_kind {
    IR_ARG_ACT,     /* index: value id; pointer = arena + mem_offset * T */
    IR_ARG_WEIGHT,  /* index: value id of a weight; its device copy */
    IR_ARG_KV,      /* index: op id of an attention op; i: 0 = first pool (k, or kv_c
                       for MLA, or dsa_topk's keys), 1 = second pool (v, or k_pe; of the
                       module's first dsa_topk: the index scores, docs/CUDA.md) */
    IR_ARG_INPUT,   /* index: an ir_input */
    IR_ARG_SCRATCH, /* i: byte offset into the bucket's scratch buffer */
    IR_ARG_CONFIG,  /* index: an ir_config value fixed at load (i32) */
    IR_ARG_I32,     /* i: a literal int */
    IR_ARG_F32,     /* f: a literal float */
} ir_arg_kind;

/* Per-step device inputs, at fixed addresses (graphs replay over them). */
typedef enum ir_input {
    IR_INPUT_TOKENS = 0,   /* i32[T] */
    IR_INPUT_POSITIONS,    /* i32[T]: position of each token in its sequence */
    IR_INPUT_SLOTS,        /* i32[T]: sequence slot of each token, -1 for padding */
    IR_INPUT_BLOCK_TABLE,  /* i32[max_seqs, max_blocks]: KV block of each slot's pages */
    IR_INPUT_SAMPLED,      /* i32[T]: argmax of each token's logits (output) */
    /* the device sampler's (codegen/sample.c; ir/ir_sample.h): */
    IR_INPUT_SAMPLE_ROWS,  /* ir_sample_row[T]: each token row's sampling, written per step */
    IR_INPUT_SAMPLE_PENS,  /* ir_sample_pen[]: the rows' penalty entries, written per step */
    IR_INPUT_SAMPLE_TOKENS, /* i32[T]: the token drawn for each row sampled (output) */
    IR_INPUT_SAMPLE_LOGPROBS, /* f32[T]: its log probability (output) */
    IR_INPUT_SPLIT_COUNTERS, /* u32[IR_SPLIT_COUNTERS]: zero at load; a split attention
                              * kernel counts its blocks' arrival in them, and the last
                              * block sets them back to zero (codegen/attn_common.h) */
    IR_INPUT_COUNT,
} ir_input;

/* Entries of IR_INPUT_SPLIT_COUNTERS: one per (token, head group) of a split
 * attention kernel that merges its own splits. */
#define IR_SPLIT_COUNTERS 4096

/* IR_INPUT_SAMPLED of a token whose logits hold a NaN or an infinity. */
#define IR_SAMPLED_NONFINITE (-1)

/* Values chosen when the plan is loaded, not compiled in. */
typedef enum ir_config {
    IR_CONFIG_MAX_BLOCKS = 0, /* columns of the block table: pages per sequence */
    IR_CONFIG_COUNT,
} ir_config;

typedef struct ir_arg {
    ir_arg_kind kind;
    int index;
    int64_t i;   /* ACT, WEIGHT, INPUT: a byte offset added to the pointer;
                    SCRATCH: the offset; I32: the value */
    double f;
} ir_arg;

typedef enum ir_step_kind {
    IR_STEP_KERNEL, /* a generated kernel: kernel index, grid, block, smem, args */
    IR_STEP_GEMM,   /* cuBLASLt: C[batch][m x n] = alpha * op(A) op(B) (+ bias), column-major */
    IR_STEP_FORK,   /* stream 1 waits for stream 0 (event) */
    IR_STEP_JOIN,   /* stream 0 waits for stream 1 (event) */
    IR_STEP_COLLECTIVE, /* a collective over the plan's ranks on the step's stream (NCCL,
                           or a custom all-reduce for small messages): coll */
} ir_step_kind;

typedef struct ir_gemm {
    int trans_a, trans_b;         /* 1: op(X) = X^T */
    int m, n, k, batch;
    int64_t lda, ldb, ldc;        /* leading dimensions, elements */
    int64_t stride_a, stride_b, stride_c; /* between batches, elements */
    ir_dtype type_a, type_b, type_c;      /* F32 or BF16 (F16) */
    float alpha;
    ir_arg a, b, c;
    int has_bias;                 /* bias[m] added to every column after alpha, unscaled */
    ir_arg bias;
    ir_dtype type_bias;
} ir_gemm;

/* A collective step: recv gets `op` of every rank's `count` elements at send
 * (all_reduce: the sum, count elements; all_gather: the ranks' blocks in rank
 * order, ranks * count), in dtype on both sides. */
typedef struct ir_coll {
    ir_op_kind op;    /* IR_OP_ALL_REDUCE, _ALL_GATHER, _REDUCE_SCATTER or _ALL_TO_ALL */
    ir_dtype dtype;
    int64_t count;
    int ranks;
    ir_arg send, recv;
} ir_coll;

/* The one-shot all-reduce (docs/PARALLEL.md, "Small all-reduces"): codegen
 * puts its kernel, named so, in every bucket program with an all-reduce of
 * a float dtype; the runtime finds it there by that name. A block sums
 * IR_ONESHOT_CHUNK elements with IR_ONESHOT_THREADS threads. */
#define IR_ONESHOT_CHUNK 4096
#define IR_ONESHOT_THREADS 256
/* "allreduce_oneshot_r<ranks>_<dtype>" into buf (cap bytes). */
void ir_oneshot_kernel_name(char *buf, size_t cap, int ranks, ir_dtype dt);

#define IR_MAX_ARGS 16

typedef struct ir_step {
    ir_step_kind kind;
    int stream;       /* 0 or 1 */
    int op_id;        /* the IR op it implements (for errors and profiles) */
    int kernel;       /* IR_STEP_KERNEL: index into the bucket's kernel names */
    unsigned grid[3], block[3];
    unsigned smem;    /* dynamic shared memory bytes */
    int plain;        /* IR_STEP_KERNEL, 1: launched without the programmatic-dependent
                         attribute even where the plan's kernels carry the wait
                         (plan->pdl): scheduled only once the kernel before it ends */
    int prio;         /* IR_STEP_KERNEL, 1: launched at the device's greatest priority, so
                         that the GPU schedules its blocks before those of kernels
                         waiting beside it (cg_place_forks: the shared expert's tail) */
    int n_args;
    ir_arg args[IR_MAX_ARGS];
    ir_gemm gemm;     /* IR_STEP_GEMM */
    ir_coll coll;     /* IR_STEP_COLLECTIVE */
} ir_step;

typedef struct ir_bucket {
    int T;                    /* tokens per step in this bucket */
    void *cubin;              /* owned */
    size_t cubin_size;
    int n_kernels;
    char **kernel_names;      /* owned; entry points in the cubin */
    int n_steps;
    ir_step *steps;           /* owned */
    size_t arena_bytes;       /* arena_bytes_per_token * T */
    size_t scratch_bytes;
} ir_bucket;

typedef struct ir_plan {
    const ir_module *module;  /* not owned: the fused, planned module */
    ir_dtype compute_dtype;   /* BF16 or F32 */
    char arch[16];            /* "sm_90" */
    int kv_block_size;        /* tokens per KV page */
    int pdl;                  /* 1: every kernel begins with moec_pdl_enter, so steps may be
                               * launched as programmatic dependents (sm_90) */
    int sampler;              /* 1: every bucket ends with the device sampler's step, after
                               * the argmax (codegen/sample.c) */
    int fp8_tiles;            /* IR_FP8_TILES_*: which weights lie in fragment tiles
                               * (ir_weight_tiled) */
    int n_buckets;
    ir_bucket *buckets;       /* owned, ascending T */
} ir_plan;

void ir_plan_free(ir_plan *p);

/* Batch buckets: the token counts a plan has a compiled step for, ascending.
 * A step of n tokens runs the smallest bucket >= n, its rows past n padded.
 * This is their one definition: the default list, the bounds and the check
 * (compile options, plan files and the runtime all call it), the lookup. */
#define IR_BUCKETS_MAX 16          /* buckets in a plan */
#define IR_BUCKET_TOKENS_MAX 4096  /* tokens in one bucket */
/* The default buckets, 1, 2, 4, 8, 16, 32, 64, into out; returns how many. */
int ir_buckets_default(int out[IR_BUCKETS_MAX]);
/* 1 to IR_BUCKETS_MAX buckets, ascending, each 1 to IR_BUCKET_TOKENS_MAX;
 * MOEC_ERR_INVALID_ARG naming the first that is not. */
moec_status ir_buckets_check(const int *buckets, int n);
/* The smallest bucket of p that holds n tokens; NULL when none does. */
const ir_bucket *ir_plan_bucket_for(const ir_plan *p, int n);
/* How many of the n steps lead up to op stop_op: the shortest prefix that
 * holds every step of the ops before it (op_id 0 .. stop_op - 1), which
 * may hold steps of later ops too (cg_place_forks moves a side stream's
 * steps ahead of main-stream ones); all n where stop_op < 0. Any prefix
 * runs in order: the steps are one valid order of the step. */
int ir_steps_before_op(const ir_step *steps, int n, int stop_op);

/* How each activation is stored on the GPU: i32 values as i32; moe_topk's
 * operands and results, an unsummed moe_routed's result and the module
 * outputs in f32; a collective's
 * operand like its result; every other activation in the compute dtype.
 * Weights: their IR dtype if f32 or f8e4m3 (block-scaled fp8, read as fp8
 * by the kernels), else the compute dtype (a float weight with a
 * block_scale, like absorb_mla's kv_b, is dequantized at load). */
ir_dtype ir_value_storage_dtype(const ir_module *m, const ir_value *v, ir_dtype compute);

/* A weight's device buffer: its elements in their storage dtype, row-major
 * in the IR's shape; an f8e4m3 weight's block scales follow them, f32 in
 * ir_block_scale_type's shape, row-major, ir_weight_scale_offset bytes
 * from the start (the codes rounded up to 16 bytes, zero padded). */
/* The byte offset of weight w's scales in its buffer; 0 when it has none
 * there (not stored as f8e4m3). */
size_t ir_weight_scale_offset(const ir_value *w);
/* The bytes of weight w's device buffer (its scales included). */
size_t ir_weight_storage_bytes(const ir_module *m, const ir_value *w, ir_dtype compute);

/* Fragment tiles: how the routed experts' fp8 weights lie on the GPU, so
 * that a warp's 16-byte loads of a tensor-core fragment read 512
 * contiguous bytes, not 64 bytes of each of 8 rows (whose DRAM pages then
 * open once per 64 bytes). A weight [E, N, K] is taken as E * N rows of K
 * codes; each 16 rows are a tile of 16 * K bytes, stored chunk by chunk (64
 * codes a row a chunk, 1 KiB), and a chunk holds lane (g, q)'s 16 codes
 * of rows g (the first 512 bytes) and g + 8 (the next 512) at k 16 q in
 * lane order (lane 4 g + q). The block scales keep their layout.
 * (H200, 2026-11-29, V2-Lite in fp8: the staged experts' loads addressed
 * so, 3.552 / 5.578 / 6.954 ms a step at 8 / 32 / 64 tokens against
 * 3.719 / 5.806 / 7.197 as rows; bench/fp8_layout.cu.)
 * ir_weight_tiled: whether w lies so under the plan's fp8_tiles (mode,
 * cg_options.fp8_tiles): IR_FP8_TILES_ALL, an f8e4m3 weight [E, N, K] with
 * N a multiple of 16 (32 where it is a fused gate_up, so that up's rows
 * start a tile) and K of 64, read only as the experts of moe_routed or
 * moe_experts ops; IR_FP8_TILES_DOWN, such a weight read only as the
 * experts' down projection (their last operand); IR_FP8_TILES_GATE_UP,
 * such a weight read only as their gate_up (fused, or gate and up apart);
 * IR_FP8_TILES_NONE, none (IR_FP8_TILES_GATE_UP: faster than rows at 1 to
 * 64 tokens, where down's in tiles too are slower at 1 to 4; BENCHMARKS.md,
 * thirty-fifth round; again in the thirty-eighth, fp8 V2-Lite with
 * IR_FP8_TILES_ALL | IR_FP8_TILES_LINEAR at 1 / 2 / 4 / 8 / 32 / 64 tokens
 * 3.0 / 4.3 / 3.3 / 1.0% slower and 2.0 / 1.4-1.6% faster).
 * IR_FP8_TILES_LINEAR, a bit beside one of those four: dense linears'
 * f8e4m3 weights [N, K] too, N a multiple of 16 and K of 64, their scale
 * blocks whole tiles and chunks (ir_block_scale_tiles),
 * read only as the weight of linear ops. IR_FP8_TILES_EXPERTS masks the
 * experts' mode. The compiler's default is IR_FP8_TILES_GATE_UP |
 * IR_FP8_TILES_LINEAR (cg_options_default; BENCHMARKS.md, thirty-sixth
 * round). */
enum {
    IR_FP8_TILES_NONE = 0,
    IR_FP8_TILES_ALL = 1,
    IR_FP8_TILES_DOWN = 2,
    IR_FP8_TILES_GATE_UP = 3,
    IR_FP8_TILES_EXPERTS = 3,
    IR_FP8_TILES_LINEAR = 4,
    IR_FP8_TILES_MAX = 7
};
int ir_weight_tiled(const ir_module *m, const ir_value *w, int mode);
/* The byte offset of code (row n, column k) in a tiled weight of K columns
 * (n over all E * N rows) */
static inline int64_t ir_tile_offset(int64_t n, int64_t k, int64_t K)
{
    return (n >> 4) * 16 * K + (k >> 6) * 1024 + ((n >> 3) & 1) * 512 +
           ((n & 7) * 4 + ((k >> 4) & 3)) * 16 + (k & 15);
}
/* Rows rows of K codes (a multiple of 16 and of 64) laid out as tiles, in
 * place; -1 when out of memory (a tile's copy), else 0. */
int ir_tile_codes(uint8_t *codes, int64_t rows, int64_t K);

#endif
