/* cuda_host.c — the parts of the CUDA runtime that need no GPU: the bf16
 * conversion the weights go through, the checks of a plan made before any
 * device call (so that they hold, and are tested, without a GPU), and
 * rt_cuda_init over rt_cuda_init_sized. */
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

moec_status rt_cuda_init(const ir_plan *plan, const rt_weights *w, int max_seqs, int max_seq_len,
                         rt_cuda **out)
{
    rt_cuda_sizes sz = {.max_seqs = max_seqs, .max_seq_len = max_seq_len};
    return rt_cuda_init_sized(plan, w, &sz, out);
}

/* Checks what the runtime relies on in the plan and the module. */
moec_status rt_cuda_check_plan(const ir_plan *p, const rt_cuda_sizes *sz)
{
    if (sz->max_seqs < 1 || sz->max_seq_len < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "rt_cuda_init: max_seqs (%d) and max_seq_len (%d) must be positive",
                        sz->max_seqs, sz->max_seq_len);
    if (sz->kv_blocks < 0 || !(sz->kv_fraction >= 0 && sz->kv_fraction <= 1))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "rt_cuda_init: kv_blocks (%d) must be at least 0 and kv_fraction (%g) "
                        "from 0 to 1",
                        sz->kv_blocks, sz->kv_fraction);
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
