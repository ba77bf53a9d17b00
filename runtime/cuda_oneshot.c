/* cuda_oneshot.c — the one-shot all-reduce for small messages (docs/
 * PARALLEL.md, "Small all-reduces"; its kernel: codegen/allreduce_oneshot.c).
 * A decode step's all-reduces carry a few tokens of the hidden state, where
 * NCCL's latency (10-20 us on H100) dominates; here each rank copies its
 * part into a staging buffer every peer reads directly (peer access between
 * the GPUs of this process, or one GPU), flags the peers, and sums every
 * rank's buffer itself.
 *
 * What a group holds, made once: per rank, on its GPU, a staging buffer of
 * two halves (the call's epoch parity picks one), its flags ([block][source
 * rank]) and its blocks' epoch counters, and tables of every rank's staging
 * and flags; in host memory every GPU maps, the abort word (rt_oneshot_abort
 * sets it: spinning ranks give up) and the error word the kernels set when
 * they give up. The kernel's arguments never change, so a CUDA Graph replays
 * it as it is. */
#ifdef MOEC_HAVE_CUDA

#include "runtime/cuda_internal.h"

struct rt_oneshot {
    int n;
    int devs[IR_MAX_RANKS];
    size_t half_bytes;                  /* one staging half: the largest message */
    void *buf[IR_MAX_RANKS];            /* two halves each, on devs[r] */
    unsigned *flags[IR_MAX_RANKS];      /* RT_ONESHOT_MAX_BLOCKS * n */
    unsigned *epochs[IR_MAX_RANKS];     /* RT_ONESHOT_MAX_BLOCKS */
    void **buf_table[IR_MAX_RANKS];     /* on devs[r]: buf[0 .. n-1] */
    unsigned **flag_table[IR_MAX_RANKS];/* on devs[r]: flags[0 .. n-1] */
    volatile int *words;                /* host, mapped: [0] abort, [1] error */
    unsigned long long timeout_ns;
};

/* The most blocks a call launches: the largest message in bytes of the
 * narrowest dtype (2) over a block's elements. */
static size_t max_blocks(size_t half_bytes)
{
    return (half_bytes / 2 + IR_ONESHOT_CHUNK - 1) / IR_ONESHOT_CHUNK;
}

/* Every pair of distinct GPUs of the group reading each other's memory. */
static moec_status enable_peers(const rt_oneshot *o)
{
    const char *where = "the one-shot all-reduce's peer access";
    for (int i = 0; i < o->n; i++)
        for (int j = 0; j < o->n; j++) {
            if (o->devs[i] == o->devs[j])
                continue;
            int ok = 0;
            MOEC_TRY(CK(cudaDeviceCanAccessPeer(&ok, o->devs[i], o->devs[j]), where));
            if (!ok)
                return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                                "%s: GPU %d cannot read GPU %d's memory (no peer access)", where,
                                o->devs[i], o->devs[j]);
            MOEC_TRY(CK(cudaSetDevice(o->devs[i]), where));
            cudaError_t e = cudaDeviceEnablePeerAccess(o->devs[j], 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled)
                (void)cudaGetLastError(); /* enabled before: fine, and not sticky */
            else
                MOEC_TRY(CK(e, where));
        }
    return MOEC_OK;
}

/* Rank r's staging, flags, counters and tables on its GPU. */
static moec_status alloc_rank(rt_oneshot *o, int r)
{
    const char *where = "allocating the one-shot all-reduce's buffers";
    size_t nb = max_blocks(o->half_bytes);
    MOEC_TRY(CK(cudaSetDevice(o->devs[r]), where));
    MOEC_TRY(CK(cudaMalloc(&o->buf[r], 2 * o->half_bytes), where));
    MOEC_TRY(CK(cudaMalloc((void **)&o->flags[r], nb * (size_t)o->n * sizeof(unsigned)), where));
    MOEC_TRY(CK(cudaMemset(o->flags[r], 0, nb * (size_t)o->n * sizeof(unsigned)), where));
    MOEC_TRY(CK(cudaMalloc((void **)&o->epochs[r], nb * sizeof(unsigned)), where));
    MOEC_TRY(CK(cudaMemset(o->epochs[r], 0, nb * sizeof(unsigned)), where));
    MOEC_TRY(CK(cudaMalloc((void **)&o->buf_table[r], (size_t)o->n * sizeof(void *)), where));
    return CK(cudaMalloc((void **)&o->flag_table[r], (size_t)o->n * sizeof(unsigned *)), where);
}

