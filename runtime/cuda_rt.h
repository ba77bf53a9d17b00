/* cuda_rt.h — the CUDA runtime: binds a launch plan (ir/ir_plan.h) to
 * device memory (every weight in its storage dtype, the activation arena,
 * scratch, the paged KV pools, the step inputs) and executes steps of up to
 * the largest bucket's tokens eagerly on two streams. It links only the
 * CUDA runtime (cuBLASLt is loaded when a context is made), so binaries run
 * where there is no GPU or driver; built without the CUDA toolkit, every
 * entry point answers MOEC_ERR_NO_DEVICE. See docs/CUDA.md. */
#ifndef MOEC_RT_CUDA_RT_H
#define MOEC_RT_CUDA_RT_H

#include <stddef.h>
#include <stdint.h>

#include "ir/ir_plan.h"
#include "ir/ir_sample.h"
#include "runtime/weights.h"

typedef struct rt_cuda rt_cuda;

/* ---- groups of ranks (cuda_comm.c) ------------------------------------------
 * One process drives the n GPUs of a group, a thread each; the ranks'
 * communicators are made at once (NCCL's ncclCommInitAll, NCCL opened with
 * dlopen when the first group is made). */
typedef struct rt_comm rt_comm;

/* Communicators for ranks 0..n-1 on devices devs[0..n-1] into out[0..n-1]
 * (n of 1: a communicator of one). MOEC_ERR_CUDA naming NCCL when it cannot
 * be loaded or fails. */
moec_status rt_comm_init_all(int n, const int *devs, rt_comm **out);
/* Ends a communicator: its collectives, in flight or to come, fail instead
 * of waiting for a rank that will never join (a failing rank's peers are
 * ended this way). */
void rt_comm_abort(rt_comm *c);
/* Frees the n communicators of one rt_comm_init_all. */
void rt_comm_free_all(rt_comm **comms, int n);
int rt_comm_rank(const rt_comm *c);
int rt_comm_size(const rt_comm *c);
int rt_comm_device(const rt_comm *c);
/* MOEC_OK, or the error a collective of comm met asynchronously (or that it
 * was aborted), prefixed with where. */
moec_status rt_comm_error(rt_comm *c, const char *where);

/* Binds plan on device 0 for up to max_seqs sequences (slots 0..max_seqs-1)
 * of up to max_seq_len tokens each, each slot owning its KV blocks (as
 * rt_cuda_init_sized with kv_blocks and kv_fraction 0): loads every
 * bucket's cubin and resolves its kernels, uploads every weight of
 * plan->module from w, allocates the arena, scratch, KV pools and inputs,
 * and prepares every launch (argument arrays, cuBLASLt descriptors and
 * algorithms) so that a step only launches. plan (and its module) must
 * outlive the context; w is only read here. MOEC_ERR_NO_DEVICE without a
 * device. */
moec_status rt_cuda_init(const ir_plan *plan, const rt_weights *w, int max_seqs, int max_seq_len,
                         rt_cuda **out);

/* The KV pool and block table of a context: the pool holds kv_blocks
 * blocks of the plan's kv_block_size tokens (per attention op, two pools
 * of that many blocks); the block table has max_seqs rows of
 * ceil(max_seq_len / kv_block_size) entries, row s listing the block of
 * each kv_block_size positions of the sequence in slot s. */
typedef struct rt_cuda_sizes {
    int max_seqs, max_seq_len;
    /* Blocks in the pool; 0: kv_fraction of the device memory free once the
     * weights, activations, inputs and workspaces are allocated (at most
     * max_seqs full rows' worth); both 0: exactly max_seqs full rows. When
     * the pool fills every row, row s starts as blocks s * P .. s * P + P - 1
     * (each slot owns its blocks); otherwise every entry starts at -1. */
    int kv_blocks;
    double kv_fraction;
} rt_cuda_sizes;
moec_status rt_cuda_init_sized(const ir_plan *plan, const rt_weights *w, const rt_cuda_sizes *sz,
                               rt_cuda **out);
/* rt_cuda_init_sized for one rank of a group (docs/PARALLEL.md): on device
 * `device`, its collective steps run over comm (rt_comm_init_all; not
 * owned, and it must outlive the context). A plan with collective steps
 * needs one; an unsharded plan takes NULL. */
moec_status rt_cuda_init_rank(const ir_plan *plan, const rt_weights *w, const rt_cuda_sizes *sz,
                              int device, rt_comm *comm, rt_cuda **out);
/* Releases everything the context holds, device memory included. */
void rt_cuda_free(rt_cuda *c);
/* 1: every step on stream 0 (the plan's forks and joins skipped); 0 (the
 * default): the shared-expert branch on stream 1. graphs/ keeps a graph
 * of each mode. */
void rt_cuda_set_single_stream(rt_cuda *c, int single);

