/* cuda_internal.h — what the files of the CUDA runtime share and nothing
 * outside runtime/ and graphs/ needs: the context's layout, cuBLASLt's
 * function table, the error helpers, and the set-up and step functions that
 * the context (cuda_context.c), memory (cuda_memory.c), weights
 * (cuda_weights.c), cuBLASLt (cuda_blaslt.c), steps (cuda_step.c),
 * profiling (cuda_profile.c) and graphs/ call across files. Only built
 * with the CUDA toolkit (MOEC_HAVE_CUDA). */
#ifndef MOEC_RT_CUDA_INTERNAL_H
#define MOEC_RT_CUDA_INTERNAL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "ir/ir_sample.h"
#include "runtime/cuda_rt.h"


#include <cublasLt.h>
#include <cuda_runtime_api.h>

#define RT_CUDA_WORKSPACE ((size_t)32 << 20) /* cuBLASLt workspace per stream */
#define RT_GEMM_TUNE_MAX 16                   /* MOEC_GEMM_TUNE's most candidates */
#define RT_CUDA_CHUNK ((size_t)4 << 20)      /* weight elements converted per upload */
#define RT_CUDA_SAMPLE_PENS (1 << 20)        /* penalty entries a step may upload, at most */
#define RT_CUDA_STR2(x) #x
#define RT_CUDA_STR(x) RT_CUDA_STR2(x)

/* ---- cuBLASLt, opened at run time ---------------------------------------- */

#define RT_LT_FUNCS(X)                      \
    X(cublasLtCreate)                       \
    X(cublasLtDestroy)                      \
    X(cublasLtGetStatusName)                \
    X(cublasLtGetStatusString)              \
    X(cublasLtMatmulDescCreate)             \
    X(cublasLtMatmulDescDestroy)            \
    X(cublasLtMatmulDescSetAttribute)       \
    X(cublasLtMatrixLayoutCreate)           \
    X(cublasLtMatrixLayoutDestroy)          \
    X(cublasLtMatrixLayoutSetAttribute)     \
    X(cublasLtMatmulPreferenceCreate)       \
    X(cublasLtMatmulPreferenceDestroy)      \
    X(cublasLtMatmulPreferenceSetAttribute) \
    X(cublasLtMatmulAlgoGetHeuristic)       \
    X(cublasLtMatmul)

typedef struct rt_lt_api {
    void *dl;
#define RT_LT_MEMBER(f) __typeof__(f) *f;
    RT_LT_FUNCS(RT_LT_MEMBER)
#undef RT_LT_MEMBER
} rt_lt_api;

/* ---- collectives (cuda_comm.c) ---------------------------------------------- */

/* A custom all-reduce for small messages (the one-shot all-reduce over peer
 * memory below, later perhaps fused with the residual add and RMSNorm),
 * used in place of NCCL for all-reduces of at most its byte limit whose
 * plan carries its kernel (`kernel`: the bucket's, found by name). */
typedef moec_status (*rt_small_allreduce)(void *user, int rank, cudaKernel_t kernel,
                                          const void *send, void *recv, size_t count,
                                          ir_dtype dtype, cudaStream_t stream,
                                          const char *where);
void rt_comm_set_small_allreduce(rt_comm *c, rt_small_allreduce fn, size_t max_bytes,
                                 void *user);
/* MOEC_OK, or the error a small all-reduce recorded (its kernel gave up
 * waiting for a peer): checked after every step's synchronization. */
moec_status rt_comm_small_error(const rt_comm *c, const char *where);

/* ---- the one-shot all-reduce (cuda_oneshot.c) -------------------------------
 * n ranks on devices devs (distinct GPUs with peer access, or the same one),
 * messages of up to max_bytes. */
typedef struct rt_oneshot rt_oneshot;
/* The group's buffers and peer access, made once. MOEC_ERR_UNSUPPORTED
 * naming the GPUs when two cannot read each other's memory. */
