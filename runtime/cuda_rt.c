/* cuda_rt.c — the CUDA runtime (cuda_rt.h): everything a plan needs on the
 * device is allocated and every launch is prepared once, at init (kernel
 * handles, argument arrays pointing at resolved addresses, cuBLASLt
 * descriptors with the algorithm chosen by the heuristic), so that a step
 * is an input copy, a run of launches and event waits on two streams, and
 * the copy-back of logits and sampled ids.
 *
 * Only runtime API calls (no driver API symbol, so binaries start where
 * there is no driver), and cuBLASLt is opened with dlopen when a context is
 * made: linking it would load half a gigabyte of library into every moec
 * binary, CPU-only runs included. Every CUDA and cuBLASLt status is checked
 * and reported with the call, the error's name and text, and what was being
 * done (the step, its op and kernel). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "runtime/cuda_rt.h"

void rt_cuda_to_bf16(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], sizeof u);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            dst[i] = (uint16_t)((u >> 16) | 0x0040u); /* NaN: keep it a (quiet) NaN */
        else
            dst[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}

/* Checks what the runtime relies on in the plan and the module. */
static moec_status check_plan(const ir_plan *p, int max_seqs, int max_seq_len)
{
    if (max_seqs < 1 || max_seq_len < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "rt_cuda_init: max_seqs (%d) and max_seq_len (%d) must be positive",
                        max_seqs, max_seq_len);
    if (!p->module || p->n_buckets < 1 || !p->buckets)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_init: the plan has no module or no bucket");
    if (p->compute_dtype != IR_DTYPE_F32 && p->compute_dtype != IR_DTYPE_BF16)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "the CUDA runtime computes in bf16 or f32, not %s",
                        ir_dtype_name(p->compute_dtype));
    if (p->kv_block_size < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "the plan's kv_block_size is %d", p->kv_block_size);
    for (int b = 0; b < p->n_buckets; b++)
        if (p->buckets[b].T < 1 || (b > 0 && p->buckets[b].T <= p->buckets[b - 1].T))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "the plan's buckets must be positive and ascending (bucket %d is T=%d)",
                            b, p->buckets[b].T);
    const ir_module *m = p->module;
    if (m->n_outputs < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "module %s has no output", m->name);
    const ir_value *out = m->outputs[0];
    if (out->kind != IR_VALUE_OP || out->mem_offset < 0 ||
        ir_value_storage_dtype(m, out, p->compute_dtype) != IR_DTYPE_F32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "output %%%s must be an f32 activation with an arena offset", out->name);
    return MOEC_OK;
}

#ifndef MOEC_HAVE_CUDA

moec_status rt_cuda_init(const ir_plan *plan, const rt_weights *w, int max_seqs, int max_seq_len,
                         rt_cuda **out)
{
    if (!out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_init: out is NULL");
    *out = NULL;
    if (!plan || !w)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_init: NULL plan or weights");
    MOEC_TRY(check_plan(plan, max_seqs, max_seq_len));
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
}

void rt_cuda_free(rt_cuda *c) { (void)c; }

moec_status rt_cuda_capture(rt_cuda *c)
{
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
}

moec_status rt_cuda_step(rt_cuda *c, int n, const int32_t *tokens, const int32_t *positions,
                         const int32_t *slots, float *logits_out, int32_t *sampled_out)
{
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
}

int rt_cuda_max_tokens(const rt_cuda *c) { return 0; }
int rt_cuda_logits_cols(const rt_cuda *c) { return 0; }
size_t rt_cuda_device_bytes(const rt_cuda *c) { return 0; }

moec_status rt_cuda_time_steps(rt_cuda *c, int n, const int32_t *tokens, const int32_t *positions,
                               const int32_t *slots, int warmup, int iters, float *median_ms)
{
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
}

moec_status rt_cuda_profile_steps(rt_cuda *c, int n, const int32_t *tokens,
                                  const int32_t *positions, const int32_t *slots, int iters,
                                  double *step_ms)
{
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
}

void rt_cuda_set_single_stream(rt_cuda *c, int single) { (void)c; (void)single; }
void rt_cuda_set_graphs(rt_cuda *c, int on) { (void)c; (void)on; }
int rt_cuda_graphs_captured(const rt_cuda *c) { (void)c; return 0; }

moec_status rt_cuda_run_until(rt_cuda *c, int n, const int32_t *tokens, const int32_t *positions,
                              const int32_t *slots, int stop_op)
{
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
}

moec_status rt_cuda_read_value(rt_cuda *c, int n, const ir_value *v, void *dst, size_t cap)
{
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
}

moec_status rt_cuda_copy_bandwidth(size_t bytes, int iters, double *bytes_per_s)
{
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
}

const char *rt_cuda_device_name(const rt_cuda *c) { return "none"; }

#else

#include <ctype.h>
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#define RT_CUDA_WORKSPACE ((size_t)32 << 20) /* cuBLASLt workspace per stream */
#define RT_CUDA_CHUNK ((size_t)4 << 20)      /* weight elements converted per upload */
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
    cudaGraphExec_t graph[2];      /* one whole step captured (rt_cuda_capture), or NULL:
                                    * [0] with stream 1 forked, [1] on stream 0 alone */
} rt_cuda_bucket;

struct rt_cuda {
    const ir_plan *plan;
    rt_lt_api lt;
    int device;
    char device_name[256];
    int cc_major, cc_minor;
    int max_seqs, max_seq_len, max_blocks, n_blocks;
    int tmax, in_stride;
    int vocab;                     /* token ids must be below (0: unchecked) */
    int out_cols;
    int debug_sync;                /* MOEC_CUDA_SYNC=1: synchronize after every step */
    int single_stream;             /* 1: every step on stream 0, forks and joins skipped */
    int graphs_off;                /* 1: launch eagerly even where a graph was captured */
    int pdl;                       /* 1: kernels launched as programmatic dependents (plan->pdl,
                                    * sm_90+, unless MOEC_PDL=0) */
    size_t device_bytes;

    void **weights;                /* per value id */
    size_t *weight_bytes;
    void **kv;                     /* per op id, two pools */
    size_t *kv_bytes;
    char *arena;
    size_t arena_bytes;
    char *scratch;
    size_t scratch_bytes;
    int32_t *inputs;               /* tokens, positions, slots, sampled, block table */
    int32_t *input_ptr[IR_INPUT_COUNT];
    size_t input_bytes[IR_INPUT_COUNT];
    int32_t *host_in;              /* pinned: tokens, positions, slots */

    cudaStream_t stream[2];
    cudaEvent_t head, tail;        /* stream 1 joins stream 0 at a step's start and end */
    cublasLtHandle_t lt_handle[2];
    void *workspace[2];

    int n_buckets;
    rt_cuda_bucket *buckets;
};

/* ---- errors ---------------------------------------------------------------- */

/* The function name in a call's source text ("c->lt.cublasLtMatmul(...)"). */
static const char *call_name(const char *expr, int *len)
{
    const char *paren = strchr(expr, '(');
    const char *end = paren ? paren : expr + strlen(expr);
    const char *start = end;
    while (start > expr && (isalnum((unsigned char)start[-1]) || start[-1] == '_'))
        start--;
    *len = (int)(end - start);
    return start;
}

static moec_status rt_cuda_fail(moec_status st, const char *file, int line, const char *where,
                                const char *expr, const char *name, const char *text)
{
    int len;
    const char *fn = call_name(expr, &len);
    return moec_err_set(st, file, line, "%s%s%.*s: %s: %s", where ? where : "", where ? ": " : "",
                        len, fn, name, text);
}

static moec_status cuda_check(cudaError_t e, const char *expr, const char *where, const char *file,
                              int line)
{
    if (e == cudaSuccess)
        return MOEC_OK;
    return rt_cuda_fail(e == cudaErrorMemoryAllocation ? MOEC_ERR_OOM : MOEC_ERR_CUDA, file, line,
                        where, expr, cudaGetErrorName(e), cudaGetErrorString(e));
}

static moec_status lt_check(const rt_cuda *c, cublasStatus_t s, const char *expr, const char *where,
                            const char *file, int line)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return MOEC_OK;
    return rt_cuda_fail(s == CUBLAS_STATUS_ALLOC_FAILED ? MOEC_ERR_OOM : MOEC_ERR_CUDA, file, line,
                        where, expr, c->lt.cublasLtGetStatusName(s),
                        c->lt.cublasLtGetStatusString(s));
}

/* Both evaluate `where` only on failure. */
#define CK(call, where) cuda_check((call), #call, (where), __FILE__, __LINE__)
#define LT(c, call, where) lt_check((c), (call), #call, (where), __FILE__, __LINE__)

