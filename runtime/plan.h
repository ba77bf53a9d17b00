/* plan.h — what the CUDA runtime executes: per batch bucket, one cubin and
 * a launch table of steps (generated kernels, cuBLASLt GEMMs, stream fork
 * and join), with every pointer described symbolically (an activation at its
 * planned arena offset, a weight, a KV pool, a step input) so that the plan
 * can be built on a machine with no GPU, written to a file, and bound to
 * device memory at load. codegen/ builds it; runtime/ executes it and never
 * depends on codegen/. See docs/CUDA.md. */
#ifndef MOEC_RT_PLAN_H
#define MOEC_RT_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "ir/ir.h"

typedef enum rt_arg_kind {
    RT_ARG_ACT,     /* index: value id; pointer = arena + mem_offset * T */
    RT_ARG_WEIGHT,  /* index: value id of a weight; its device copy */
    RT_ARG_KV,      /* index: op id of an attention op; i: 0 = first pool (k, or kv_c
                       for MLA), 1 = second pool (v, or k_pe) */
    RT_ARG_INPUT,   /* index: an rt_input */
    RT_ARG_SCRATCH, /* i: byte offset into the bucket's scratch buffer */
    RT_ARG_CONFIG,  /* index: an rt_config value fixed at load (i32) */
    RT_ARG_I32,     /* i: a literal int */
    RT_ARG_F32,     /* f: a literal float */
} rt_arg_kind;

/* Per-step device inputs, at fixed addresses (graphs replay over them). */
typedef enum rt_input {
    RT_INPUT_TOKENS = 0,   /* i32[T] */
    RT_INPUT_POSITIONS,    /* i32[T]: position of each token in its sequence */
    RT_INPUT_SLOTS,        /* i32[T]: sequence slot of each token, -1 for padding */
    RT_INPUT_BLOCK_TABLE,  /* i32[max_seqs, max_blocks]: KV block of each slot's pages */
    RT_INPUT_SAMPLED,      /* i32[T]: argmax of each token's logits (output) */
    RT_INPUT_COUNT,
} rt_input;

/* RT_INPUT_SAMPLED of a token whose logits hold a NaN or an infinity. */
#define RT_SAMPLED_NONFINITE (-1)

/* Values chosen when the plan is loaded, not compiled in. */
typedef enum rt_config {
    RT_CONFIG_MAX_BLOCKS = 0, /* columns of the block table: pages per sequence */
    RT_CONFIG_COUNT,
} rt_config;

typedef struct rt_arg {
    rt_arg_kind kind;
    int index;
    int64_t i;   /* ACT, WEIGHT, INPUT: a byte offset added to the pointer;
                    SCRATCH: the offset; I32: the value */
    double f;
} rt_arg;

typedef enum rt_step_kind {
    RT_STEP_KERNEL, /* a generated kernel: kernel index, grid, block, smem, args */
    RT_STEP_GEMM,   /* cuBLASLt: C[batch][m x n] = alpha * op(A) op(B) (+ bias), column-major */
    RT_STEP_FORK,   /* stream 1 waits for stream 0 (event) */
    RT_STEP_JOIN,   /* stream 0 waits for stream 1 (event) */
} rt_step_kind;

typedef struct rt_gemm {
    int trans_a, trans_b;         /* 1: op(X) = X^T */
    int m, n, k, batch;
    int64_t lda, ldb, ldc;        /* leading dimensions, elements */
    int64_t stride_a, stride_b, stride_c; /* between batches, elements */
    ir_dtype type_a, type_b, type_c;      /* F32 or BF16 (F16) */
    float alpha;
    rt_arg a, b, c;
    int has_bias;                 /* bias[m] added to every column after alpha, unscaled */
    rt_arg bias;
    ir_dtype type_bias;
} rt_gemm;

#define RT_MAX_ARGS 16

typedef struct rt_step {
    rt_step_kind kind;
    int stream;       /* 0 or 1 */
    int op_id;        /* the IR op it implements (for errors and profiles) */
    int kernel;       /* RT_STEP_KERNEL: index into the bucket's kernel names */
    unsigned grid[3], block[3];
    unsigned smem;    /* dynamic shared memory bytes */
    int n_args;
    rt_arg args[RT_MAX_ARGS];
    rt_gemm gemm;     /* RT_STEP_GEMM */
} rt_step;

typedef struct rt_bucket {
    int T;                    /* tokens per step in this bucket */
    void *cubin;              /* owned */
    size_t cubin_size;
    int n_kernels;
    char **kernel_names;      /* owned; entry points in the cubin */
    int n_steps;
    rt_step *steps;           /* owned */
    size_t arena_bytes;       /* arena_bytes_per_token * T */
    size_t scratch_bytes;
} rt_bucket;

typedef struct rt_plan {
    const ir_module *module;  /* not owned: the fused, planned module */
    ir_dtype compute_dtype;   /* BF16 or F32 */
    char arch[16];            /* "sm_90" */
    int kv_block_size;        /* tokens per KV page */
    int pdl;                  /* 1: every kernel begins with moec_pdl_enter, so steps may be
                               * launched as programmatic dependents (sm_90) */
    int n_buckets;
    rt_bucket *buckets;       /* owned, ascending T */
} rt_plan;

void rt_plan_free(rt_plan *p);

/* How each activation is stored on the GPU: i32 values as i32; moe_topk's
 * operands and results and the module outputs in f32; every other
 * activation in the compute dtype. Weights: their IR dtype if f32, else the
 * compute dtype. */
ir_dtype rt_value_storage_dtype(const ir_module *m, const ir_value *v, ir_dtype compute);

#endif