moec_status rt_oneshot_init(int n, const int *devs, size_t max_bytes, rt_oneshot **out);
void rt_oneshot_free(rt_oneshot *o);
/* The largest message, in bytes. */
size_t rt_oneshot_max_bytes(const rt_oneshot *o);
/* How long a rank waits for its peers before it gives up (default 10 s). */
void rt_oneshot_set_timeout(rt_oneshot *o, double seconds);
/* Every rank waiting now or later gives up (a rank failed). */
void rt_oneshot_abort(rt_oneshot *o);
/* MOEC_OK, or why a rank gave up waiting (timed out, aborted). */
moec_status rt_oneshot_error(const rt_oneshot *o, const char *where);
/* An rt_small_allreduce (user: the rt_oneshot): rank's count elements of
 * send summed over the ranks into recv, on stream, by kernel (its plan's,
 * or cg_oneshot_source compiled). Every rank must make the same calls. */
moec_status rt_oneshot_run(void *user, int rank, cudaKernel_t kernel, const void *send,
                           void *recv, size_t count, ir_dtype dtype, cudaStream_t stream,
                           const char *where);

/* Enqueues collective step coll (send and recv resolved) on stream;
 * oneshot: the plan's one-shot all-reduce kernel for it, or NULL. */
moec_status rt_comm_run(rt_comm *c, const ir_coll *coll, cudaKernel_t oneshot, const void *send,
                        void *recv, cudaStream_t stream, const char *where);

/* ---- the context ----------------------------------------------------------- */

typedef union rt_cuda_val {
    void *p;
    int32_t i;
    float f;
} rt_cuda_val;

/* A resolved argument: a device address (with the bytes it may reach and
 * the dtype stored there, -1 when unknown) or a literal. */
typedef struct rt_cuda_ref {
    rt_cuda_val val;
    int is_ptr;
    size_t avail;
    int dtype;
} rt_cuda_ref;

typedef struct rt_cuda_gemm {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    const void *a, *b;
    void *c;
    const void *bias;
    float alpha, beta;
} rt_cuda_gemm;

/* One step, ready to launch. args[j] points at vals[j]. */
typedef struct rt_cuda_launch {
    cudaKernel_t kernel;
    void *args[IR_MAX_ARGS];
    rt_cuda_val vals[IR_MAX_ARGS];
    rt_cuda_gemm gemm;
    cudaEvent_t event;
    int plain;                     /* 1: launched without the programmatic attribute
                                    * (the step's plain, or its name holds a
                                    * MOEC_PDL_OFF part) */
    int prio_high;                 /* 1: launched at the device's greatest priority on
                                    * two streams (the step's prio, or its name holds
                                    * a MOEC_PRIO_HIGH part) */
} rt_cuda_launch;

/* What the device says about one kernel of a cubin. Parameters are asked
 * for only up to the most arguments a step passes (asking past the last one
 * is an API error, which compute-sanitizer reports). */
typedef struct rt_cuda_kernel_info {
    int max_args;                  /* the most arguments a step passes it */
    int n_known;                   /* parameters whose size the runtime knows */
    int n_exact;                   /* 1: the kernel has exactly n_known parameters */
    size_t param_size[IR_MAX_ARGS];
    int max_threads;
    unsigned max_smem;             /* the most dynamic shared memory a step asks */
} rt_cuda_kernel_info;

typedef struct rt_cuda_bucket {
    const ir_bucket *b;
    cudaLibrary_t lib;
    int loaded;
    cudaKernel_t *kernels;
    rt_cuda_kernel_info *info;
    rt_cuda_launch *launches;
    float *logits;                 /* module output 0 in the arena, for this T */
    int prio_high;                 /* 1: a launch at the greatest priority (its graph
                                    * keeps the nodes' priorities) */
} rt_cuda_bucket;