/* "bucket T=8, step 17 (op moe_routed %l3.moe.routed, kernel moe_down_...)" */
static const char *step_where(const rt_cuda *c, const rt_cuda_bucket *cb, int i, char *buf,
                              size_t cap)
{
    const ir_step *s = &cb->b->steps[i];
    const ir_module *m = c->plan->module;
    const ir_op *op = s->op_id >= 0 && s->op_id < m->n_ops ? m->ops[s->op_id] : NULL;
    const char *kind = op ? ir_op_name(op->kind) : "?";
    const char *name = op && op->n_out > 0 ? op->out[0]->name : "?";
    int n = snprintf(buf, cap, "bucket T=%d, step %d (op %s %%%s, ", cb->b->T, i, kind, name);
    if (n < 0 || (size_t)n >= cap)
        return buf;
    switch (s->kind) {
    case IR_STEP_KERNEL:
        snprintf(buf + n, cap - (size_t)n, "kernel %s)",
                 s->kernel >= 0 && s->kernel < cb->b->n_kernels ? cb->b->kernel_names[s->kernel]
                                                                : "(bad index)");
        break;
    case IR_STEP_GEMM:
        snprintf(buf + n, cap - (size_t)n, "cuBLASLt gemm m=%d n=%d k=%d batch=%d)", s->gemm.m,
                 s->gemm.n, s->gemm.k, s->gemm.batch);
        break;
    case IR_STEP_FORK: snprintf(buf + n, cap - (size_t)n, "fork)"); break;
    case IR_STEP_JOIN: snprintf(buf + n, cap - (size_t)n, "join)"); break;
    default: snprintf(buf + n, cap - (size_t)n, "step kind %d)", (int)s->kind); break;
    }
    return buf;
}

/* ---- set-up helpers -------------------------------------------------------- */

static moec_status lt_open(rt_lt_api *lt)
{
    static const char *const names[] = {"libcublasLt.so." RT_CUDA_STR(CUBLAS_VER_MAJOR),
                                        "libcublasLt.so"};
    const char *err = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names && !lt->dl; i++) {
        lt->dl = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lt->dl && !err)
            err = dlerror();
    }
    /* Beside the CUDA runtime this binary uses, when that is not on the
     * loader's path. */
    Dl_info info;
    cudaError_t (*probe)(int *) = cudaGetDeviceCount;
    void *addr;
    memcpy(&addr, &probe, sizeof addr);
    if (!lt->dl && dladdr(addr, &info) && info.dli_fname) {
        char path[4096];
        const char *slash = strrchr(info.dli_fname, '/');
        if (slash) {
            snprintf(path, sizeof path, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname,
                     names[0]);
            lt->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        }
    }
    if (!lt->dl)
        return MOEC_ERR(MOEC_ERR_CUDA, "cannot load cuBLASLt (%s): %s", names[0],
                        err ? err : "not found");
#define RT_LT_LOAD(f)                                                                         \
    {                                                                                         \
        void *sym = dlsym(lt->dl, #f);                                                        \
        if (!sym)                                                                             \
            return MOEC_ERR(MOEC_ERR_CUDA, "cuBLASLt (%s) has no %s", names[0], #f);          \
        memcpy(&lt->f, &sym, sizeof sym);                                                     \
    }
    RT_LT_FUNCS(RT_LT_LOAD)
#undef RT_LT_LOAD
    return MOEC_OK;
}

static moec_status dev_alloc(rt_cuda *c, void **p, size_t bytes, const char *what)
{
    *p = NULL;
    size_t want = bytes ? bytes : 256;
    cudaError_t e = cudaMalloc(p, want);
    if (e != cudaSuccess) {
        *p = NULL;
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
            free_b = total_b = 0;
        return MOEC_ERR(e == cudaErrorMemoryAllocation ? MOEC_ERR_OOM : MOEC_ERR_CUDA,
                        "%s: cudaMalloc of %zu bytes: %s: %s (device 0 has %zu of %zu MiB free; "
                        "%zu MiB allocated so far)",
                        what, want, cudaGetErrorName(e), cudaGetErrorString(e), free_b >> 20,
                        total_b >> 20, c->device_bytes >> 20);
    }
    c->device_bytes += want;
    return MOEC_OK;
}

static cudaDataType_t lt_type(ir_dtype dt)
{
    switch (dt) {
    case IR_DTYPE_F16: return CUDA_R_16F;
    case IR_DTYPE_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
    }
}

static int float_dtype(ir_dtype dt)
{
    return dt == IR_DTYPE_F32 || dt == IR_DTYPE_BF16 || dt == IR_DTYPE_F16;
}

/* Loads every bucket's cubin and resolves its kernels. */
static moec_status load_kernels(rt_cuda *c, rt_cuda_bucket *cb)
{
    const ir_bucket *b = cb->b;
    char where[512];
    snprintf(where, sizeof where,
             "bucket T=%d: loading its cubin (%zu bytes, built for %s; device 0 is %s, sm_%d%d)",
             b->T, b->cubin_size, c->plan->arch, c->device_name, c->cc_major, c->cc_minor);
    if (!b->cubin || !b->cubin_size)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: the plan has no cubin", where);
    MOEC_TRY(CK(cudaLibraryLoadData(&cb->lib, b->cubin, NULL, NULL, 0, NULL, NULL, 0), where));
    cb->loaded = 1;
    if (b->n_kernels < 0 || (b->n_kernels > 0 && !b->kernel_names))
        return MOEC_ERR(MOEC_ERR_INTERNAL, "bucket T=%d: bad kernel table", b->T);
    cb->kernels = calloc((size_t)b->n_kernels + 1, sizeof *cb->kernels);
    cb->info = calloc((size_t)b->n_kernels + 1, sizeof *cb->info);
    if (!cb->kernels || !cb->info)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory loading bucket T=%d", b->T);
    for (int s = 0; s < b->n_steps; s++) {
        const ir_step *st = &b->steps[s];
        if (st->kind != IR_STEP_KERNEL || st->kernel < 0 || st->kernel >= b->n_kernels)
            continue;
        rt_cuda_kernel_info *ki = &cb->info[st->kernel];
        if (st->smem > ki->max_smem)
            ki->max_smem = st->smem;
        if (st->n_args > ki->max_args && st->n_args <= IR_MAX_ARGS)
            ki->max_args = st->n_args;
    }
    for (int k = 0; k < b->n_kernels; k++) {
        const char *name = b->kernel_names[k] ? b->kernel_names[k] : "(null)";
        rt_cuda_kernel_info *ki = &cb->info[k];
        snprintf(where, sizeof where, "bucket T=%d: kernel %s", b->T, name);
        MOEC_TRY(CK(cudaLibraryGetKernel(&cb->kernels[k], cb->lib, name), where));
        const void *fn = (const void *)cb->kernels[k];
        struct cudaFuncAttributes attr;
        MOEC_TRY(CK(cudaFuncGetAttributes(&attr, fn), where));
        ki->max_threads = attr.maxThreadsPerBlock;
        if (ki->max_smem > 48 * 1024)
            MOEC_TRY(CK(cudaKernelSetAttributeForDevice(cb->kernels[k],
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                        (int)ki->max_smem, c->device),
                        where));
        /* The parameters steps pass, to check their sizes against. */
        for (ki->n_known = 0; ki->n_known < ki->max_args; ki->n_known++) {
            size_t off = 0, size = 0;
            cudaError_t e = cudaFuncGetParamInfo(fn, (size_t)ki->n_known, &off, &size);
            if (e != cudaSuccess) {
                cudaGetLastError();
                /* Past the last parameter (a step passes too many), or not answered. */
                ki->n_exact = e == cudaErrorInvalidValue && ki->n_known > 0;
                break;
            }
            ki->param_size[ki->n_known] = size;
        }
    }
    return MOEC_OK;
}

/* The weight upload: one queue of weights, filled by up to
 * RT_UPLOAD_THREADS threads, each reading its weight to fp32 from the
 * checkpoint's mapping, converting it to bf16 where it is stored so, and
 * copying it to the device; the first error stops the others. */
#define RT_UPLOAD_THREADS 8

typedef struct upload_queue {
    rt_cuda *c;
    const rt_weights *w;
    pthread_mutex_t lock;
    int next;
    moec_status st;
    char err[1024];
} upload_queue;

/* Reads, converts and copies weight value i. host (of host_cap floats) and
 * stage (RT_CUDA_CHUNK bf16) are the calling thread's buffers. */
static moec_status upload_one(rt_cuda *c, const rt_weights *w, int i, float **host,
                              size_t *host_cap, uint16_t *stage)
{
    const ir_module *m = c->plan->module;
    const ir_value *v = m->values[i];
    ir_dtype dt = ir_value_storage_dtype(m, v, c->plan->compute_dtype);
    size_t numel = (size_t)ir_type_numel(&v->type, 0);
    char where[512];
    snprintf(where, sizeof where, "weight %%%s (stored as %s)", v->name, ir_dtype_name(dt));
    if (numel > *host_cap) {
        free(*host);
        *host = malloc(numel * sizeof **host);
        *host_cap = *host ? numel : 0;
        if (!*host)
            return MOEC_ERR(MOEC_ERR_OOM, "%s: out of host memory (%zu bytes)", where,
                            numel * sizeof **host);
    }
    MOEC_TRY(rt_weights_read_f32(w, v, *host));
    if (dt == IR_DTYPE_F32)
        return CK(cudaMemcpy(c->weights[i], *host, numel * sizeof **host, cudaMemcpyHostToDevice),
                  where);
    for (size_t off = 0; off < numel; off += RT_CUDA_CHUNK) {
        size_t n = numel - off < RT_CUDA_CHUNK ? numel - off : RT_CUDA_CHUNK;
        rt_cuda_to_bf16(*host + off, stage, n);
        MOEC_TRY(CK(cudaMemcpy((uint16_t *)c->weights[i] + off, stage, n * sizeof *stage,
                               cudaMemcpyHostToDevice),
                    where));
    }
    return MOEC_OK;
}

static void *upload_worker(void *arg)
{
    upload_queue *q = arg;
    float *host = NULL;
    size_t host_cap = 0;
    uint16_t *stage = malloc(RT_CUDA_CHUNK * sizeof *stage);
    moec_status st = stage ? CK(cudaSetDevice(q->c->device), "uploading the weights")
                           : MOEC_ERR(MOEC_ERR_OOM, "uploading the weights: out of host memory");
    const ir_module *m = q->c->plan->module;
    for (;;) {
        pthread_mutex_lock(&q->lock);
        if (st != MOEC_OK && q->st == MOEC_OK) {
            q->st = st;
            snprintf(q->err, sizeof q->err, "%s", moec_last_error());
        }
        while (q->next < m->n_values && m->values[q->next]->kind != IR_VALUE_WEIGHT)
            q->next++; /* the next weight */
        int i = q->st == MOEC_OK ? q->next++ : m->n_values;
        pthread_mutex_unlock(&q->lock);
        if (i >= m->n_values)
            break;
        st = upload_one(q->c, q->w, i, &host, &host_cap, stage);
    }
    free(host);
    free(stage);
    return NULL;
}

/* Allocates every weight of the module in its storage dtype (one by one,
 * so that running out of memory names the weight), then fills them in
 * parallel. */
static moec_status upload_weights(rt_cuda *c, const rt_weights *w)
{
    const ir_module *m = c->plan->module;
    ir_dtype compute = c->plan->compute_dtype;
    char where[512];
    for (int i = 0; i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        if (v->kind != IR_VALUE_WEIGHT)
            continue;
        char ty[64];
        ir_type_format(&v->type, ty, sizeof ty);
        ir_dtype dt = ir_value_storage_dtype(m, v, compute);
        if (dt != IR_DTYPE_F32 && dt != IR_DTYPE_BF16)
            return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                            "weight %%%s (%s): storage dtype %s is not supported by the CUDA runtime",
                            v->name, ty, ir_dtype_name(dt));
        int64_t numel = ir_type_numel(&v->type, 0);
        if (numel <= 0)
            return MOEC_ERR(MOEC_ERR_INTERNAL, "weight %%%s (%s) has no elements", v->name, ty);
        size_t bytes = (size_t)numel * ir_dtype_size(dt);
        snprintf(where, sizeof where, "weight %%%s (%s, stored as %s)", v->name, ty,
                 ir_dtype_name(dt));
        MOEC_TRY(dev_alloc(c, &c->weights[i], bytes, where));
        c->weight_bytes[i] = bytes;
    }
    upload_queue q = {.c = c, .w = w, .lock = PTHREAD_MUTEX_INITIALIZER, .st = MOEC_OK};
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int n_threads = cpus < 1 ? 1 : cpus > RT_UPLOAD_THREADS ? RT_UPLOAD_THREADS : (int)cpus;
    pthread_t th[RT_UPLOAD_THREADS];
    int started = 0;
    for (int i = 1; i < n_threads; i++)
        if (pthread_create(&th[started], NULL, upload_worker, &q) == 0)
            started++;
    upload_worker(&q);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&q.lock);
    if (q.st != MOEC_OK)
        return MOEC_ERR(q.st, "%s", q.err);
    return MOEC_OK;
}

