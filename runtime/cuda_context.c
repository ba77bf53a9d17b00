/* cuda_context.c — the CUDA runtime's context (cuda_rt.h): everything a
 * plan needs on the device is allocated and every launch is prepared once,
 * at init (kernel handles, argument arrays pointing at resolved addresses,
 * cuBLASLt descriptors), so that a step only launches. Only runtime API
 * calls (no driver API symbol), so binaries start where there is no
 * driver. */
#ifdef MOEC_HAVE_CUDA

#include <dlfcn.h>

#include "runtime/cuda_internal.h"

int rt_float_dtype(ir_dtype dt)
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
        /* The split of an SM's L1 and shared memory stays the driver's
           choice: one preference for every kernel (so that kernels beside
           each other need no new split) was slower at every share tried,
           fp8 V2-Lite at 1 / 8 / 64 tokens 1.469 / 4.160 / 7.867 ms at
           100% shared, 1.451 / 3.645 / 6.933 at 50, 1.590 / 5.968 /
           11.487 at 0, against 1.400 / 3.612 / 6.633-6.644; bf16 at 64
           16.419 at 100 against 10.062 (H200, 2026-11-30; history at
           ec32734, MOEC_SMEM_CARVEOUT). */
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

moec_status rt_cuda_resolve_arg(rt_cuda *c, const ir_bucket *b, const ir_arg *a, rt_cuda_ref *r,
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
        MOEC_TRY(rt_cuda_resolve_arg(c, b, &s->args[j], &r, where, j));
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

/* A collective step: its send and recv buffers (vals 0 and 1), each
 * holding what the collective reads or writes there. */
static moec_status prepare_collective(rt_cuda *c, rt_cuda_bucket *cb, const ir_step *s,
                                      rt_cuda_launch *L, const char *where)
{
    const ir_coll *k = &s->coll;
    size_t esize = ir_dtype_size(k->dtype);
    /* count is what one rank contributes (all_gather), receives
     * (reduce_scatter) or exchanges with each peer (all_to_all) */
    size_t one = (size_t)k->count * esize, all = one * (size_t)k->ranks;
    int scatters = k->op == IR_OP_REDUCE_SCATTER || k->op == IR_OP_ALL_TO_ALL;
    int gathers = k->op == IR_OP_ALL_GATHER || k->op == IR_OP_ALL_TO_ALL;
    size_t need[2] = {scatters ? all : one, gathers ? all : one};
    const ir_arg *args[2] = {&k->send, &k->recv};
    for (int j = 0; j < 2; j++) {
        rt_cuda_ref r;
        MOEC_TRY(rt_cuda_resolve_arg(c, cb->b, args[j], &r, where, j));
        if (!r.is_ptr || r.avail < need[j] || (r.dtype >= 0 && r.dtype != (int)k->dtype))
            return MOEC_ERR(MOEC_ERR_INTERNAL,
                            "%s: the collective's %s buffer holds %zu bytes of %s; it %s %zu "
                            "bytes of %s",
                            where, j ? "recv" : "send", r.avail,
                            r.dtype >= 0 ? ir_dtype_name((ir_dtype)r.dtype) : "any dtype",
                            j ? "writes" : "reads", need[j], ir_dtype_name(k->dtype));
        L->vals[j] = r.val;
    }
    /* the plan's one-shot all-reduce kernel, where codegen put one */
    if (k->op == IR_OP_ALL_REDUCE) {
        char name[96];
        ir_oneshot_kernel_name(name, sizeof name, k->ranks, k->dtype);
        for (int i = 0; i < cb->b->n_kernels; i++)
            if (cb->b->kernel_names[i] && !strcmp(cb->b->kernel_names[i], name))
                L->kernel = cb->kernels[i];
    }
    return MOEC_OK;
}

/* 1 where NAME holds one of the parts (apart by ',' or '+') of environment
 * variable var: MOEC_PDL_OFF, an A/B knob that launches those kernels
 * plainly (scheduled only once the kernel before them has ended) while the
 * rest stay programmatic dependents; MOEC_PRIO_HIGH, one that launches
 * them at the device's greatest priority (the GPU schedules their blocks
 * before those of kernels waiting beside them), as a step's prio does. */
static int name_listed(const char *var, const char *name)
{
    const char *v = getenv(var);
    while (name && v && *v) {
        size_t n = strcspn(v, ",+");
        for (const char *h = name; n > 0 && *h; h++)
            if (!strncmp(h, v, n))
                return 1;
        v += n + (v[n] != '\0');
    }
    return 0;
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
        rt_cuda_step_where(c, cb, i, where, sizeof where);
        if (s->stream != 0 && s->stream != 1)
            return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: stream %d (0 or 1)", where, s->stream);
        switch (s->kind) {
        case IR_STEP_KERNEL:
            MOEC_TRY(prepare_kernel(c, cb, s, L, where));
            L->plain = s->plain || name_listed("MOEC_PDL_OFF", b->kernel_names[s->kernel]);
            L->prio_high = s->prio || name_listed("MOEC_PRIO_HIGH", b->kernel_names[s->kernel]);
            cb->prio_high |= L->prio_high;
            break;
        case IR_STEP_GEMM: MOEC_TRY(rt_cuda_prepare_gemm(c, cb, s, L, where)); break;
        case IR_STEP_FORK:
        case IR_STEP_JOIN:
            MOEC_TRY(CK(cudaEventCreateWithFlags(&L->event, cudaEventDisableTiming), where));
            break;
        case IR_STEP_COLLECTIVE: MOEC_TRY(prepare_collective(c, cb, s, L, where)); break;
        default: return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: unknown step kind", where);
        }
    }
    return MOEC_OK;
}

