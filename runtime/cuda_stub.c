/* cuda_stub.c — the CUDA runtime's entry points in a build without the
 * CUDA toolkit: each answers MOEC_ERR_NO_DEVICE (after the checks that need
 * no device), so the CPU paths build and run everywhere. */
#ifndef MOEC_HAVE_CUDA

#include "err.h"
#include "runtime/cuda_rt.h"

moec_status rt_cuda_init_rank(const ir_plan *plan, const rt_weights *w, const rt_cuda_sizes *sz,
                              int device, rt_comm *comm, rt_cuda **out)
{
    (void)device;
    if (!out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_init: out is NULL");
    *out = NULL;
    if (!plan || !w || !sz)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_init: NULL plan or weights");
    MOEC_TRY(rt_cuda_check_plan(plan, sz));
    MOEC_TRY(rt_cuda_check_comm(plan, comm));
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
}

moec_status rt_cuda_init_sized(const ir_plan *plan, const rt_weights *w, const rt_cuda_sizes *sz,
                               rt_cuda **out)
{
    return rt_cuda_init_rank(plan, w, sz, 0, NULL, out);
}

moec_status rt_cuda_set_blocks(rt_cuda *c, int row, int first, int n, const int32_t *blocks)
{
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
}

moec_status rt_cuda_check_inputs(const rt_cuda *c, int n, const int32_t *tokens,
                                 const int32_t *positions, const int32_t *slots)
{
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
}

moec_status rt_cuda_set_sampling(rt_cuda *c, int n, const ir_sample_row *rows, int n_pen,
                                 const ir_sample_pen *pens, int32_t *tokens_out,
                                 float *logprobs_out)
{
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
}

int rt_cuda_sample_capacity(const rt_cuda *c) { return -1; }
int rt_cuda_kv_blocks(const rt_cuda *c) { return 0; }
size_t rt_cuda_kv_block_bytes(const rt_cuda *c) { return 0; }

void rt_cuda_free(rt_cuda *c) { (void)c; }

moec_status rt_comm_init_all(int n, const int *devs, rt_comm **out)
{
    (void)n;
    (void)devs;
    (void)out;
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
}

void rt_comm_abort(rt_comm *c) { (void)c; }
void rt_comm_free_all(rt_comm **comms, int n) { (void)comms; (void)n; }
int rt_comm_rank(const rt_comm *c) { (void)c; return 0; }
int rt_comm_size(const rt_comm *c) { (void)c; return 1; }
int rt_comm_device(const rt_comm *c) { (void)c; return 0; }
moec_status rt_comm_error(rt_comm *c, const char *where)
{
    (void)c;
    (void)where;
    return MOEC_OK;
}

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