/* The two KV pools of an attention or mla_attention op into pool; 0 for
 * other ops. */
static int kv_pools(const ir_op *op, const ir_value *pool[2])
{
    if (op->kind == IR_OP_ATTENTION && op->n_in >= 3) {
        pool[0] = op->in[1];
        pool[1] = op->in[2];
        return 1;
    }
    if (op->kind == IR_OP_MLA_ATTENTION && op->n_in >= 4) {
        pool[0] = op->in[2];
        pool[1] = op->in[3];
        return 1;
    }
    return 0;
}

static size_t kv_pool_bytes(const rt_cuda *c, const ir_value *pool)
{
    return (size_t)c->max_seqs * (size_t)c->max_blocks * (size_t)c->plan->kv_block_size *
           (size_t)ir_type_numel(&pool->type, 0) * ir_dtype_size(c->plan->compute_dtype);
}

/* A cubin built for sm_XY runs on compute capability X.Z with Z >= Y; one
 * built for an arch-specific target (sm_90a) only on X.Y itself. */
static moec_status check_arch(const rt_cuda *c)
{
    const char *a = c->plan->arch;
    char *end = NULL;
    long v = strncmp(a, "sm_", 3) || !isdigit((unsigned char)a[3]) ? -1 : strtol(a + 3, &end, 10);
    int specific = end && *end == 'a';
    if (v < 10 || v > 999 || (end && *end && strcmp(end, "a") && strcmp(end, "f")))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "the plan's target arch '%s' is not like sm_90", a);
    int major = (int)(v / 10), minor = (int)(v % 10);
    if (major == c->cc_major && (specific ? minor == c->cc_minor : minor <= c->cc_minor))
        return MOEC_OK;
    return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                    "the plan was compiled for %s, but device 0 (%s) is sm_%d%d: compile it for "
                    "this device (moec compile --arch sm_%d%d)",
                    a, c->device_name, c->cc_major, c->cc_minor, c->cc_major, c->cc_minor);
}

/* What the context will allocate, against what the device has free, before
 * anything is allocated: a plan too big fails with its sizes, not with a
 * cudaMalloc half way through the upload. */
static moec_status check_memory(const rt_cuda *c)
{
    const ir_plan *p = c->plan;
    const ir_module *m = p->module;
    size_t weights = 0, kv = 0, arena = 0, scratch = 0;
    for (int i = 0; i < m->n_values; i++)
        if (m->values[i]->kind == IR_VALUE_WEIGHT)
            weights += (size_t)ir_type_numel(&m->values[i]->type, 0) *
                       ir_dtype_size(ir_value_storage_dtype(m, m->values[i], p->compute_dtype));
    for (int k = 0; k < m->n_ops; k++) {
        const ir_value *pool[2];
        if (kv_pools(m->ops[k], pool))
            kv += kv_pool_bytes(c, pool[0]) + kv_pool_bytes(c, pool[1]);
    }
    for (int b = 0; b < p->n_buckets; b++) {
        if (p->buckets[b].arena_bytes > arena)
            arena = p->buckets[b].arena_bytes;
        if (p->buckets[b].scratch_bytes > scratch)
            scratch = p->buckets[b].scratch_bytes;
    }
    size_t other = (4 * (size_t)c->in_stride + (size_t)c->max_seqs * (size_t)c->max_blocks) *
                       sizeof(int32_t) +
                   2 * RT_CUDA_WORKSPACE;
    size_t need = weights + kv + arena + scratch + other;
    size_t free_b = 0, total_b = 0;
    MOEC_TRY(CK(cudaMemGetInfo(&free_b, &total_b), "reading device 0's free memory"));
    if (need <= free_b)
        return MOEC_OK;
    return MOEC_ERR(MOEC_ERR_CAPACITY,
                    "the plan needs %zu bytes (%zu MiB) of device memory: weights %zu MiB, KV "
                    "cache %zu MiB (%d sequences of %d tokens), activations and scratch %zu MiB, "
                    "inputs and workspaces %zu MiB; device 0 (%s) has %zu bytes (%zu MiB) free "
                    "of %zu MiB",
                    need, need >> 20, weights >> 20, kv >> 20, c->max_seqs, c->max_seq_len,
                    (arena + scratch) >> 20, other >> 20, c->device_name, free_b, free_b >> 20,
                    total_b >> 20);
}

/* The two KV pools of every attention and mla_attention op. */
static moec_status alloc_kv(rt_cuda *c)
{
    const ir_module *m = c->plan->module;
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        const ir_value *pool[2];
        if (!kv_pools(op, pool))
            continue;
        for (int p = 0; p < 2; p++) {
            size_t bytes = kv_pool_bytes(c, pool[p]);
            char where[512];
            snprintf(where, sizeof where, "KV pool %d (%%%s) of %s %%%s", p, pool[p]->name,
                     ir_op_name(op->kind), op->out[0]->name);
            MOEC_TRY(dev_alloc(c, &c->kv[2 * k + p], bytes, where));
            c->kv_bytes[2 * k + p] = bytes;
            MOEC_TRY(CK(cudaMemset(c->kv[2 * k + p], 0, bytes), where));
        }
    }
    return MOEC_OK;
}