moec_status rt_oneshot_init(int n, const int *devs, size_t max_bytes, rt_oneshot **out)
{
    *out = NULL;
    if (n < 1 || n > IR_MAX_RANKS || !devs || max_bytes < 16)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_oneshot_init: %d ranks, %zu bytes", n,
                        max_bytes);
    rt_oneshot *o = calloc(1, sizeof *o);
    if (!o)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    o->n = n;
    memcpy(o->devs, devs, (size_t)n * sizeof *devs);
    o->half_bytes = (max_bytes + 255) / 256 * 256;
    o->timeout_ns = 10ull * 1000 * 1000 * 1000;
    int cur = 0;
    moec_status st = CK(cudaGetDevice(&cur), "the one-shot all-reduce");
    if (st == MOEC_OK)
        st = enable_peers(o);
    for (int r = 0; st == MOEC_OK && r < n; r++)
        st = alloc_rank(o, r);
    for (int r = 0; st == MOEC_OK && r < n; r++) {
        const char *where = "filling the one-shot all-reduce's tables";
        st = CK(cudaSetDevice(devs[r]), where);
        if (st == MOEC_OK)
            st = CK(cudaMemcpy(o->buf_table[r], o->buf, (size_t)n * sizeof(void *),
                               cudaMemcpyHostToDevice),
                    where);
        if (st == MOEC_OK)
            st = CK(cudaMemcpy(o->flag_table[r], o->flags, (size_t)n * sizeof(unsigned *),
                               cudaMemcpyHostToDevice),
                    where);
    }
    void *words = NULL;
    if (st == MOEC_OK)
        st = CK(cudaHostAlloc(&words, 2 * sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable),
                "the one-shot all-reduce's abort and error words");
    if (st == MOEC_OK) {
        o->words = words;
        o->words[0] = o->words[1] = 0;
    }
    cudaSetDevice(cur);
    if (st != MOEC_OK) {
        if (words && !o->words)
            cudaFreeHost(words);
        rt_oneshot_free(o);
        return st;
    }
    *out = o;
    return MOEC_OK;
}

void rt_oneshot_free(rt_oneshot *o)
{
    if (!o)
        return;
    for (int r = 0; r < o->n; r++) {
        cudaSetDevice(o->devs[r]);
        cudaFree(o->buf[r]);
        cudaFree(o->flags[r]);
        cudaFree(o->epochs[r]);
        cudaFree(o->buf_table[r]);
        cudaFree(o->flag_table[r]);
    }
    if (o->words)
        cudaFreeHost((void *)o->words);
    free(o);
}

size_t rt_oneshot_max_bytes(const rt_oneshot *o) { return o ? o->half_bytes : 0; }

void rt_oneshot_set_timeout(rt_oneshot *o, double seconds)
{
    o->timeout_ns = (unsigned long long)(seconds * 1e9);
}

void rt_oneshot_abort(rt_oneshot *o)
{
    if (o)
        __atomic_store_n(&o->words[0], 1, __ATOMIC_SEQ_CST);
}

moec_status rt_oneshot_error(const rt_oneshot *o, const char *where)
{
    int why = o ? __atomic_load_n(&o->words[1], __ATOMIC_SEQ_CST) : 0;
    if (why == 1)
        return MOEC_ERR(MOEC_ERR_CUDA,
                        "%s: the one-shot all-reduce waited %.1f s for a peer rank that never "
                        "flagged its part (a rank failed or is not running this step)",
                        where, (double)o->timeout_ns / 1e9);
    if (why)
        return MOEC_ERR(MOEC_ERR_CUDA,
                        "%s: the one-shot all-reduce stopped waiting for its peers: the group "
                        "was aborted",
                        where);
    return MOEC_OK;
}

moec_status rt_oneshot_run(void *user, int rank, cudaKernel_t kernel, const void *send,
                           void *recv, size_t count, ir_dtype dtype, cudaStream_t stream,
                           const char *where)
{
    rt_oneshot *o = user;
    size_t bytes = count * ir_dtype_size(dtype);
    if (!kernel || rank < 0 || rank >= o->n || bytes > o->half_bytes || count == 0)
        return MOEC_ERR(MOEC_ERR_INTERNAL,
                        "%s: the one-shot all-reduce of %zu bytes (rank %d of %d, at most %zu "
                        "bytes%s)",
                        where, bytes, rank, o->n, o->half_bytes, kernel ? "" : ", no kernel");
    unsigned long long n = count, half = o->half_bytes / ir_dtype_size(dtype);
    unsigned long long timeout = o->timeout_ns;
    const volatile int *abort_word = &o->words[0];
    int *err = (int *)&o->words[1];
    void *x = (void *)send, *bufs = o->buf_table[rank], *flags = o->flag_table[rank],
         *epochs = o->epochs[rank];
    void *args[] = {&x, &recv, &n, &bufs, &flags, &epochs, &rank, &half, &abort_word, &err,
                    &timeout};
    dim3 grid = {(unsigned)((count + IR_ONESHOT_CHUNK - 1) / IR_ONESHOT_CHUNK), 1, 1};
    dim3 block = {IR_ONESHOT_THREADS, 1, 1};
    return CK(cudaLaunchKernel((const void *)kernel, grid, block, args, 0, stream), where);
}

#endif
