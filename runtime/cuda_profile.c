/* cuda_profile.c — measurement: per-step kernel times (moec bench
 * --profile) and the device's copy bandwidth (the floor's denominator). */
#ifdef MOEC_HAVE_CUDA

#include "runtime/cuda_internal.h"

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

float rt_median_ms(float *ms, int n)
{
    qsort(ms, (size_t)n, sizeof *ms, cmp_float);
    return ms[n / 2];
}

moec_status rt_cuda_profile_steps(rt_cuda *c, int n, const int32_t *tokens,
                                  const int32_t *positions, const int32_t *slots, int iters,
                                  double *step_ms)
{
    if (!c || !tokens || !positions || !slots || !step_ms || iters < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_profile_steps: bad argument");
    MOEC_TRY(rt_cuda_check_inputs(c, n, tokens, positions, slots));
    rt_cuda_bucket *cb = rt_cuda_bucket_for(c, n);
    const ir_bucket *b = cb->b;
    char where[128];
    snprintf(where, sizeof where, "profiled steps of %d tokens (bucket T=%d)", n, b->T);
    MOEC_TRY(CK(cudaSetDevice(c->device), where));
    MOEC_TRY(rt_cuda_write_inputs(c, n, tokens, positions, slots, where));
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
            st = rt_cuda_run_steps(c, cb, i, i + 1);
        }
        if (st == MOEC_OK)
            st = CK(cudaEventRecord(ev[b->n_steps], c->stream[0]), where);
        if (st == MOEC_OK)
            st = rt_cuda_sync(c, where);
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
        *bytes_per_s = 2.0 * (double)bytes / (rt_median_ms(ms, iters) * 1e-3);
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

#endif