/* Arena, scratch, the step inputs (with the static block table). */
static moec_status alloc_buffers(rt_cuda *c)
{
    const ir_plan *p = c->plan;
    for (int b = 0; b < p->n_buckets; b++) {
        if (p->buckets[b].arena_bytes > c->arena_bytes)
            c->arena_bytes = p->buckets[b].arena_bytes;
        if (p->buckets[b].scratch_bytes > c->scratch_bytes)
            c->scratch_bytes = p->buckets[b].scratch_bytes;
    }
    MOEC_TRY(dev_alloc(c, (void **)&c->arena, c->arena_bytes, "the activation arena"));
    /* Poisoned (NaN in every float type): a value read before it is written shows. */
    MOEC_TRY(CK(cudaMemset(c->arena, 0xff, c->arena_bytes ? c->arena_bytes : 256), "the arena"));
    if (c->scratch_bytes) {
        MOEC_TRY(dev_alloc(c, (void **)&c->scratch, c->scratch_bytes, "scratch"));
        MOEC_TRY(CK(cudaMemset(c->scratch, 0, c->scratch_bytes), "scratch"));
    }
    size_t table = (size_t)c->max_seqs * (size_t)c->max_blocks;
    size_t total = 4 * (size_t)c->in_stride + table;
    MOEC_TRY(dev_alloc(c, (void **)&c->inputs, total * sizeof(int32_t), "the step inputs"));
    MOEC_TRY(CK(cudaMemset(c->inputs, 0, total * sizeof(int32_t)), "the step inputs"));
    c->input_ptr[IR_INPUT_TOKENS] = c->inputs;
    c->input_ptr[IR_INPUT_POSITIONS] = c->inputs + c->in_stride;
    c->input_ptr[IR_INPUT_SLOTS] = c->inputs + 2 * (size_t)c->in_stride;
    c->input_ptr[IR_INPUT_SAMPLED] = c->inputs + 3 * (size_t)c->in_stride;
    c->input_ptr[IR_INPUT_BLOCK_TABLE] = c->inputs + 4 * (size_t)c->in_stride;
    for (int i = 0; i < IR_INPUT_COUNT; i++)
        c->input_bytes[i] = (size_t)c->tmax * sizeof(int32_t);
    c->input_bytes[IR_INPUT_BLOCK_TABLE] = table * sizeof(int32_t);

    /* Slot s owns pages s * max_blocks .. s * max_blocks + max_blocks - 1. */
    int32_t *bt = malloc(table * sizeof *bt);
    if (!bt)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory building the block table");
    for (size_t i = 0; i < table; i++)
        bt[i] = (int32_t)i;
    moec_status st = CK(cudaMemcpy(c->input_ptr[IR_INPUT_BLOCK_TABLE], bt, table * sizeof *bt,
                                   cudaMemcpyHostToDevice),
                        "the block table");
    free(bt);
    MOEC_TRY(st);
    MOEC_TRY(CK(cudaMallocHost((void **)&c->host_in, 3 * (size_t)c->in_stride * sizeof(int32_t)),
                "the pinned step inputs"));
    return MOEC_OK;
}

/* ---- launches -------------------------------------------------------------- */

/* ACT, WEIGHT and INPUT arguments may point a->i bytes into their buffer
 * (a head's rows of a weight, say). */
static moec_status apply_offset(const ir_arg *a, rt_cuda_ref *r, const char *where, int j)
{
    if (a->i < 0 || (uint64_t)a->i > (uint64_t)r->avail)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: argument %d: byte offset %lld outside its %zu bytes",
                        where, j, (long long)a->i, r->avail);
    r->val.p = (char *)r->val.p + a->i;
    r->avail -= (size_t)a->i;
    return MOEC_OK;
}

static moec_status resolve_arg(rt_cuda *c, const ir_bucket *b, const ir_arg *a, rt_cuda_ref *r,
                               const char *where, int j)
{
    const ir_module *m = c->plan->module;
    memset(r, 0, sizeof *r);
    r->dtype = -1;
    switch (a->kind) {
    case IR_ARG_ACT: {
        if (a->index < 0 || a->index >= m->n_values)
            return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: argument %d: value id %d out of range", where,
                            j, a->index);
        const ir_value *v = m->values[a->index];
        if (v->kind == IR_VALUE_INPUT) {
            int in = !strcmp(v->name, "tokens") ? IR_INPUT_TOKENS
                     : !strcmp(v->name, "positions") ? IR_INPUT_POSITIONS : -1;
            if (in < 0)
                return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: argument %d: input %%%s is not a step input",
                                where, j, v->name);
            r->val.p = c->input_ptr[in];
            r->is_ptr = 1;
            r->avail = c->input_bytes[in];
            r->dtype = IR_DTYPE_I32;
            return apply_offset(a, r, where, j);
        }
        if (v->kind != IR_VALUE_OP)
            return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: argument %d: %%%s is not an activation", where,
                            j, v->name);
        if (v->mem_offset < 0)
            return MOEC_ERR(MOEC_ERR_INTERNAL,
                            "%s: argument %d: %%%s has no arena offset (plan_memory not run?)",
                            where, j, v->name);
        ir_dtype sd = ir_value_storage_dtype(m, v, c->plan->compute_dtype);
        size_t off = (size_t)v->mem_offset * (size_t)b->T;
        size_t bytes = (size_t)ir_type_numel(&v->type, b->T) * ir_dtype_size(sd);
        if (off + bytes > b->arena_bytes || off + bytes > c->arena_bytes)
            return MOEC_ERR(MOEC_ERR_INTERNAL,
                            "%s: argument %d: %%%s at arena offset %zu (%zu bytes) lies outside "
                            "the bucket's arena of %zu bytes",
                            where, j, v->name, off, bytes, b->arena_bytes);
        r->val.p = c->arena + off;
        r->is_ptr = 1;
        r->avail = bytes;
        r->dtype = (int)sd;
        return apply_offset(a, r, where, j);
    }
    case IR_ARG_WEIGHT:
        if (a->index < 0 || a->index >= m->n_values || m->values[a->index]->kind != IR_VALUE_WEIGHT ||
            !c->weights[a->index])
            return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: argument %d: value id %d is not a weight",
                            where, j, a->index);
        r->val.p = c->weights[a->index];
        r->is_ptr = 1;
        r->avail = c->weight_bytes[a->index];
        r->dtype = (int)ir_value_storage_dtype(m, m->values[a->index], c->plan->compute_dtype);
        return apply_offset(a, r, where, j);
    case IR_ARG_KV:
        if (a->index < 0 || a->index >= m->n_ops || a->i < 0 || a->i > 1 ||
            !c->kv[2 * a->index + a->i])
            return MOEC_ERR(MOEC_ERR_INTERNAL,
                            "%s: argument %d: KV pool %lld of op id %d: no such pool (not an "
                            "attention op?)",
                            where, j, (long long)a->i, a->index);
        r->val.p = c->kv[2 * a->index + a->i];
        r->is_ptr = 1;
        r->avail = c->kv_bytes[2 * a->index + a->i];
        r->dtype = (int)c->plan->compute_dtype;
        return MOEC_OK;
    case IR_ARG_INPUT:
        if (a->index < 0 || a->index >= IR_INPUT_COUNT)
            return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: argument %d: no step input %d", where, j,
                            a->index);
        r->val.p = c->input_ptr[a->index];
        r->is_ptr = 1;
        r->avail = c->input_bytes[a->index];
        r->dtype = IR_DTYPE_I32;
        return apply_offset(a, r, where, j);
    case IR_ARG_SCRATCH:
        if (a->i < 0 || (size_t)a->i > b->scratch_bytes || !c->scratch)
            return MOEC_ERR(MOEC_ERR_INTERNAL,
                            "%s: argument %d: scratch offset %lld outside the bucket's %zu bytes",
                            where, j, (long long)a->i, b->scratch_bytes);
        r->val.p = c->scratch + a->i;
        r->is_ptr = 1;
        r->avail = b->scratch_bytes - (size_t)a->i;
        return MOEC_OK;
    case IR_ARG_CONFIG:
        if (a->index != IR_CONFIG_MAX_BLOCKS)
            return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: argument %d: no config value %d", where, j,
                            a->index);
        r->val.i = c->max_blocks;
        return MOEC_OK;
    case IR_ARG_I32:
        if (a->i < INT32_MIN || a->i > INT32_MAX)
            return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: argument %d: %lld does not fit an i32", where,
                            j, (long long)a->i);
        r->val.i = (int32_t)a->i;
        return MOEC_OK;
    case IR_ARG_F32:
        r->val.f = (float)a->f;
        return MOEC_OK;
    }
    return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: argument %d: unknown kind %d", where, j, (int)a->kind);
}

static moec_status prepare_kernel(rt_cuda *c, rt_cuda_bucket *cb, const ir_step *s,
                                  rt_cuda_launch *L, const char *where)
{
    const ir_bucket *b = cb->b;
    if (s->kernel < 0 || s->kernel >= b->n_kernels)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: kernel index %d outside the bucket's %d kernels",
                        where, s->kernel, b->n_kernels);
    if (s->n_args < 0 || s->n_args > IR_MAX_ARGS)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: %d arguments (at most %d)", where, s->n_args,
                        IR_MAX_ARGS);
    const rt_cuda_kernel_info *ki = &cb->info[s->kernel];
    unsigned long long threads = (unsigned long long)s->block[0] * s->block[1] * s->block[2];
    if (!s->grid[0] || !s->grid[1] || !s->grid[2] || !threads)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: empty grid %ux%ux%u or block %ux%ux%u", where,
                        s->grid[0], s->grid[1], s->grid[2], s->block[0], s->block[1], s->block[2]);
    if (threads > (unsigned long long)ki->max_threads)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: block of %llu threads; the kernel allows %d", where,
                        threads, ki->max_threads);
    if (ki->n_exact && s->n_args > ki->n_known)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: the kernel takes %d parameters, the step gives %d",
                        where, ki->n_known, s->n_args);
    L->kernel = cb->kernels[s->kernel];
    for (int j = 0; j < s->n_args; j++) {
        rt_cuda_ref r;
        MOEC_TRY(resolve_arg(c, b, &s->args[j], &r, where, j));
        size_t want = r.is_ptr ? sizeof(void *) : 4;
        if (j < ki->n_known && ki->param_size[j] != want)
            return MOEC_ERR(MOEC_ERR_INTERNAL,
                            "%s: argument %d is %zu bytes; the kernel's parameter %d is %zu bytes",
                            where, j, want, j, ki->param_size[j]);
        L->vals[j] = r.val;
        L->args[j] = &L->vals[j];
    }
    return MOEC_OK;
}

/* Checks that a matrix of rows x cols (column-major, leading dimension ld,
 * batch copies stride elements apart) of dtype dt lies inside r. */