struct rt_cuda {
    const ir_plan *plan;
    rt_lt_api lt;
    int device;
    rt_comm *comm;                 /* the rank's communicator (not owned); NULL unsharded */
    char device_name[256];
    int cc_major, cc_minor;
    int max_seqs, max_seq_len;
    int max_blocks;                /* block-table entries per row */
    int n_blocks;                  /* blocks in the KV pool (0 until sized by kv_fraction) */
    double kv_fraction;
    int tmax, in_stride;
    int vocab;                     /* token ids must be below (0: unchecked) */
    int out_cols;
    int debug_sync;                /* MOEC_CUDA_SYNC=1: synchronize after every step */
    const char *skip_kernels;      /* MOEC_SKIP_KERNELS (timing experiments: wrong results) */
    int single_stream;             /* 1: every step on stream 0, forks and joins skipped */
    int dual_max_t;                /* buckets of more tokens run on stream 0 alone
                                    * (MOEC_DUAL_STREAM_MAX_T, default 16) */
    int dual_from_t;               /* ... up to this many tokens, two streams again
                                    * from there (MOEC_DUAL_STREAM_FROM_T, default 32;
                                    * 0: never) */
    int pdl;                       /* 1: kernels launched as programmatic dependents (plan->pdl,
                                    * sm_90+, unless MOEC_PDL=0) */
    int prio_on;                   /* 1: the streams carry priorities (MOEC_STREAM_PRIORITY) */
    int prio[2];                   /* each stream's priority when prio_on */
    int prio_greatest;             /* the device's greatest, for prio steps' kernels */
    size_t device_bytes;

    void **weights;                /* per value id */
    size_t *weight_bytes;
    void **kv;                     /* per op id, two pools */
    size_t *kv_bytes;
    char *arena;
    size_t arena_bytes;
    char *scratch;
    size_t scratch_bytes;
    int32_t *inputs;               /* tokens, positions, slots, sampled, block table, and with
                                    * the sampler its rows, entries, tokens and log probs */
    int32_t *input_ptr[IR_INPUT_COUNT];
    size_t input_bytes[IR_INPUT_COUNT];
    int32_t *host_in;              /* pinned: tokens, positions, slots */
    int32_t *bt_host;              /* pinned: the block table as the host set it */
    int *bt_lo, *bt_hi;            /* per row: entries [lo, hi) changed since the last upload */
    int bt_dirty;                  /* some row changed */

    /* The device sampler (plan->sampler; rt_cuda_set_sampling): the next
     * step's parameter rows and penalty entries staged in pinned memory,
     * uploaded with its other inputs; the device rows stay on only for the
     * step that set them. */
    ir_sample_row *smp_rows;       /* pinned: in_stride rows */
    ir_sample_pen *smp_pens;       /* pinned: smp_cap entries */
    int smp_cap;
    int smp_n, smp_n_pen;          /* staged: rows and entries */
    int smp_set;                   /* staged since the last step began */
    int smp_live;                  /* the device's rows have some on (the last step's) */
    int32_t *smp_tokens_out;       /* staged destinations of the drawn tokens and log probs */
    float *smp_logprobs_out;
    int32_t *smp_tokens_dst;       /* this step's (NULL: nothing to copy back) */
    float *smp_logprobs_dst;
    int smp_dst_rows;
    uint32_t *smp_stamp;           /* rt_sample_check's scratch: vocab words */
    uint32_t smp_epoch;

    cudaStream_t stream[2];
    cudaEvent_t head, tail;        /* stream 1 joins stream 0 at a step's start and end */
    cublasLtHandle_t lt_handle[2];
    void *workspace[2];
    int gemm_tune;                 /* MOEC_GEMM_TUNE: the heuristic's candidates each GEMM
                                    * shape times at set-up (0 or 1: its first, untimed) */
    struct rt_gemm_tuned *tuned;   /* the shapes timed so far, with their fastest algorithm */
    int n_tuned, cap_tuned;

    int n_buckets;
    rt_cuda_bucket *buckets;
};

/* ---- errors (cuda_errors.c) ------------------------------------------------ */

moec_status rt_cuda_fail(moec_status st, const char *file, int line, const char *where,
                         const char *expr, const char *name, const char *text);
moec_status rt_cuda_check(cudaError_t e, const char *expr, const char *where, const char *file,
                              int line);
