/* cuda_memory.c — device memory: the arch and free-memory checks before
 * anything is allocated, the paged KV pools (sized by a share of the memory
 * left once everything else is allocated, or given), the block table that
 * maps each sequence's positions to blocks (a fixed device buffer, its rows
 * uploaded as the host changes them), the activation arena, scratch and the
 * step inputs. */
#ifdef MOEC_HAVE_CUDA

#include <ctype.h>

#include "runtime/cuda_internal.h"
#include "runtime/step_check.h"

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

/* op's KV pools into pool (NULL: none); 0 for an op without any: attention
 * k and v, mla_attention kv_c and k_pe, dsa_topk its keys, all paged by the
 * block table. The module's first dsa_topk also has, as its second pool
 * (pool[1] NULL, *scores its bytes; 0 for every other op), the index score
 * of every token of the largest bucket at every position (f32 [tmax,
 * max_blocks * block size]), which every dsa_topk op of a step uses in turn
 * (docs/CUDA.md): not paged, its size fixed by the plan. */
static int kv_pools(const rt_cuda *c, int k, const ir_value *pool[2], size_t *scores)
{
    const ir_module *m = c->plan->module;
    const ir_op *op = m->ops[k];
    pool[0] = pool[1] = NULL;
    *scores = 0;
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
            *scores = (size_t)c->tmax * (size_t)c->max_blocks * (size_t)c->plan->kv_block_size *
                      sizeof(float);
    } else {
        return 0;
    }
    return 1;
}

/* The bytes of one block of one pool. */
static size_t kv_block_pool_bytes(const rt_cuda *c, const ir_value *pool)
{
    return (size_t)c->plan->kv_block_size * (size_t)ir_type_numel(&pool->type, 0) *
           ir_dtype_size(c->plan->compute_dtype);
}

size_t rt_cuda_kv_block_bytes(const rt_cuda *c)
{
    if (!c)
        return 0;
    const ir_module *m = c->plan->module;
    size_t bytes = 0, scores;
    for (int k = 0; k < m->n_ops; k++) {
        const ir_value *pool[2];
        if (kv_pools(c, k, pool, &scores))
            for (int p = 0; p < 2; p++)
                if (pool[p])
                    bytes += kv_block_pool_bytes(c, pool[p]);
    }
    return bytes;
}

/* The bytes of the pools that are not paged: the index scores. */
static size_t kv_scores_bytes(const rt_cuda *c)
{
    const ir_module *m = c->plan->module;
    size_t bytes = 0, scores;
    for (int k = 0; k < m->n_ops; k++) {
        const ir_value *pool[2];
        if (kv_pools(c, k, pool, &scores))
            bytes += scores;
    }
    return bytes;
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
    size_t weights = 0, arena = 0, scratch = 0;
    for (int i = 0; i < m->n_values; i++)
        if (m->values[i]->kind == IR_VALUE_WEIGHT)
            weights += ir_weight_storage_bytes(m, m->values[i], p->compute_dtype);
    /* a pool sized by kv_fraction takes what is left, checked when it is sized */
    size_t kv = (size_t)c->n_blocks * rt_cuda_kv_block_bytes(c) + kv_scores_bytes(c);
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
                    "cache %zu MiB (%d blocks of %d tokens), activations and scratch %zu MiB, "
                    "inputs and workspaces %zu MiB; device 0 (%s) has %zu bytes (%zu MiB) free "
                    "of %zu MiB",
                    need, need >> 20, weights >> 20, kv >> 20, c->n_blocks, p->kv_block_size,
                    (arena + scratch) >> 20, other >> 20, c->device_name, free_b, free_b >> 20,
                    total_b >> 20);
}

moec_status rt_cuda_size_kv(rt_cuda *c)
{
    size_t per_block = rt_cuda_kv_block_bytes(c);
    int full = c->max_seqs * c->max_blocks; /* every row at its longest */
    if (c->n_blocks || !per_block) {
        if (!c->n_blocks)
            c->n_blocks = full; /* no attention op: the table still maps positions */
        return MOEC_OK;
    }
    size_t free_b = 0, total_b = 0;
    MOEC_TRY(CK(cudaMemGetInfo(&free_b, &total_b), "reading device 0's free memory"));
    /* the index scores (not paged) come out of the share first */
    double share = (double)free_b * c->kv_fraction - (double)kv_scores_bytes(c);
    double blocks = share > 0 ? share / (double)per_block : 0;
    c->n_blocks = blocks >= full ? full : (int)blocks;
    if (c->n_blocks >= 1)
        return MOEC_OK;
    return MOEC_ERR(MOEC_ERR_CAPACITY,
                    "no KV block fits: one block (%d tokens) takes %zu bytes, and %.2f of the "
                    "%zu MiB device 0 (%s) has free once the weights, activations and workspaces "
                    "are allocated, less %zu bytes of index scores, is %.0f bytes",
                    c->plan->kv_block_size, per_block, c->kv_fraction, free_b >> 20,
                    c->device_name, kv_scores_bytes(c), share);
}