/* The communicator's first collective, run now (every rank of the group
 * sets up at once, a thread each), so that NCCL makes its connections
 * before any step is captured into a CUDA Graph. */
static moec_status comm_warmup(rt_cuda *c)
{
    if (!c->comm)
        return MOEC_OK;
    const char *where = "the communicator's first all-reduce";
    ir_coll one = {.op = IR_OP_ALL_REDUCE, .dtype = IR_DTYPE_F32, .count = 1,
                   .ranks = rt_comm_size(c->comm)};
    MOEC_TRY(CK(cudaMemsetAsync(c->arena, 0, sizeof(float), c->stream[0]), where));
    MOEC_TRY(rt_comm_run(c->comm, &one, NULL, c->arena, c->arena, c->stream[0], where));
    MOEC_TRY(CK(cudaStreamSynchronize(c->stream[0]), where));
    return rt_comm_error(c->comm, where);
}

/* A token count from the environment variable name into *out (unset or
 * empty: *out as it is); anything else an error naming it. */
static moec_status env_tokens(const char *name, int *out)
{
    const char *e = getenv(name);
    if (!e || !*e)
        return MOEC_OK;
    char *end = NULL;
    long v = strtol(e, &end, 10);
    if (*end || v < 0 || v > INT32_MAX)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s=\"%s\": not a token count (0 or more)", name,
                        e);
    *out = (int)v;
    return MOEC_OK;
}

/* MOEC_GEMM_TUNE=N (0 to RT_GEMM_TUNE_MAX; unset or 0: off): each cuBLASLt
 * GEMM shape runs the fastest of the heuristic's first N algorithms,
 * timed at set-up (cuda_blaslt.c, gemm_tune), instead of its first. */
static moec_status gemm_tune_env(rt_cuda *c)
{
    c->gemm_tune = 0;
    const char *e = getenv("MOEC_GEMM_TUNE");
    if (!e || !*e)
        return MOEC_OK;
    char *end = NULL;
    long v = strtol(e, &end, 10);
    if (*end || v < 0 || v > RT_GEMM_TUNE_MAX)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "MOEC_GEMM_TUNE=\"%s\": not a count of cuBLASLt algorithms from 0 to %d", e,
                        RT_GEMM_TUNE_MAX);
    c->gemm_tune = (int)v;
    return MOEC_OK;
}