static moec_status gemm_operand(const char *where, const char *what, const rt_cuda_ref *r,
                                ir_dtype dt, int64_t rows, int64_t cols, int64_t ld,
                                int64_t stride, int batch)
{
    if (!r->is_ptr)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: %s is not a device buffer", where, what);
    if (!float_dtype(dt))
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: %s has dtype %s", where, what, ir_dtype_name(dt));
    if (r->dtype >= 0 && r->dtype != (int)dt)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: %s is stored as %s but the gemm reads it as %s",
                        where, what, ir_dtype_name((ir_dtype)r->dtype), ir_dtype_name(dt));
    if (ld < rows || stride < 0)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: %s: leading dimension %lld < %lld rows", where,
                        what, (long long)ld, (long long)rows);
    int64_t last = (int64_t)(batch - 1) * stride + (cols - 1) * ld + rows;
    size_t need = (size_t)last * ir_dtype_size(dt);
    if (need > r->avail)
        return MOEC_ERR(MOEC_ERR_INTERNAL,
                        "%s: %s spans %zu bytes but its buffer has %zu from there", where, what,
                        need, r->avail);
    return MOEC_OK;
}

/* The largest power of two (up to 256) dividing the address and, when
 * batched, the stride between batches. */
static uint32_t alignment(const void *p, int64_t stride_bytes, int batch)
{
    uintptr_t a = (uintptr_t)p | (batch > 1 ? (uintptr_t)stride_bytes : 0);
    uint32_t al = 256;
    while (al > 1 && (a & (al - 1)))
        al >>= 1;
    return al;
}

static moec_status layout_init(rt_cuda *c, cublasLtMatrixLayout_t *l, ir_dtype dt, int64_t rows,
                               int64_t cols, int64_t ld, int batch, int64_t stride,
                               const char *where)
{
    MOEC_TRY(LT(c, c->lt.cublasLtMatrixLayoutCreate(l, lt_type(dt), (uint64_t)rows, (uint64_t)cols, ld),
                where));
    if (batch > 1) {
        int32_t count = batch;
        MOEC_TRY(LT(c,
                    c->lt.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                           &count, sizeof count),
                    where));
        MOEC_TRY(LT(c,
                    c->lt.cublasLtMatrixLayoutSetAttribute(
                        *l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
                    where));
    }
    return MOEC_OK;
}

/* Chooses the algorithm for g with pointers of the given alignments. */
static moec_status gemm_algo(rt_cuda *c, const ir_step *s, rt_cuda_gemm *g,
                             cublasLtMatmulPreference_t pref, const uint32_t align[4],
                             const char *where)
{
    uint64_t ws = RT_CUDA_WORKSPACE;
    MOEC_TRY(LT(c,
                c->lt.cublasLtMatmulPreferenceSetAttribute(
                    pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                where));
    static const cublasLtMatmulPreferenceAttributes_t keys[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        MOEC_TRY(LT(c,
                    c->lt.cublasLtMatmulPreferenceSetAttribute(pref, keys[i], &align[i],
                                                               sizeof align[i]),
                    where));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    memset(&res, 0, sizeof res);
    MOEC_TRY(LT(c,
                c->lt.cublasLtMatmulAlgoGetHeuristic(c->lt_handle[s->stream], g->desc, g->la, g->lb,
                                                     g->lc, g->lc, pref, 1, &res, &found),
                where));
    if (found < 1)
        return MOEC_ERR(MOEC_ERR_CUDA,
                        "%s: cuBLASLt has no algorithm for A %s, B %s, C %s%s%s (alignments %u, "
                        "%u, %u bytes)",
                        where, ir_dtype_name(s->gemm.type_a), ir_dtype_name(s->gemm.type_b),
                        ir_dtype_name(s->gemm.type_c), s->gemm.has_bias ? ", bias " : "",
                        s->gemm.has_bias ? ir_dtype_name(s->gemm.type_bias) : "", align[0],
                        align[1], align[2]);
    g->algo = res.algo;
    return MOEC_OK;
}

static moec_status prepare_gemm(rt_cuda *c, rt_cuda_bucket *cb, const ir_step *s,
                                rt_cuda_launch *L, const char *where)
{
    const ir_gemm *gm = &s->gemm;
    rt_cuda_gemm *g = &L->gemm;
    if (gm->m < 1 || gm->n < 1 || gm->k < 1 || gm->batch < 1)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: empty gemm", where);
    int64_t ar = gm->trans_a ? gm->k : gm->m, ac = gm->trans_a ? gm->m : gm->k;
    int64_t br = gm->trans_b ? gm->n : gm->k, bc = gm->trans_b ? gm->k : gm->n;
    rt_cuda_ref ra, rb, rc, rbias;
    MOEC_TRY(resolve_arg(c, cb->b, &gm->a, &ra, where, 0));
    MOEC_TRY(resolve_arg(c, cb->b, &gm->b, &rb, where, 1));
    MOEC_TRY(resolve_arg(c, cb->b, &gm->c, &rc, where, 2));
    MOEC_TRY(gemm_operand(where, "A", &ra, gm->type_a, ar, ac, gm->lda, gm->stride_a, gm->batch));
    MOEC_TRY(gemm_operand(where, "B", &rb, gm->type_b, br, bc, gm->ldb, gm->stride_b, gm->batch));
    MOEC_TRY(gemm_operand(where, "C", &rc, gm->type_c, gm->m, gm->n, gm->ldc, gm->stride_c,
                          gm->batch));
    g->a = ra.val.p;
    g->b = rb.val.p;
    g->c = rc.val.p;
    g->alpha = gm->alpha;
    g->beta = 0.0f;

    MOEC_TRY(LT(c, c->lt.cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), where));
    int32_t ta = gm->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = gm->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    MOEC_TRY(LT(c,
                c->lt.cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                     sizeof ta),
                where));
    MOEC_TRY(LT(c,
                c->lt.cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                     sizeof tb),
                where));
    if (gm->has_bias) {
        MOEC_TRY(resolve_arg(c, cb->b, &gm->bias, &rbias, where, 3));
        MOEC_TRY(gemm_operand(where, "the bias", &rbias, gm->type_bias, gm->m, 1, gm->m, 0, 1));
        g->bias = rbias.val.p;
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        int32_t bias_type = (int32_t)lt_type(gm->type_bias);
        MOEC_TRY(LT(c,
                    c->lt.cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                         &epi, sizeof epi),
                    where));
        MOEC_TRY(LT(c,
                    c->lt.cublasLtMatmulDescSetAttribute(
                        g->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias),
                    where));
        MOEC_TRY(LT(c,
                    c->lt.cublasLtMatmulDescSetAttribute(
                        g->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type),
                    where));
    }
    MOEC_TRY(layout_init(c, &g->la, gm->type_a, ar, ac, gm->lda, gm->batch, gm->stride_a, where));
    MOEC_TRY(layout_init(c, &g->lb, gm->type_b, br, bc, gm->ldb, gm->batch, gm->stride_b, where));
    MOEC_TRY(layout_init(c, &g->lc, gm->type_c, gm->m, gm->n, gm->ldc, gm->batch, gm->stride_c,
                         where));
    uint32_t align[4] = {
        alignment(g->a, gm->stride_a * (int64_t)ir_dtype_size(gm->type_a), gm->batch),
        alignment(g->b, gm->stride_b * (int64_t)ir_dtype_size(gm->type_b), gm->batch),
        alignment(g->c, gm->stride_c * (int64_t)ir_dtype_size(gm->type_c), gm->batch), 0};
    align[3] = align[2];
    cublasLtMatmulPreference_t pref = NULL;
    MOEC_TRY(LT(c, c->lt.cublasLtMatmulPreferenceCreate(&pref), where));
    moec_status st = gemm_algo(c, s, g, pref, align, where);
    c->lt.cublasLtMatmulPreferenceDestroy(pref);
    return st;
}

static moec_status prepare_bucket(rt_cuda *c, rt_cuda_bucket *cb)
{
    const ir_bucket *b = cb->b;
    if (b->n_steps < 0 || (b->n_steps > 0 && !b->steps))
        return MOEC_ERR(MOEC_ERR_INTERNAL, "bucket T=%d: bad step table", b->T);
    cb->launches = calloc((size_t)b->n_steps + 1, sizeof *cb->launches);
    if (!cb->launches)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory preparing bucket T=%d", b->T);
    const ir_value *out = c->plan->module->outputs[0];
    size_t off = (size_t)out->mem_offset * (size_t)b->T;
    if (off + (size_t)b->T * (size_t)c->out_cols * sizeof(float) > b->arena_bytes)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "bucket T=%d: output %%%s lies outside the arena",
                        b->T, out->name);
    cb->logits = (float *)(c->arena + off);
    char where[512];
    for (int i = 0; i < b->n_steps; i++) {
        const ir_step *s = &b->steps[i];
        rt_cuda_launch *L = &cb->launches[i];
        step_where(c, cb, i, where, sizeof where);
        if (s->stream != 0 && s->stream != 1)
            return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: stream %d (0 or 1)", where, s->stream);
        switch (s->kind) {
        case IR_STEP_KERNEL: MOEC_TRY(prepare_kernel(c, cb, s, L, where)); break;
        case IR_STEP_GEMM: MOEC_TRY(prepare_gemm(c, cb, s, L, where)); break;
        case IR_STEP_FORK:
        case IR_STEP_JOIN:
            MOEC_TRY(CK(cudaEventCreateWithFlags(&L->event, cudaEventDisableTiming), where));
            break;
        default: return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: unknown step kind", where);
        }
    }
    return MOEC_OK;
}