/* MOEC_KV_FILL=random, for benchmarks: the paged pools hold values in
 * [-1, 1) (a fixed pseudo-random sequence repeating every 4 MiB) instead of
 * zeros, so that attention and DeepSeek-V3.2's indexer see varied keys
 * (with zeros every indexer score ties and the top-k select skips its
 * passes). Any other non-empty value than "random" or "zero" is an error. */
static moec_status kv_fill_mode(int *random)
{
    const char *v = getenv("MOEC_KV_FILL");
    *random = v && !strcmp(v, "random");
    if (v && *v && !*random && strcmp(v, "zero"))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "MOEC_KV_FILL=\"%s\": not random or zero", v);
    return MOEC_OK;
}

static moec_status kv_fill_random(rt_cuda *c, void *dst, size_t bytes, const char *where)
{
    enum { CHUNK = 4 << 20 };
    unsigned char *h = malloc(CHUNK);
    if (!h)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory filling %s", where);
    uint32_t x = 2463534242u;
    int f32 = c->plan->compute_dtype == IR_DTYPE_F32;
    for (size_t i = 0; i < CHUNK / (f32 ? 4 : 2); i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        float v = (float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
        uint32_t u;
        memcpy(&u, &v, 4);
        if (f32)
            memcpy(h + 4 * i, &u, 4);
        else {
            uint16_t b = (uint16_t)(u >> 16);
            memcpy(h + 2 * i, &b, 2);
        }
    }
    moec_status st = MOEC_OK;
    for (size_t o = 0; o < bytes && st == MOEC_OK; o += CHUNK)
        st = CK(cudaMemcpy((char *)dst + o, h, bytes - o < CHUNK ? bytes - o : CHUNK,
                           cudaMemcpyHostToDevice),
                where);
    free(h);
    return st;
}

/* The KV pools of every attention, mla_attention and dsa_topk op: n_blocks
 * blocks each, and the index scores. */
moec_status rt_cuda_alloc_kv(rt_cuda *c)
{
    const ir_module *m = c->plan->module;
    int random;
    MOEC_TRY(kv_fill_mode(&random));
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        size_t scores;
        const ir_value *pool[2];
        if (!kv_pools(c, k, pool, &scores))
            continue;
        for (int p = 0; p < 2; p++) {
            size_t bytes = pool[p] ? (size_t)c->n_blocks * kv_block_pool_bytes(c, pool[p])
                                   : scores;
            if (!bytes)
                continue;
            char where[512];
            snprintf(where, sizeof where, "KV pool %d (%%%s, %d blocks) of %s %%%s", p,
                     pool[p] ? pool[p]->name : "index scores", c->n_blocks, ir_op_name(op->kind),
                     op->out[0]->name);
            MOEC_TRY(rt_cuda_alloc(c, &c->kv[2 * k + p], bytes, where));
            c->kv_bytes[2 * k + p] = bytes;
            if (random && pool[p])
                MOEC_TRY(kv_fill_random(c, c->kv[2 * k + p], bytes, where));
            else
                MOEC_TRY(CK(cudaMemset(c->kv[2 * k + p], 0, bytes), where));
        }
    }
    return MOEC_OK;
}

/* With every row's blocks in the pool, slot s owns blocks s * max_blocks ..
 * s * max_blocks + max_blocks - 1; otherwise no row has a block yet. */
moec_status rt_cuda_init_table(rt_cuda *c)
{
    size_t table = (size_t)c->max_seqs * (size_t)c->max_blocks;
    int own = (size_t)c->n_blocks >= table;
    for (size_t i = 0; i < table; i++)
        c->bt_host[i] = own ? (int32_t)i : -1;
    for (int r = 0; r < c->max_seqs; r++) {
        c->bt_lo[r] = 0;
        c->bt_hi[r] = c->max_blocks;
    }
    c->bt_dirty = 1;
    return MOEC_OK;
}

moec_status rt_cuda_set_blocks(rt_cuda *c, int row, int first, int n, const int32_t *blocks)
{
    if (!c)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_set_blocks: NULL context");
    MOEC_TRY(rt_block_table_check(c->max_seqs, c->max_blocks, c->n_blocks, row, first, n, blocks));
    if (!n)
        return MOEC_OK;
    memcpy(c->bt_host + (size_t)row * c->max_blocks + first, blocks, (size_t)n * sizeof *blocks);
    if (first < c->bt_lo[row])
        c->bt_lo[row] = first;
    if (first + n > c->bt_hi[row])
        c->bt_hi[row] = first + n;
    c->bt_dirty = 1;
    return MOEC_OK;
}

moec_status rt_cuda_upload_table(rt_cuda *c, const char *where)
{
    if (!c->bt_dirty)
        return MOEC_OK;
    int32_t *dev = c->input_ptr[IR_INPUT_BLOCK_TABLE];
    for (int r = 0; r < c->max_seqs; r++) {
        if (c->bt_lo[r] >= c->bt_hi[r])
            continue;
        size_t at = (size_t)r * c->max_blocks + (size_t)c->bt_lo[r];
        MOEC_TRY(CK(cudaMemcpyAsync(dev + at, c->bt_host + at,
                                    (size_t)(c->bt_hi[r] - c->bt_lo[r]) * sizeof *dev,
                                    cudaMemcpyHostToDevice, c->stream[0]),
                    where));
        c->bt_lo[r] = c->max_blocks;
        c->bt_hi[r] = 0;
    }
    c->bt_dirty = 0;
    return MOEC_OK;
}