/* Runs n tokens (1 <= n <= rt_cuda_max_tokens) in the smallest bucket that
 * holds them: token i of sequence slots[i] at position positions[i] (its KV
 * entries are written to the block its row of the block table lists);
 * padding rows run token 0 with slot -1. Then copies back the logits of the
 * n tokens (n rows of rt_cuda_logits_cols floats) and their argmax ids
 * (IR_SAMPLED_NONFINITE for a row with a NaN or an infinity), each when its
 * pointer is not NULL. MOEC_ERR_CAPACITY for a position past max_seq_len,
 * MOEC_ERR_INVALID_ARG for a slot or token id out of range or a position
 * whose block is -1; all before anything runs. A failed launch names the
 * step, its op and kernel; a fault that only shows at the final
 * synchronization is named too when MOEC_CUDA_SYNC=1 (which synchronizes
 * after every step). */
moec_status rt_cuda_step(rt_cuda *c, int n, const int32_t *tokens, const int32_t *positions,
                         const int32_t *slots, float *logits_out, int32_t *sampled_out);
/* rt_cuda_step's check of its inputs alone (the block table included),
 * made before anything runs: a group of ranks checks a step once. */
moec_status rt_cuda_check_inputs(const rt_cuda *c, int n, const int32_t *tokens,
                                 const int32_t *positions, const int32_t *slots);
/* Sets entries first .. first + n - 1 of row `row` of the block table to
 * blocks[0 .. n-1] (each in [0, kv_blocks) or -1). The table is a fixed
 * device buffer that graphs read: the rows changed are copied to it on
 * stream 0 at the start of the next step, before its launches or replay. */
moec_status rt_cuda_set_blocks(rt_cuda *c, int row, int first, int n, const int32_t *blocks);
/* The device sampler (a plan whose buckets end with it: plan->sampler):
 * the next step samples rows[0, n) of its tokens' logits (n at most its
 * tokens) as ir/ir_sample.h says, their penalty entries pens[0, n_pen)
 * (checked: rt_sample_check), and copies the tokens drawn and their log
 * probabilities into tokens_out[0, n) and logprobs_out[0, n) (rows off:
 * unspecified) when it ends. The rows are fixed device buffers that graphs
 * read, uploaded with the step's other inputs; a step that follows no
 * rt_cuda_set_sampling samples nothing. MOEC_ERR_UNSUPPORTED for a plan
 * without the sampler. */
moec_status rt_cuda_set_sampling(rt_cuda *c, int n, const ir_sample_row *rows, int n_pen,
                                 const ir_sample_pen *pens, int32_t *tokens_out,
                                 float *logprobs_out);
/* The penalty entries one step may hold; -1 when the plan has no sampler. */
int rt_cuda_sample_capacity(const rt_cuda *c);
/* Blocks in the KV pool, and the bytes one block takes over all layers. */
int rt_cuda_kv_blocks(const rt_cuda *c);
size_t rt_cuda_kv_block_bytes(const rt_cuda *c);

/* Profiling: runs the bucket holding n tokens eagerly on stream 0 alone,
 * with an event between every two of its steps, iters times after one
 * warm-up; step_ms[i] (one per plan step of the bucket) gets step i's mean
 * time. Forks and joins read 0. */
moec_status rt_cuda_profile_steps(rt_cuda *c, int n, const int32_t *tokens,
                                  const int32_t *positions, const int32_t *slots, int iters,
                                  double *step_ms);
/* Runs a step of n tokens only as far as the steps of ops before op id
 * stop_op, and waits for it: the values live at that point (which the
 * memory plan may reuse later in the step) can then be read. */
moec_status rt_cuda_run_until(rt_cuda *c, int n, const int32_t *tokens, const int32_t *positions,
                              const int32_t *slots, int stop_op);
/* Copies the first n rows of activation v (of the plan's module) as the
 * last (partial) step of the bucket holding n tokens left it, in its
 * storage dtype, into dst (cap bytes). */
moec_status rt_cuda_read_value(rt_cuda *c, int n, const ir_value *v, void *dst, size_t cap);
/* Device-to-device copy bandwidth of device 0, counting bytes read plus
 * bytes written, over a buffer of `bytes` (median of iters copies). */
moec_status rt_cuda_copy_bandwidth(size_t bytes, int iters, double *bytes_per_s);
/* The device's name ("NVIDIA H100 80GB HBM3"). */
const char *rt_cuda_device_name(const rt_cuda *c);

/* The largest bucket: the most tokens one step runs. */
int rt_cuda_max_tokens(const rt_cuda *c);
/* Floats per logits row (the module output's elements per token). */
int rt_cuda_logits_cols(const rt_cuda *c);
/* Device memory the context allocated, in bytes. */
size_t rt_cuda_device_bytes(const rt_cuda *c);

/* fp32 to bf16 with round-to-nearest-even (NaN stays a quiet NaN), as the
 * weights are uploaded. Needs no GPU. */
void rt_cuda_to_bf16(const float *src, uint16_t *dst, size_t n);
/* What rt_cuda_init checks of the plan and its module before any device
 * call (positive sizes, the dtype, ascending buckets, an f32 output with an
 * arena offset). Needs no GPU. */
moec_status rt_cuda_check_plan(const ir_plan *p, const rt_cuda_sizes *sz);
/* A sharded plan (its module's meta tp) comes with the communicator of its
 * rank in a group of tp, an unsharded one with none. Needs no GPU. */
moec_status rt_cuda_check_comm(const ir_plan *p, const rt_comm *comm);

#endif