static moec_status setup(rt_cuda *c, const rt_weights *w)
{
    const ir_plan *p = c->plan;
    const ir_module *m = p->module;
    MOEC_TRY(lt_open(&c->lt));
    c->device = 0;
    MOEC_TRY(CK(cudaSetDevice(c->device), "selecting device 0"));
    struct cudaDeviceProp prop;
    MOEC_TRY(CK(cudaGetDeviceProperties(&prop, c->device), "device 0"));
    snprintf(c->device_name, sizeof c->device_name, "%s", prop.name);
    c->cc_major = prop.major;
    const char *pdl = getenv("MOEC_PDL");
    c->pdl = p->pdl && prop.major >= 9 && !(pdl && !strcmp(pdl, "0"));
    c->cc_minor = prop.minor;
    MOEC_TRY(check_arch(c));
    const char *sync = getenv("MOEC_CUDA_SYNC");
    c->debug_sync = sync && *sync && strcmp(sync, "0");

    c->tmax = p->buckets[p->n_buckets - 1].T;
    c->in_stride = (c->tmax + 63) / 64 * 64;
    c->max_blocks = (c->max_seq_len + p->kv_block_size - 1) / p->kv_block_size;
    c->n_blocks = c->max_seqs * c->max_blocks;
    c->out_cols = (int)ir_type_numel(&m->outputs[0]->type, 0);
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        if (op->kind == IR_OP_EMBEDDING && op->n_in >= 2) {
            int rows = (int)op->in[1]->type.dims[0];
            if (!c->vocab || rows < c->vocab)
                c->vocab = rows;
        }
    }
    MOEC_TRY(check_memory(c));

    for (int s = 0; s < 2; s++)
        MOEC_TRY(CK(cudaStreamCreateWithFlags(&c->stream[s], cudaStreamNonBlocking), "a stream"));
    MOEC_TRY(CK(cudaEventCreateWithFlags(&c->head, cudaEventDisableTiming), "an event"));
    MOEC_TRY(CK(cudaEventCreateWithFlags(&c->tail, cudaEventDisableTiming), "an event"));

    c->n_buckets = p->n_buckets;
    c->buckets = calloc((size_t)p->n_buckets, sizeof *c->buckets);
    c->weights = calloc((size_t)m->n_values + 1, sizeof *c->weights);
    c->weight_bytes = calloc((size_t)m->n_values + 1, sizeof *c->weight_bytes);
    c->kv = calloc(2 * (size_t)m->n_ops + 2, sizeof *c->kv);
    c->kv_bytes = calloc(2 * (size_t)m->n_ops + 2, sizeof *c->kv_bytes);
    if (!c->buckets || !c->weights || !c->weight_bytes || !c->kv || !c->kv_bytes)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory setting up the CUDA runtime");
    for (int b = 0; b < p->n_buckets; b++) {
        c->buckets[b].b = &p->buckets[b];
        MOEC_TRY(load_kernels(c, &c->buckets[b]));
    }
    MOEC_TRY(upload_weights(c, w));
    MOEC_TRY(alloc_kv(c));
    MOEC_TRY(alloc_buffers(c));
    for (int s = 0; s < 2; s++) {
        MOEC_TRY(LT(c, c->lt.cublasLtCreate(&c->lt_handle[s]), "a cuBLASLt handle"));
        MOEC_TRY(dev_alloc(c, &c->workspace[s], RT_CUDA_WORKSPACE, "a cuBLASLt workspace"));
    }
    for (int b = 0; b < p->n_buckets; b++)
        MOEC_TRY(prepare_bucket(c, &c->buckets[b]));
    return CK(cudaDeviceSynchronize(), "finishing the set-up");
}

moec_status rt_cuda_init(const ir_plan *plan, const rt_weights *w, int max_seqs, int max_seq_len,
                         rt_cuda **out)
{
    if (!out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_init: out is NULL");
    *out = NULL;
    if (!plan || !w)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_init: NULL plan or weights");
    MOEC_TRY(check_plan(plan, max_seqs, max_seq_len));
    int n = 0;
    MOEC_TRY(moec_cuda_device_count(&n));
    rt_cuda *c = calloc(1, sizeof *c);
    if (!c)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    c->plan = plan;
    c->max_seqs = max_seqs;
    c->max_seq_len = max_seq_len;
    moec_status st = setup(c, w);
    if (st != MOEC_OK) {
        rt_cuda_free(c);
        return st;
    }
    *out = c;
    return MOEC_OK;
}

void rt_cuda_free(rt_cuda *c)
{
    if (!c)
        return;
    cudaSetDevice(c->device);
    for (int s = 0; s < 2; s++)
        if (c->stream[s])
            cudaStreamSynchronize(c->stream[s]);
    for (int b = 0; b < c->n_buckets && c->buckets; b++) {
        rt_cuda_bucket *cb = &c->buckets[b];
        for (int i = 0; cb->launches && i < cb->b->n_steps; i++) {
            rt_cuda_launch *L = &cb->launches[i];
            rt_cuda_gemm *g = &L->gemm;
            if (g->la)
                c->lt.cublasLtMatrixLayoutDestroy(g->la);
            if (g->lb)
                c->lt.cublasLtMatrixLayoutDestroy(g->lb);
            if (g->lc)
                c->lt.cublasLtMatrixLayoutDestroy(g->lc);
            if (g->desc)
                c->lt.cublasLtMatmulDescDestroy(g->desc);
            if (L->event)
                cudaEventDestroy(L->event);
        }
        for (int k = 0; k < 2; k++)
            if (cb->graph[k])
                cudaGraphExecDestroy(cb->graph[k]);
        free(cb->launches);
        free(cb->kernels);
        free(cb->info);
        if (cb->loaded)
            cudaLibraryUnload(cb->lib);
    }
    free(c->buckets);
    for (int s = 0; s < 2; s++) {
        if (c->lt_handle[s])
            c->lt.cublasLtDestroy(c->lt_handle[s]);
        cudaFree(c->workspace[s]);
    }
    for (int i = 0; c->weights && i < c->plan->module->n_values; i++)
        cudaFree(c->weights[i]);
    for (int i = 0; c->kv && i < 2 * c->plan->module->n_ops; i++)
        cudaFree(c->kv[i]);
    free(c->weights);
    free(c->weight_bytes);
    free(c->kv);
    free(c->kv_bytes);
    cudaFree(c->arena);
    cudaFree(c->scratch);
    cudaFree(c->inputs);
    cudaFreeHost(c->host_in);
    if (c->head)
        cudaEventDestroy(c->head);
    if (c->tail)
        cudaEventDestroy(c->tail);
    for (int s = 0; s < 2; s++)
        if (c->stream[s])
            cudaStreamDestroy(c->stream[s]);
    if (c->lt.dl)
        dlclose(c->lt.dl);
    free(c);
}

/* ---- a step ---------------------------------------------------------------- */

static moec_status check_inputs(const rt_cuda *c, int n, const int32_t *tokens,
                                const int32_t *positions, const int32_t *slots)
{
    if (n < 1 || n > c->tmax)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "a step runs 1 to %d tokens, not %d", c->tmax, n);
    for (int i = 0; i < n; i++) {
        if (slots[i] < 0 || slots[i] >= c->max_seqs)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "token %d: slot %d is not in [0, %d)", i,
                            slots[i], c->max_seqs);
        if (positions[i] < 0)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "token %d: position %d is negative", i,
                            positions[i]);
        if (positions[i] >= c->max_seq_len)
            return MOEC_ERR(MOEC_ERR_CAPACITY,
                            "token %d: position %d of slot %d does not fit the KV cache of %d "
                            "tokens per sequence",
                            i, positions[i], slots[i], c->max_seq_len);
        if (c->vocab && (tokens[i] < 0 || tokens[i] >= c->vocab))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "token %d: id %d is outside the vocabulary (%d ids)", i, tokens[i],
                            c->vocab);
    }
    return MOEC_OK;
}

