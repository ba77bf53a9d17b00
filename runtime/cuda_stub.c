/* cuda_stub.c — the CUDA runtime's entry points in a build without the
 * CUDA toolkit: each answers MOEC_ERR_NO_DEVICE (after the checks that need
 * no device), so the CPU paths build and run everywhere. */
#ifndef MOEC_HAVE_CUDA

#include "err.h"
#include "runtime/cuda_rt.h"

moec_status rt_cuda_init_sized(const ir_plan *plan, const rt_weights *w, const rt_cuda_sizes *sz,
                               rt_cuda **out)
{
    if (!out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_init: out is NULL");
    *out = NULL;
    if (!plan || !w || !sz)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_init: NULL plan or weights");
    MOEC_TRY(rt_cuda_check_plan(plan, sz));
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
}

moec_status rt_cuda_set_blocks(rt_cuda *c, int row, int first, int n, const int32_t *blocks)
{
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
}

int rt_cuda_kv_blocks(const rt_cuda *c) { return 0; }
size_t rt_cuda_kv_block_bytes(const rt_cuda *c) { return 0; }

void rt_cuda_free(rt_cuda *c) { (void)c; }

moec_status rt_cuda_step(rt_cuda *c, int n, const int32_t *tokens, const int32_t *positions,
                         const int32_t *slots, float *logits_out, int32_t *sampled_out)
{
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
}

int rt_cuda_max_tokens(const rt_cuda *c) { return 0; }
int rt_cuda_logits_cols(const rt_cuda *c) { return 0; }
size_t rt_cuda_device_bytes(const rt_cuda *c) { return 0; }

moec_status rt_cuda_profile_steps(rt_cuda *c, int n, const int32_t *tokens,
                                  const int32_t *positions, const int32_t *slots, int iters,
                                  double *step_ms)
{
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
}

void rt_cuda_set_single_stream(rt_cuda *c, int single) { (void)c; (void)single; }

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

#endif
