/* cuda_memory.c — device memory: the arch and free-memory checks before
 * anything is allocated, the paged KV pools, the activation arena, scratch
 * and the step inputs. */
#ifdef MOEC_HAVE_CUDA

#include <ctype.h>

#include "runtime/cuda_internal.h"

moec_status rt_cuda_alloc(rt_cuda *c, void **p, size_t bytes, const char *what)
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

static size_t kv_pool_bytes(const rt_cuda *c, const ir_value *pool)
{
    return (size_t)c->max_seqs * (size_t)c->max_blocks * (size_t)c->plan->kv_block_size *
           (size_t)ir_type_numel(&pool->type, 0) * ir_dtype_size(c->plan->compute_dtype);
}

/* The bytes of op's two KV pools (0: none), 0 for an op without any:
 * attention k and v, mla_attention kv_c and k_pe, dsa_topk its keys and,
 * for the module's first dsa_topk only, the index score of every token of
 * the largest bucket at every position (f32 [tmax, max_blocks * block
 * size]), which every dsa_topk op of a step uses in turn (docs/CUDA.md). */
static int kv_pools(const rt_cuda *c, int k, size_t bytes[2], const ir_value *pool[2])
{
    const ir_module *m = c->plan->module;
    const ir_op *op = m->ops[k];
    bytes[0] = bytes[1] = 0;
    pool[0] = pool[1] = NULL;
    if (op->kind == IR_OP_ATTENTION && op->n_in >= 3) {
        pool[0] = op->in[1];
        pool[1] = op->in[2];
    } else if (op->kind == IR_OP_MLA_ATTENTION && op->n_in >= 4) {
        pool[0] = op->in[2];
        pool[1] = op->in[3];
    } else if (op->kind == IR_OP_DSA_TOPK && op->n_in >= 2) {
        pool[0] = op->in[1];
        int first = 1;
        for (int i = 0; i < k && first; i++)
            first = m->ops[i]->kind != IR_OP_DSA_TOPK;
        if (first)
            bytes[1] = (size_t)c->tmax * (size_t)c->max_blocks *
                       (size_t)c->plan->kv_block_size * sizeof(float);
    } else {
        return 0;
    }
    for (int p = 0; p < 2; p++)
        if (pool[p])
            bytes[p] = kv_pool_bytes(c, pool[p]);
    return 1;
}

/* A cubin built for sm_XY runs on compute capability X.Z with Z >= Y; one
 * built for an arch-specific target (sm_90a) only on X.Y itself. */
moec_status rt_cuda_check_arch(const rt_cuda *c)
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
moec_status rt_cuda_check_memory(const rt_cuda *c)
{
    const ir_plan *p = c->plan;
    const ir_module *m = p->module;
    size_t weights = 0, kv = 0, arena = 0, scratch = 0;
    for (int i = 0; i < m->n_values; i++)
        if (m->values[i]->kind == IR_VALUE_WEIGHT)
            weights += (size_t)ir_type_numel(&m->values[i]->type, 0) *
                       ir_dtype_size(ir_value_storage_dtype(m, m->values[i], p->compute_dtype));
    for (int k = 0; k < m->n_ops; k++) {
        size_t bytes[2];
        const ir_value *pool[2];
        if (kv_pools(c, k, bytes, pool))
            kv += bytes[0] + bytes[1];
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

/* The KV pools of every attention, mla_attention and dsa_topk op. */
moec_status rt_cuda_alloc_kv(rt_cuda *c)
{
    const ir_module *m = c->plan->module;
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        size_t bytes[2];
        const ir_value *pool[2];
        if (!kv_pools(c, k, bytes, pool))
            continue;
        for (int p = 0; p < 2; p++) {
            if (!bytes[p])
                continue;
            char where[512];
            snprintf(where, sizeof where, "KV pool %d (%%%s) of %s %%%s", p,
                     pool[p] ? pool[p]->name : "index scores", ir_op_name(op->kind),
                     op->out[0]->name);
            MOEC_TRY(rt_cuda_alloc(c, &c->kv[2 * k + p], bytes[p], where));
            c->kv_bytes[2 * k + p] = bytes[p];
            MOEC_TRY(CK(cudaMemset(c->kv[2 * k + p], 0, bytes[p]), where));
        }
    }
    return MOEC_OK;
}

/* Arena, scratch, the step inputs (with the static block table). */
moec_status rt_cuda_alloc_buffers(rt_cuda *c)
{
    const ir_plan *p = c->plan;
    for (int b = 0; b < p->n_buckets; b++) {
        if (p->buckets[b].arena_bytes > c->arena_bytes)
            c->arena_bytes = p->buckets[b].arena_bytes;
        if (p->buckets[b].scratch_bytes > c->scratch_bytes)
            c->scratch_bytes = p->buckets[b].scratch_bytes;
    }
    MOEC_TRY(rt_cuda_alloc(c, (void **)&c->arena, c->arena_bytes, "the activation arena"));
    /* Poisoned (NaN in every float type): a value read before it is written shows. */
    MOEC_TRY(CK(cudaMemset(c->arena, 0xff, c->arena_bytes ? c->arena_bytes : 256), "the arena"));
    if (c->scratch_bytes) {
        MOEC_TRY(rt_cuda_alloc(c, (void **)&c->scratch, c->scratch_bytes, "scratch"));
        MOEC_TRY(CK(cudaMemset(c->scratch, 0, c->scratch_bytes), "scratch"));
    }
    size_t table = (size_t)c->max_seqs * (size_t)c->max_blocks;
    size_t total = 4 * (size_t)c->in_stride + table;
    MOEC_TRY(rt_cuda_alloc(c, (void **)&c->inputs, total * sizeof(int32_t), "the step inputs"));
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

#endif