/* Launches steps from .. to-1 of the bucket, in order. */
static moec_status run_steps(rt_cuda *c, rt_cuda_bucket *cb, int from, int to)
{
    const ir_bucket *b = cb->b;
    char where[512];
    for (int i = from; i < to; i++) {
        const ir_step *s = &b->steps[i];
        rt_cuda_launch *L = &cb->launches[i];
        int sk = c->single_stream ? 0 : s->stream;
        cudaStream_t stream = c->stream[sk];
        cudaError_t e = cudaSuccess;
        if (c->single_stream && (s->kind == IR_STEP_FORK || s->kind == IR_STEP_JOIN))
            continue;
        const char *call = "";
        switch (s->kind) {
        case IR_STEP_KERNEL: {
            dim3 grid = {s->grid[0], s->grid[1], s->grid[2]};
            dim3 block = {s->block[0], s->block[1], s->block[2]};
            if (c->pdl) {
                /* a programmatic dependent of the kernel before it on the
                   stream: scheduled while that one runs, waiting in
                   moec_pdl_enter for its results */
                cudaLaunchAttribute attr;
                attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
                attr.val.programmaticStreamSerializationAllowed = 1;
                cudaLaunchConfig_t cfg = {grid, block, s->smem, stream, &attr, 1};
                call = "cudaLaunchKernelExC";
                e = cudaLaunchKernelExC(&cfg, (const void *)L->kernel, L->args);
            } else {
                call = "cudaLaunchKernel";
                e = cudaLaunchKernel((const void *)L->kernel, grid, block, L->args, s->smem, stream);
            }
            break;
        }
        case IR_STEP_GEMM: {
            rt_cuda_gemm *g = &L->gemm;
            cublasStatus_t ls = c->lt.cublasLtMatmul(
                c->lt_handle[sk], g->desc, &g->alpha, g->a, g->la, g->b, g->lb, &g->beta,
                g->c, g->lc, g->c, g->lc, &g->algo, c->workspace[sk], RT_CUDA_WORKSPACE,
                stream);
            if (ls != CUBLAS_STATUS_SUCCESS)
                return LT(c, ls, step_where(c, cb, i, where, sizeof where));
            break;
        }
        case IR_STEP_FORK: /* stream 1 waits for stream 0 */
            call = "cudaEventRecord";
            e = cudaEventRecord(L->event, c->stream[0]);
            if (e == cudaSuccess) {
                call = "cudaStreamWaitEvent";
                e = cudaStreamWaitEvent(c->stream[1], L->event, 0);
            }
            break;
        case IR_STEP_JOIN: /* stream 0 waits for stream 1 */
            call = "cudaEventRecord";
            e = cudaEventRecord(L->event, c->stream[1]);
            if (e == cudaSuccess) {
                call = "cudaStreamWaitEvent";
                e = cudaStreamWaitEvent(c->stream[0], L->event, 0);
            }
            break;
        }
        if (e != cudaSuccess)
            return rt_cuda_fail(MOEC_ERR_CUDA, __FILE__, __LINE__,
                                step_where(c, cb, i, where, sizeof where), call,
                                cudaGetErrorName(e), cudaGetErrorString(e));
        if (c->debug_sync) {
            for (int k = 0; k < 2 && e == cudaSuccess; k++)
                e = cudaStreamSynchronize(c->stream[k]);
            if (e != cudaSuccess)
                return MOEC_ERR(MOEC_ERR_CUDA, "%s: cudaStreamSynchronize after it (MOEC_CUDA_SYNC): %s: %s",
                                step_where(c, cb, i, where, sizeof where), cudaGetErrorName(e),
                                cudaGetErrorString(e));
        }
    }
    return MOEC_OK;
}

/* The bucket that holds n tokens (check_inputs has checked n). */
static rt_cuda_bucket *bucket_for(rt_cuda *c, int n)
{
    for (int b = 0; b < c->n_buckets; b++)
        if (c->buckets[b].b->T >= n)
            return &c->buckets[b];
    return NULL;
}

/* Writes the step inputs (padding rows: token 0, position 0, slot -1). */
static moec_status write_inputs(rt_cuda *c, int n, const int32_t *tokens, const int32_t *positions,
                                const int32_t *slots, const char *where)
{
    int32_t *h = c->host_in;
    for (int i = 0; i < c->in_stride; i++) {
        h[i] = i < n ? tokens[i] : 0;
        h[c->in_stride + i] = i < n ? positions[i] : 0;
        h[2 * c->in_stride + i] = i < n ? slots[i] : -1;
    }
    return CK(cudaMemcpyAsync(c->inputs, h, 3 * (size_t)c->in_stride * sizeof *h,
                              cudaMemcpyHostToDevice, c->stream[0]),
              where);
}

/* Runs one step of bucket cb on the inputs already written. Stream 1 starts
 * after what stream 0 did before and ends before what it does next,
 * whatever forks and joins the plan has. */
static moec_status launch_step(rt_cuda *c, rt_cuda_bucket *cb, int stop_op, const char *where)
{
    MOEC_TRY(CK(cudaEventRecord(c->head, c->stream[0]), where));
    MOEC_TRY(CK(cudaStreamWaitEvent(c->stream[1], c->head, 0), where));
    int end = 0; /* the steps of ops before stop_op, or all */
    while (end < cb->b->n_steps && (stop_op < 0 || cb->b->steps[end].op_id < stop_op))
        end++;
    MOEC_TRY(run_steps(c, cb, 0, end));
    MOEC_TRY(CK(cudaEventRecord(c->tail, c->stream[1]), where));
    return CK(cudaStreamWaitEvent(c->stream[0], c->tail, 0), where);
}

/* Drops every bucket's graph of the current stream mode. */
static void drop_graphs(rt_cuda *c)
{
    for (int b = 0; b < c->n_buckets; b++) {
        cudaGraphExec_t *g = &c->buckets[b].graph[c->single_stream];
        if (*g) {
            cudaGraphExecDestroy(*g);
            *g = NULL;
        }
    }
}

/* Captures one whole step of cb, exactly what launch_step(c, cb, -1) issues
 * (the head fork of stream 1, every step with the plan's own forks and
 * joins, or all on stream 0 in single-stream mode, the tail join), into
 * cb->graph of the current mode. The cuBLASLt steps are capturable
 * because nothing is chosen or allocated while they run: their algorithms
 * were picked by the heuristic at init and each stream's handle has its own
 * workspace, preallocated at init and alive as long as the context. On a
 * failure the capture is still ended (stream 1 joined first, so that no
 * stream is left capturing) and its graph discarded. */
static moec_status capture_bucket(rt_cuda *c, rt_cuda_bucket *cb)
{
    char where[96];
    snprintf(where, sizeof where, "capturing the step of bucket T=%d", cb->b->T);
    MOEC_TRY(CK(cudaStreamBeginCapture(c->stream[0], cudaStreamCaptureModeThreadLocal), where));
    int joined = 0;
    moec_status st = CK(cudaEventRecord(c->head, c->stream[0]), where);
    if (st == MOEC_OK)
        st = CK(cudaStreamWaitEvent(c->stream[1], c->head, 0), where);
    if (st == MOEC_OK)
        st = run_steps(c, cb, 0, cb->b->n_steps);
    if (st == MOEC_OK)
        st = CK(cudaEventRecord(c->tail, c->stream[1]), where);
    if (st == MOEC_OK) {
        st = CK(cudaStreamWaitEvent(c->stream[0], c->tail, 0), where);
        joined = st == MOEC_OK;
    }
    if (!joined && cudaEventRecord(c->tail, c->stream[1]) == cudaSuccess)
        (void)cudaStreamWaitEvent(c->stream[0], c->tail, 0);
    cudaGraph_t graph = NULL;
    if (st == MOEC_OK)
        st = CK(cudaStreamEndCapture(c->stream[0], &graph), where);
    else
        (void)cudaStreamEndCapture(c->stream[0], &graph);
    if (st == MOEC_OK && !graph)
        st = MOEC_ERR(MOEC_ERR_CUDA, "%s: cudaStreamEndCapture gave no graph", where);
    cudaGraphExec_t *exec = &cb->graph[c->single_stream];
    if (st == MOEC_OK)
        st = CK(cudaGraphInstantiate(exec, graph, 0), where);
    if (st == MOEC_OK)
        st = CK(cudaGraphUpload(*exec, c->stream[0]), where);
    if (graph)
        cudaGraphDestroy(graph);
    if (st != MOEC_OK) {
        if (*exec)
            cudaGraphExecDestroy(*exec);
        *exec = NULL;
        (void)cudaGetLastError(); /* clear what the failed capture left */
    }
    return st;
}

moec_status rt_cuda_capture(rt_cuda *c)
{
    if (!c)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_capture: the context is NULL");
    MOEC_TRY(CK(cudaSetDevice(c->device), "capturing the steps"));
    MOEC_TRY(CK(cudaDeviceSynchronize(), "capturing the steps"));
    drop_graphs(c);
    int debug_sync = c->debug_sync; /* no synchronization may be captured */
    c->debug_sync = 0;
    moec_status st = MOEC_OK;
    for (int b = 0; b < c->n_buckets && st == MOEC_OK; b++)
        st = capture_bucket(c, &c->buckets[b]);
    c->debug_sync = debug_sync;
    if (st == MOEC_OK)
        st = CK(cudaStreamSynchronize(c->stream[0]), "uploading the captured steps");
    if (st != MOEC_OK)
        drop_graphs(c);
    return st;
}

void rt_cuda_set_single_stream(rt_cuda *c, int single)
{
    if (c)
        c->single_stream = single != 0;
}

void rt_cuda_set_graphs(rt_cuda *c, int on)
{
    if (c)
        c->graphs_off = !on;
}

int rt_cuda_graphs_captured(const rt_cuda *c)
{
    if (!c || !c->n_buckets)
        return 0;
    for (int b = 0; b < c->n_buckets; b++)
        if (!c->buckets[b].graph[c->single_stream])
            return 0;
    return 1;
}

/* Runs one whole step of cb: its graph of the current stream mode when it
 * was captured, graphs are not turned off (rt_cuda_set_graphs) and steps
 * are not synchronized one by one (MOEC_CUDA_SYNC=1, which needs the eager
 * launches to name a fault); otherwise launch_step. */
static moec_status run_step(rt_cuda *c, rt_cuda_bucket *cb, const char *where)
{
    cudaGraphExec_t g = cb->graph[c->single_stream];
    if (g && !c->graphs_off && !c->debug_sync)
        return CK(cudaGraphLaunch(g, c->stream[0]), where);
    return launch_step(c, cb, -1, where);
}

static moec_status sync_stream0(rt_cuda *c, const char *where)
{
    cudaError_t e = cudaStreamSynchronize(c->stream[0]);
    if (e != cudaSuccess)
        return MOEC_ERR(MOEC_ERR_CUDA, "%s: cudaStreamSynchronize: %s: %s%s", where,
                        cudaGetErrorName(e), cudaGetErrorString(e),
                        c->debug_sync ? "" : " (something this step ran failed; MOEC_CUDA_SYNC=1 names it)");
    return MOEC_OK;
}