/* MOEC_STREAM_PRIORITY: which stream's blocks the GPU schedules first when
 * both have kernels waiting: "1" the second stream (the shared experts,
 * DeepSeek-V3.2's indexer), "0" the first, "off" neither (default). Steps
 * whose prio the plan sets, and kernels MOEC_PRIO_HIGH names, launch at the
 * device's greatest priority (on two streams), the rest at their stream's.
 * The graphs keep each kernel's priority (captured as a launch attribute,
 * instantiated with cudaGraphInstantiateFlagUseNodePriority). */
static moec_status stream_priorities(rt_cuda *c)
{
    c->prio_on = 0;
    c->prio[0] = c->prio[1] = 0;
    const char *v = getenv("MOEC_STREAM_PRIORITY");
    int streams = v && *v && strcmp(v, "off");
    if (streams && strcmp(v, "0") && strcmp(v, "1"))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "MOEC_STREAM_PRIORITY=\"%s\": not 0, 1 or off (the stream scheduled first)", v);
    int least = 0, greatest = 0;
    MOEC_TRY(CK(cudaDeviceGetStreamPriorityRange(&least, &greatest), "the stream priorities"));
    c->prio_greatest = greatest;
    if (!streams)
        return MOEC_OK;
    c->prio_on = 1;
    c->prio[0] = c->prio[1] = least;
    c->prio[v[0] - '0'] = greatest;
    return MOEC_OK;
}

static moec_status setup(rt_cuda *c, const rt_weights *w)
{
    const ir_plan *p = c->plan;
    const ir_module *m = p->module;
    MOEC_TRY(rt_lt_open(&c->lt));
    MOEC_TRY(CK(cudaSetDevice(c->device), "selecting the rank's device"));
    struct cudaDeviceProp prop;
    MOEC_TRY(CK(cudaGetDeviceProperties(&prop, c->device), "the rank's device"));
    snprintf(c->device_name, sizeof c->device_name, "%s", prop.name);
    c->cc_major = prop.major;
    const char *pdl = getenv("MOEC_PDL");
    c->pdl = p->pdl && prop.major >= 9 && !(pdl && !strcmp(pdl, "0"));
    c->cc_minor = prop.minor;
    MOEC_TRY(rt_cuda_check_arch(c));
    const char *sync = getenv("MOEC_CUDA_SYNC");
    c->debug_sync = sync && *sync && strcmp(sync, "0");
    const char *skip = getenv("MOEC_SKIP_KERNELS");
    c->skip_kernels = skip && *skip ? skip : NULL;
    /* (H100, V2-Lite: the second stream gains 0.5 ms at batch 8 and loses
       0.25 ms at 32 (2026-11-24, third round) and 0.21 at 32 again
       (tenth round), where the routed experts fill the GPU; at 64 it
       gains 0.19 and 0.21 ms in two calls of the tenth round) */
    c->dual_max_t = IR_DUAL_STREAM_MAX_T;
    c->dual_from_t = ir_dual_stream_from_t(m);
    MOEC_TRY(env_tokens("MOEC_DUAL_STREAM_MAX_T", &c->dual_max_t));
    MOEC_TRY(env_tokens("MOEC_DUAL_STREAM_FROM_T", &c->dual_from_t));
    MOEC_TRY(gemm_tune_env(c));
    MOEC_TRY(stream_priorities(c));

    c->tmax = p->buckets[p->n_buckets - 1].T;
    c->in_stride = (c->tmax + 63) / 64 * 64;
    c->max_blocks = (c->max_seq_len + p->kv_block_size - 1) / p->kv_block_size;
    if ((int64_t)c->max_seqs * c->max_blocks > INT32_MAX)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "a block table of %d rows of %d blocks (%d tokens of %d) is too large",
                        c->max_seqs, c->max_blocks, c->max_seq_len, p->kv_block_size);
    if (!c->n_blocks && !c->kv_fraction)
        c->n_blocks = c->max_seqs * c->max_blocks;
    c->out_cols = (int)ir_type_numel(&m->outputs[0]->type, 0);
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        if (op->kind == IR_OP_EMBEDDING && op->n_in >= 2) {
            /* a vocab-parallel rank's table holds part of vocab_size ids */
            int rows = (int)ir_op_attr_int(op, "vocab_size", op->in[1]->type.dims[0]);
            if (!c->vocab || rows < c->vocab)
                c->vocab = rows;
        }
    }
    MOEC_TRY(rt_cuda_check_memory(c));

    for (int s = 0; s < 2; s++)
        MOEC_TRY(CK(cudaStreamCreateWithPriority(&c->stream[s], cudaStreamNonBlocking, c->prio[s]),
                    "a stream"));
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
    MOEC_TRY(rt_cuda_upload_weights(c, w));
    MOEC_TRY(rt_cuda_alloc_buffers(c));
    for (int s = 0; s < 2; s++) {
        MOEC_TRY(LT(c, c->lt.cublasLtCreate(&c->lt_handle[s]), "a cuBLASLt handle"));
        MOEC_TRY(rt_cuda_alloc(c, &c->workspace[s], RT_CUDA_WORKSPACE, "a cuBLASLt workspace"));
    }
    /* the pool last: a fraction of what is left is its to take */
    MOEC_TRY(rt_cuda_size_kv(c));
    MOEC_TRY(rt_cuda_alloc_kv(c));
    MOEC_TRY(rt_cuda_init_table(c));
    for (int b = 0; b < p->n_buckets; b++)
        MOEC_TRY(prepare_bucket(c, &c->buckets[b]));
    MOEC_TRY(comm_warmup(c));
    return CK(cudaDeviceSynchronize(), "finishing the set-up");
}