moec_status rt_lt_check(const rt_cuda *c, cublasStatus_t s, const char *expr, const char *where,
                            const char *file, int line);
const char *rt_cuda_step_where(const rt_cuda *c, const rt_cuda_bucket *cb, int i, char *buf,
                              size_t cap);
/* Both evaluate `where` only on failure. */
#define CK(call, where) rt_cuda_check((call), #call, (where), __FILE__, __LINE__)
#define LT(c, call, where) rt_lt_check((c), (call), #call, (where), __FILE__, __LINE__)

/* ---- set-up (cuda_blaslt.c, cuda_memory.c, cuda_weights.c) ----------------- */

moec_status rt_lt_open(rt_lt_api *lt);
moec_status rt_cuda_alloc(rt_cuda *c, void **p, size_t bytes, const char *what);
cudaDataType_t rt_lt_type(ir_dtype dt);
int rt_float_dtype(ir_dtype dt);
moec_status rt_cuda_upload_weights(rt_cuda *c, const rt_weights *w);
moec_status rt_cuda_check_arch(const rt_cuda *c);
moec_status rt_cuda_check_memory(const rt_cuda *c);
/* The blocks of the pool (kv_fraction of the free memory when n_blocks is
 * 0), the pools of every attention, mla_attention and dsa_topk op, the
 * block table's first contents. */
moec_status rt_cuda_size_kv(rt_cuda *c);
moec_status rt_cuda_alloc_kv(rt_cuda *c);
moec_status rt_cuda_init_table(rt_cuda *c);
moec_status rt_cuda_alloc_buffers(rt_cuda *c);
/* Copies the block-table rows changed since the last upload (stream 0). */
moec_status rt_cuda_upload_table(rt_cuda *c, const char *where);
/* Argument a of step argument j resolved to a device address or a literal
 * (cuda_context.c). */
moec_status rt_cuda_resolve_arg(rt_cuda *c, const ir_bucket *b, const ir_arg *a, rt_cuda_ref *r,
                                const char *where, int j);
moec_status rt_cuda_prepare_gemm(rt_cuda *c, rt_cuda_bucket *cb, const ir_step *s,
                                rt_cuda_launch *L, const char *where);

/* ---- a step (cuda_step.c) ---------------------------------------------------- */

moec_status rt_cuda_run_steps(rt_cuda *c, rt_cuda_bucket *cb, int from, int to);
rt_cuda_bucket *rt_cuda_bucket_for(rt_cuda *c, int n);
/* 1 where bucket cb's steps run on stream 0 alone: single_stream, or more
 * tokens than dual_max_t and fewer than dual_from_t (where that is set). */
int rt_cuda_one_stream(const rt_cuda *c, const rt_cuda_bucket *cb);
moec_status rt_cuda_write_inputs(rt_cuda *c, int n, const int32_t *tokens, const int32_t *positions,
                                const int32_t *slots, const char *where);
moec_status rt_cuda_launch_step(rt_cuda *c, rt_cuda_bucket *cb, int stop_op, const char *where);
moec_status rt_cuda_sync(rt_cuda *c, const char *where);
/* The start of a step of n tokens: arguments checked, the bucket that
 * holds them into *cb, what it is ("what of n tokens (bucket T=..)") into
 * where, the inputs written. */
moec_status rt_cuda_begin_step(rt_cuda *c, int n, const int32_t *tokens,
                               const int32_t *positions, const int32_t *slots, const char *what,
                               rt_cuda_bucket **cb, char *where, size_t where_cap);
/* The end of a step: the logits of rows first .. first + count - 1 (into
 * logits_out, count rows) and the n sampled ids copied back (each when its
 * pointer is not NULL), stream 0 synchronized. */
moec_status rt_cuda_end_step(rt_cuda *c, const rt_cuda_bucket *cb, int n, int first, int count,
                             float *logits_out, int32_t *sampled_out, const char *where);
/* The median of n step times (sorts ms). */
float rt_median_ms(float *ms, int n);

#endif