moec_status rt_cuda_step(rt_cuda *c, int n, const int32_t *tokens, const int32_t *positions,
                         const int32_t *slots, float *logits_out, int32_t *sampled_out)
{
    if (!c || !tokens || !positions || !slots)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_step: NULL argument");
    MOEC_TRY(check_inputs(c, n, tokens, positions, slots));
    rt_cuda_bucket *cb = bucket_for(c, n);
    char where[128];
    snprintf(where, sizeof where, "step of %d tokens (bucket T=%d)", n, cb->b->T);
    MOEC_TRY(CK(cudaSetDevice(c->device), where));
    MOEC_TRY(write_inputs(c, n, tokens, positions, slots, where));
    MOEC_TRY(run_step(c, cb, where));
    cudaStream_t s0 = c->stream[0];
    if (logits_out)
        MOEC_TRY(CK(cudaMemcpyAsync(logits_out, cb->logits,
                                    (size_t)n * (size_t)c->out_cols * sizeof *logits_out,
                                    cudaMemcpyDeviceToHost, s0),
                    where));
    if (sampled_out)
        MOEC_TRY(CK(cudaMemcpyAsync(sampled_out, c->input_ptr[IR_INPUT_SAMPLED],
                                    (size_t)n * sizeof *sampled_out, cudaMemcpyDeviceToHost, s0),
                    where));
    return sync_stream0(c, where);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

moec_status rt_cuda_time_steps(rt_cuda *c, int n, const int32_t *tokens, const int32_t *positions,
                               const int32_t *slots, int warmup, int iters, float *median_ms)
{
    if (!c || !tokens || !positions || !slots || !median_ms || iters < 1 || warmup < 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_time_steps: bad argument");
    MOEC_TRY(check_inputs(c, n, tokens, positions, slots));
    rt_cuda_bucket *cb = bucket_for(c, n);
    char where[128];
    snprintf(where, sizeof where, "timed steps of %d tokens (bucket T=%d)", n, cb->b->T);
    MOEC_TRY(CK(cudaSetDevice(c->device), where));
    MOEC_TRY(write_inputs(c, n, tokens, positions, slots, where));
    for (int i = 0; i < warmup; i++)
        MOEC_TRY(run_step(c, cb, where));
    cudaEvent_t *ev = calloc((size_t)iters + 1, sizeof *ev);
    float *ms = calloc((size_t)iters, sizeof *ms);
    moec_status st = ev && ms ? MOEC_OK : MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    int made = 0;
    for (; st == MOEC_OK && made <= iters; made++)
        st = CK(cudaEventCreate(&ev[made]), where);
    for (int i = 0; st == MOEC_OK && i < iters; i++) {
        st = CK(cudaEventRecord(ev[i], c->stream[0]), where);
        if (st == MOEC_OK)
            st = run_step(c, cb, where);
    }
    if (st == MOEC_OK)
        st = CK(cudaEventRecord(ev[iters], c->stream[0]), where);
    if (st == MOEC_OK)
        st = sync_stream0(c, where);
    for (int i = 0; st == MOEC_OK && i < iters; i++)
        st = CK(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]), where);
    if (st == MOEC_OK) {
        qsort(ms, (size_t)iters, sizeof *ms, cmp_float);
        *median_ms = ms[iters / 2];
    }
    for (int i = 0; i < made; i++)
        cudaEventDestroy(ev[i]);
    free(ev);
    free(ms);
    return st;
}

moec_status rt_cuda_profile_steps(rt_cuda *c, int n, const int32_t *tokens,
                                  const int32_t *positions, const int32_t *slots, int iters,
                                  double *step_ms)
{
    if (!c || !tokens || !positions || !slots || !step_ms || iters < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_profile_steps: bad argument");
    MOEC_TRY(check_inputs(c, n, tokens, positions, slots));
    rt_cuda_bucket *cb = bucket_for(c, n);
    const ir_bucket *b = cb->b;
    char where[128];
    snprintf(where, sizeof where, "profiled steps of %d tokens (bucket T=%d)", n, b->T);
    MOEC_TRY(CK(cudaSetDevice(c->device), where));
    MOEC_TRY(write_inputs(c, n, tokens, positions, slots, where));
    int single = c->single_stream;
    c->single_stream = 1; /* one stream, so that the events bracket one step each */
    cudaEvent_t *ev = calloc((size_t)b->n_steps + 1, sizeof *ev);
    moec_status st = ev ? MOEC_OK : MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    int made = 0;
    for (; st == MOEC_OK && made <= b->n_steps; made++)
        st = CK(cudaEventCreate(&ev[made]), where);
    for (int i = 0; i < b->n_steps; i++)
        step_ms[i] = 0;
    for (int it = 0; st == MOEC_OK && it <= iters; it++) { /* the first is a warm-up */
        for (int i = 0; st == MOEC_OK && i < b->n_steps; i++) {
            st = CK(cudaEventRecord(ev[i], c->stream[0]), where);
            if (st != MOEC_OK)
                break;
            st = run_steps(c, cb, i, i + 1);
        }
        if (st == MOEC_OK)
            st = CK(cudaEventRecord(ev[b->n_steps], c->stream[0]), where);
        if (st == MOEC_OK)
            st = sync_stream0(c, where);
        for (int i = 0; st == MOEC_OK && it > 0 && i < b->n_steps; i++) {
            float ms = 0;
            st = CK(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]), where);
            step_ms[i] += ms / iters;
        }
    }
    c->single_stream = single;
    for (int i = 0; i < made; i++)
        cudaEventDestroy(ev[i]);
    free(ev);
    return st;
}

moec_status rt_cuda_run_until(rt_cuda *c, int n, const int32_t *tokens, const int32_t *positions,
                              const int32_t *slots, int stop_op)
{
    if (!c || !tokens || !positions || !slots || stop_op < 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_run_until: bad argument");
    MOEC_TRY(check_inputs(c, n, tokens, positions, slots));
    rt_cuda_bucket *cb = bucket_for(c, n);
    char where[128];
    snprintf(where, sizeof where, "partial step of %d tokens up to op %d", n, stop_op);
    MOEC_TRY(CK(cudaSetDevice(c->device), where));
    MOEC_TRY(write_inputs(c, n, tokens, positions, slots, where));
    MOEC_TRY(launch_step(c, cb, stop_op, where));
    return sync_stream0(c, where);
}

moec_status rt_cuda_read_value(rt_cuda *c, int n, const ir_value *v, void *dst, size_t cap)
{
    if (!c || !v || !dst || n < 1 || n > c->tmax)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_read_value: bad argument");
    if (v->kind == IR_VALUE_WEIGHT || v->mem_offset < 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%%%s is not an activation with an arena offset",
                        v->name);
    rt_cuda_bucket *cb = bucket_for(c, n);
    ir_dtype dt = ir_value_storage_dtype(c->plan->module, v, c->plan->compute_dtype);
    size_t bytes = (size_t)n * (size_t)ir_type_numel(&v->type, 1) * ir_dtype_size(dt);
    if (bytes > cap)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%%%s: %zu bytes do not fit in %zu", v->name, bytes, cap);
    char where[256];
    snprintf(where, sizeof where, "reading %%%s", v->name);
    MOEC_TRY(CK(cudaMemcpy(dst, c->arena + (size_t)v->mem_offset * (size_t)cb->b->T, bytes,
                           cudaMemcpyDeviceToHost),
                where));
    return MOEC_OK;
}

moec_status rt_cuda_copy_bandwidth(size_t bytes, int iters, double *bytes_per_s)
{
    if (!bytes_per_s || iters < 1 || bytes < 16)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_copy_bandwidth: bad argument");
    const char *where = "measuring copy bandwidth";
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float *ms = calloc((size_t)iters, sizeof *ms);
    moec_status st = ms ? CK(cudaMalloc(&a, bytes), where) : MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    if (st == MOEC_OK)
        st = CK(cudaMalloc(&b, bytes), where);
    if (st == MOEC_OK)
        st = CK(cudaMemset(a, 1, bytes), where);
    if (st == MOEC_OK)
        st = CK(cudaEventCreate(&e0), where);
    if (st == MOEC_OK)
        st = CK(cudaEventCreate(&e1), where);
    for (int i = -2; st == MOEC_OK && i < iters; i++) { /* two warm-up copies */
        st = CK(cudaEventRecord(e0, 0), where);
        if (st == MOEC_OK)
            st = CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0), where);
        if (st == MOEC_OK)
            st = CK(cudaEventRecord(e1, 0), where);
        if (st == MOEC_OK)
            st = CK(cudaEventSynchronize(e1), where);
        if (st == MOEC_OK && i >= 0)
            st = CK(cudaEventElapsedTime(&ms[i], e0, e1), where);
    }
    if (st == MOEC_OK) {
        qsort(ms, (size_t)iters, sizeof *ms, cmp_float);
        *bytes_per_s = 2.0 * (double)bytes / (ms[iters / 2] * 1e-3);
    }
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    free(ms);
    return st;
}

const char *rt_cuda_device_name(const rt_cuda *c) { return c ? c->device_name : "none"; }

int rt_cuda_max_tokens(const rt_cuda *c) { return c ? c->tmax : 0; }
int rt_cuda_logits_cols(const rt_cuda *c) { return c ? c->out_cols : 0; }
size_t rt_cuda_device_bytes(const rt_cuda *c) { return c ? c->device_bytes : 0; }

#endif