moec_status rt_cuda_init_sized(const ir_plan *plan, const rt_weights *w, const rt_cuda_sizes *sz,
                               rt_cuda **out)
{
    return rt_cuda_init_rank(plan, w, sz, 0, NULL, out);
}

moec_status rt_cuda_init_rank(const ir_plan *plan, const rt_weights *w, const rt_cuda_sizes *sz,
                              int device, rt_comm *comm, rt_cuda **out)
{
    if (!out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_init: out is NULL");
    *out = NULL;
    if (!plan || !w || !sz)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_init: NULL plan or weights");
    MOEC_TRY(rt_cuda_check_plan(plan, sz));
    MOEC_TRY(rt_cuda_check_comm(plan, comm));
    int n = 0;
    MOEC_TRY(moec_cuda_device_count(&n));
    if (device < 0 || device >= n)
        return MOEC_ERR(MOEC_ERR_NO_DEVICE, "device %d does not exist (this machine has %d)",
                        device, n);
    rt_cuda *c = calloc(1, sizeof *c);
    if (!c)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    c->device = device;
    c->comm = comm;
    c->plan = plan;
    c->max_seqs = sz->max_seqs;
    c->max_seq_len = sz->max_seq_len;
    c->n_blocks = sz->kv_blocks;
    c->kv_fraction = sz->kv_fraction;
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
        free(cb->launches);
        free(cb->kernels);
        free(cb->info);
        if (cb->loaded)
            cudaLibraryUnload(cb->lib);
    }
    free(c->buckets);
    free(c->tuned);
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
    cudaFreeHost(c->bt_host);
    cudaFreeHost(c->smp_rows);
    cudaFreeHost(c->smp_pens);
    free(c->smp_stamp);
    free(c->bt_lo);
    free(c->bt_hi);
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

const char *rt_cuda_device_name(const rt_cuda *c) { return c ? c->device_name : "none"; }

int rt_cuda_max_tokens(const rt_cuda *c) { return c ? c->tmax : 0; }

int rt_cuda_logits_cols(const rt_cuda *c) { return c ? c->out_cols : 0; }

size_t rt_cuda_device_bytes(const rt_cuda *c) { return c ? c->device_bytes : 0; }

int rt_cuda_kv_blocks(const rt_cuda *c) { return c ? c->n_blocks : 0; }

#endif