/* Arena, scratch, the step inputs with the block table (and its pinned
 * host copy). */
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
    size_t S = (size_t)c->in_stride;
    /* the sampler's entries: each row it samples (no more than the step's
     * tokens or the sequences) may list its whole sequence, up to a bound */
    if (p->sampler) {
        size_t rows = (size_t)(c->max_seqs < c->tmax ? c->max_seqs : c->tmax);
        size_t per = (size_t)(c->max_seq_len < c->out_cols ? c->max_seq_len : c->out_cols);
        c->smp_cap = rows * per < RT_CUDA_SAMPLE_PENS ? (int)(rows * per) : RT_CUDA_SAMPLE_PENS;
    }
    size_t smp = p->sampler ? S * (IR_SAMPLE_ROW_WORDS + 2) +
                                  (size_t)c->smp_cap * IR_SAMPLE_PEN_WORDS
                            : 0;
    size_t total = 4 * S + table + smp + IR_SPLIT_COUNTERS;
    MOEC_TRY(rt_cuda_alloc(c, (void **)&c->inputs, total * sizeof(int32_t), "the step inputs"));
    MOEC_TRY(CK(cudaMemset(c->inputs, 0, total * sizeof(int32_t)), "the step inputs"));
    c->input_ptr[IR_INPUT_TOKENS] = c->inputs;
    c->input_ptr[IR_INPUT_POSITIONS] = c->inputs + S;
    c->input_ptr[IR_INPUT_SLOTS] = c->inputs + 2 * S;
    c->input_ptr[IR_INPUT_SAMPLED] = c->inputs + 3 * S;
    c->input_ptr[IR_INPUT_BLOCK_TABLE] = c->inputs + 4 * S;
    for (int i = 0; i <= IR_INPUT_SAMPLED; i++)
        c->input_bytes[i] = (size_t)c->tmax * sizeof(int32_t);
    c->input_bytes[IR_INPUT_BLOCK_TABLE] = table * sizeof(int32_t);
    /* the split counters: zero here, and every kernel leaves them zero */
    c->input_ptr[IR_INPUT_SPLIT_COUNTERS] = c->inputs + 4 * S + table + smp;
    c->input_bytes[IR_INPUT_SPLIT_COUNTERS] = IR_SPLIT_COUNTERS * sizeof(int32_t);
    if (p->sampler) {
        int32_t *at = c->inputs + 4 * S + table;
        c->input_ptr[IR_INPUT_SAMPLE_ROWS] = at;
        c->input_ptr[IR_INPUT_SAMPLE_TOKENS] = at + S * IR_SAMPLE_ROW_WORDS;
        c->input_ptr[IR_INPUT_SAMPLE_LOGPROBS] = at + S * (IR_SAMPLE_ROW_WORDS + 1);
        c->input_ptr[IR_INPUT_SAMPLE_PENS] = at + S * (IR_SAMPLE_ROW_WORDS + 2);
        c->input_bytes[IR_INPUT_SAMPLE_ROWS] = (size_t)c->tmax * sizeof(ir_sample_row);
        c->input_bytes[IR_INPUT_SAMPLE_TOKENS] = (size_t)c->tmax * sizeof(int32_t);
        c->input_bytes[IR_INPUT_SAMPLE_LOGPROBS] = (size_t)c->tmax * sizeof(float);
        c->input_bytes[IR_INPUT_SAMPLE_PENS] = (size_t)c->smp_cap * sizeof(ir_sample_pen);
        MOEC_TRY(CK(cudaMallocHost((void **)&c->smp_rows, S * sizeof *c->smp_rows),
                    "the pinned sampling rows"));
        memset(c->smp_rows, 0, S * sizeof *c->smp_rows);
        MOEC_TRY(CK(cudaMallocHost((void **)&c->smp_pens,
                                   (c->smp_cap ? (size_t)c->smp_cap : 1) * sizeof *c->smp_pens),
                    "the pinned penalty entries"));
        c->smp_stamp = calloc((size_t)c->out_cols, sizeof *c->smp_stamp);
        if (!c->smp_stamp)
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory for the sampler's check");
    }

    MOEC_TRY(CK(cudaMallocHost((void **)&c->bt_host, (table ? table : 1) * sizeof(int32_t)),
                "the pinned block table"));
    c->bt_lo = calloc((size_t)c->max_seqs, sizeof *c->bt_lo);
    c->bt_hi = calloc((size_t)c->max_seqs, sizeof *c->bt_hi);
    if (!c->bt_lo || !c->bt_hi)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory for the block table of %d rows",
                        c->max_seqs);
    MOEC_TRY(CK(cudaMallocHost((void **)&c->host_in, 3 * (size_t)c->in_stride * sizeof(int32_t)),
                "the pinned step inputs"));
    return MOEC_OK;
}

#endif
