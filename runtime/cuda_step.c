/* cuda_step.c — one step launched eagerly: the inputs written to their
 * fixed buffers, every launch of the bucket on two streams (or one), and
 * the copy-back of logits and sampled ids. graphs/ captures exactly what
 * rt_cuda_launch_step issues and replays it. */
#ifdef MOEC_HAVE_CUDA

#include "runtime/cuda_internal.h"
#include "runtime/step_check.h"

moec_status rt_cuda_check_inputs(const rt_cuda *c, int n, const int32_t *tokens,
                                 const int32_t *positions, const int32_t *slots)
{
    rt_step_limits l = {c->tmax,       c->max_seqs,   c->max_seq_len,
                        c->vocab,      c->bt_host,    c->max_blocks,
                        c->plan->kv_block_size};
    return rt_step_check(&l, n, tokens, positions, slots);
}

/* Whether kernel step s is left out (MOEC_SKIP_KERNELS: comma-separated
 * parts of kernel names; an upper bound on what fusing a kernel away could
 * gain, for timing only, since its results are then never written). */
static int skipped(const rt_cuda *c, const ir_bucket *b, const ir_step *s)
{
    const char *name = b->kernel_names[s->kernel], *p = c->skip_kernels;
    while (p && *p && name) {
        size_t n = strcspn(p, ",");
        char part[128];
        if (n > 0 && n < sizeof part) {
            memcpy(part, p, n);
            part[n] = 0;
            if (strstr(name, part))
                return 1;
        }
        p += n + (p[n] == ',');
    }
    return 0;
}

/* Launches steps from .. to-1 of the bucket, in order. */
moec_status rt_cuda_run_steps(rt_cuda *c, rt_cuda_bucket *cb, int from, int to)
{
    const ir_bucket *b = cb->b;
    char where[512];
    int single = rt_cuda_one_stream(c, cb);
    for (int i = from; i < to; i++) {
        const ir_step *s = &b->steps[i];
        rt_cuda_launch *L = &cb->launches[i];
        int sk = single ? 0 : s->stream;
        cudaStream_t stream = c->stream[sk];
        cudaError_t e = cudaSuccess;
        if (single && (s->kind == IR_STEP_FORK || s->kind == IR_STEP_JOIN))
            continue;
        const char *call = "";
        switch (s->kind) {
        case IR_STEP_KERNEL: {
            if (c->skip_kernels && skipped(c, b, s))
                continue;
            dim3 grid = {s->grid[0], s->grid[1], s->grid[2]};
            dim3 block = {s->block[0], s->block[1], s->block[2]};
            /* launch attributes: as a programmatic dependent of the kernel
               before it on the stream (scheduled while that one runs,
               waiting in moec_pdl_enter for its results), and the
               stream's priority (MOEC_STREAM_PRIORITY) or the step's
               (the greatest, on two streams) */
            cudaLaunchAttribute attr[2];
            unsigned n_attr = 0;
            if (c->pdl && !L->plain) {
                attr[n_attr].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                attr[n_attr++].val.programmaticStreamSerializationAllowed = 1;
            }
            int high = L->prio_high && !single;
            if (c->prio_on || high) {
                attr[n_attr].id = cudaLaunchAttributePriority;
                attr[n_attr++].val.priority = high ? c->prio_greatest : c->prio[sk];
            }
            if (n_attr) {
                cudaLaunchConfig_t cfg = {grid, block, s->smem, stream, attr, n_attr};
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
                return LT(c, ls, rt_cuda_step_where(c, cb, i, where, sizeof where));
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
        case IR_STEP_COLLECTIVE:
            MOEC_TRY(rt_comm_run(c->comm, &s->coll, L->kernel, L->vals[0].p, L->vals[1].p, stream,
                                 rt_cuda_step_where(c, cb, i, where, sizeof where)));
            break;
        }
        if (e != cudaSuccess)
            return rt_cuda_fail(MOEC_ERR_CUDA, __FILE__, __LINE__,
                                rt_cuda_step_where(c, cb, i, where, sizeof where), call,
                                cudaGetErrorName(e), cudaGetErrorString(e));
        if (c->debug_sync) {
            for (int k = 0; k < 2 && e == cudaSuccess; k++)
                e = cudaStreamSynchronize(c->stream[k]);
            if (e != cudaSuccess)
                return MOEC_ERR(MOEC_ERR_CUDA, "%s: cudaStreamSynchronize after it (MOEC_CUDA_SYNC): %s: %s",
                                rt_cuda_step_where(c, cb, i, where, sizeof where), cudaGetErrorName(e),
                                cudaGetErrorString(e));
        }
    }
    return MOEC_OK;
}

/* The bucket that holds n tokens (rt_cuda_check_inputs has checked n). */
rt_cuda_bucket *rt_cuda_bucket_for(rt_cuda *c, int n)
{
    const ir_bucket *b = ir_plan_bucket_for(c->plan, n);
    return b ? &c->buckets[b - c->plan->buckets] : NULL;
}

int rt_cuda_sample_capacity(const rt_cuda *c)
{
    return c && c->plan->sampler ? c->smp_cap : -1;
}

moec_status rt_cuda_set_sampling(rt_cuda *c, int n, const ir_sample_row *rows, int n_pen,
                                 const ir_sample_pen *pens, int32_t *tokens_out,
                                 float *logprobs_out)
{
    if (!c)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_set_sampling: NULL context");
    if (!c->plan->sampler)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "the plan has no device sampler (compiled by an older moec, or its "
                        "vocabulary is over %d ids): sample on the host",
                        IR_SAMPLE_VOCAB_MAX);
    if (n < 0 || n > c->tmax || (n && (!rows || !tokens_out || !logprobs_out)))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "rt_cuda_set_sampling: %d rows (a step has at most %d) or NULL arrays", n,
                        c->tmax);
    if (n_pen < 0 || n_pen > c->smp_cap || (n_pen && !pens))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "rt_cuda_set_sampling: %d penalty entries (room for %d) or NULL entries",
                        n_pen, c->smp_cap);
    MOEC_TRY(rt_sample_check(c->out_cols, n, rows, n_pen, pens, c->smp_stamp, &c->smp_epoch));
    memset(c->smp_rows, 0, (size_t)c->in_stride * sizeof *c->smp_rows);
    if (n)
        memcpy(c->smp_rows, rows, (size_t)n * sizeof *rows);
    if (n_pen)
        memcpy(c->smp_pens, pens, (size_t)n_pen * sizeof *pens);
    c->smp_n = n;
    c->smp_n_pen = n_pen;
    c->smp_set = 1;
    c->smp_tokens_out = tokens_out;
    c->smp_logprobs_out = logprobs_out;
    return MOEC_OK;
}

/* The sampling rows staged for this step of n tokens, or rows all off
 * after a step that had some on, and their entries, on stream 0. */
static moec_status upload_sampling(rt_cuda *c, int n, const char *where)
{
    c->smp_tokens_dst = NULL;
    c->smp_logprobs_dst = NULL;
    c->smp_dst_rows = 0;
    int set = c->smp_set;
    c->smp_set = 0;
    if (!c->plan->sampler)
        return MOEC_OK;
    int rows = set ? c->smp_n : 0;
    if (rows > n)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: %d sampling rows for a step of %d tokens",
                        where, rows, n);
    if (!rows && !c->smp_live)
        return MOEC_OK; /* the device's rows are all off already */
    if (!rows)
        memset(c->smp_rows, 0, (size_t)c->in_stride * sizeof *c->smp_rows);
    MOEC_TRY(CK(cudaMemcpyAsync(c->input_ptr[IR_INPUT_SAMPLE_ROWS], c->smp_rows,
                                (size_t)c->in_stride * sizeof *c->smp_rows,
                                cudaMemcpyHostToDevice, c->stream[0]),
                where));
    if (rows && c->smp_n_pen)
        MOEC_TRY(CK(cudaMemcpyAsync(c->input_ptr[IR_INPUT_SAMPLE_PENS], c->smp_pens,
                                    (size_t)c->smp_n_pen * sizeof *c->smp_pens,
                                    cudaMemcpyHostToDevice, c->stream[0]),
                    where));
    c->smp_live = rows > 0;
    if (rows) {
        c->smp_tokens_dst = c->smp_tokens_out;
        c->smp_logprobs_dst = c->smp_logprobs_out;
        c->smp_dst_rows = rows;
    }
    return MOEC_OK;
}

/* Writes the step inputs (padding rows: token 0, position 0, slot -1), the
 * block-table rows changed since the last step and the sampling rows. */
moec_status rt_cuda_write_inputs(rt_cuda *c, int n, const int32_t *tokens, const int32_t *positions,
                                const int32_t *slots, const char *where)
{
    int32_t *h = c->host_in;
    for (int i = 0; i < c->in_stride; i++) {
        h[i] = i < n ? tokens[i] : 0;
        h[c->in_stride + i] = i < n ? positions[i] : 0;
        h[2 * c->in_stride + i] = i < n ? slots[i] : -1;
    }
    MOEC_TRY(CK(cudaMemcpyAsync(c->inputs, h, 3 * (size_t)c->in_stride * sizeof *h,
                                cudaMemcpyHostToDevice, c->stream[0]),
                where));
    MOEC_TRY(upload_sampling(c, n, where));
    return rt_cuda_upload_table(c, where);
}

/* Runs one step of bucket cb on the inputs already written. Stream 1 starts
 * after what stream 0 did before and ends before what it does next,
 * whatever forks and joins the plan has. */
moec_status rt_cuda_launch_step(rt_cuda *c, rt_cuda_bucket *cb, int stop_op, const char *where)
{
    MOEC_TRY(CK(cudaEventRecord(c->head, c->stream[0]), where));
    MOEC_TRY(CK(cudaStreamWaitEvent(c->stream[1], c->head, 0), where));
    /* the steps up to the last of the ops before stop_op, or all: the side
       stream's may lie ahead of main-stream steps of earlier ops */
    int end = ir_steps_before_op(cb->b->steps, cb->b->n_steps, stop_op);
    MOEC_TRY(rt_cuda_run_steps(c, cb, 0, end));
    MOEC_TRY(CK(cudaEventRecord(c->tail, c->stream[1]), where));
    return CK(cudaStreamWaitEvent(c->stream[0], c->tail, 0), where);
}

moec_status rt_cuda_sync(rt_cuda *c, const char *where)
{
    cudaError_t e = cudaStreamSynchronize(c->stream[0]);
    if (e != cudaSuccess)
        return MOEC_ERR(MOEC_ERR_CUDA, "%s: cudaStreamSynchronize: %s: %s%s", where,
                        cudaGetErrorName(e), cudaGetErrorString(e),
                        c->debug_sync ? "" : " (something this step ran failed; MOEC_CUDA_SYNC=1 names it)");
    return rt_comm_small_error(c->comm, where);
}

moec_status rt_cuda_begin_step(rt_cuda *c, int n, const int32_t *tokens,
                               const int32_t *positions, const int32_t *slots, const char *what,
                               rt_cuda_bucket **cb, char *where, size_t where_cap)
{
    if (!c || !tokens || !positions || !slots)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: NULL argument", what);
    MOEC_TRY(rt_cuda_check_inputs(c, n, tokens, positions, slots));
    *cb = rt_cuda_bucket_for(c, n);
    snprintf(where, where_cap, "%s of %d tokens (bucket T=%d)", what, n, (*cb)->b->T);
    MOEC_TRY(CK(cudaSetDevice(c->device), where));
    return rt_cuda_write_inputs(c, n, tokens, positions, slots, where);
}

moec_status rt_cuda_end_step(rt_cuda *c, const rt_cuda_bucket *cb, int n, int first, int count,
                             float *logits_out, int32_t *sampled_out, const char *where)
{
    cudaStream_t s0 = c->stream[0];
    if (logits_out && (first < 0 || count < 0 || first > n - count))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: logits rows %d .. %d of %d", where, first,
                        first + count - 1, n);
    if (logits_out && count)
        MOEC_TRY(CK(cudaMemcpyAsync(logits_out, cb->logits + (size_t)first * (size_t)c->out_cols,
                                    (size_t)count * (size_t)c->out_cols * sizeof *logits_out,
                                    cudaMemcpyDeviceToHost, s0),
                    where));
    if (sampled_out)
        MOEC_TRY(CK(cudaMemcpyAsync(sampled_out, c->input_ptr[IR_INPUT_SAMPLED],
                                    (size_t)n * sizeof *sampled_out, cudaMemcpyDeviceToHost, s0),
                    where));
    if (c->smp_tokens_dst) {
        size_t rows = (size_t)c->smp_dst_rows;
        MOEC_TRY(CK(cudaMemcpyAsync(c->smp_tokens_dst, c->input_ptr[IR_INPUT_SAMPLE_TOKENS],
                                    rows * sizeof(int32_t), cudaMemcpyDeviceToHost, s0),
                    where));
        MOEC_TRY(CK(cudaMemcpyAsync(c->smp_logprobs_dst, c->input_ptr[IR_INPUT_SAMPLE_LOGPROBS],
                                    rows * sizeof(float), cudaMemcpyDeviceToHost, s0),
                    where));
        c->smp_tokens_dst = NULL;
        c->smp_logprobs_dst = NULL;
    }
    return rt_cuda_sync(c, where);
}

moec_status rt_cuda_step(rt_cuda *c, int n, const int32_t *tokens, const int32_t *positions,
                         const int32_t *slots, float *logits_out, int32_t *sampled_out)
{
    rt_cuda_bucket *cb;
    char where[128];
    MOEC_TRY(rt_cuda_begin_step(c, n, tokens, positions, slots, "rt_cuda_step", &cb, where,
                                sizeof where));
    MOEC_TRY(rt_cuda_launch_step(c, cb, -1, where));
    return rt_cuda_end_step(c, cb, n, 0, n, logits_out, sampled_out, where);
}

moec_status rt_cuda_run_until(rt_cuda *c, int n, const int32_t *tokens, const int32_t *positions,
                              const int32_t *slots, int stop_op)
{
    if (!c || !tokens || !positions || !slots || stop_op < 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_run_until: bad argument");
    MOEC_TRY(rt_cuda_check_inputs(c, n, tokens, positions, slots));
    rt_cuda_bucket *cb = rt_cuda_bucket_for(c, n);
    char where[128];
    snprintf(where, sizeof where, "partial step of %d tokens up to op %d", n, stop_op);
    MOEC_TRY(CK(cudaSetDevice(c->device), where));
    MOEC_TRY(rt_cuda_write_inputs(c, n, tokens, positions, slots, where));
    MOEC_TRY(rt_cuda_launch_step(c, cb, stop_op, where));
    return rt_cuda_sync(c, where);
}

moec_status rt_cuda_read_value(rt_cuda *c, int n, const ir_value *v, void *dst, size_t cap)
{
    if (!c || !v || !dst || n < 1 || n > c->tmax)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_cuda_read_value: bad argument");
    if (v->kind == IR_VALUE_WEIGHT || v->mem_offset < 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%%%s is not an activation with an arena offset",
                        v->name);
    rt_cuda_bucket *cb = rt_cuda_bucket_for(c, n);
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

int rt_cuda_one_stream(const rt_cuda *c, const rt_cuda_bucket *cb)
{
    int T = cb->b->T;
    return c->single_stream || !ir_bucket_two_streams(T, c->dual_max_t, c->dual_from_t);
}

void rt_cuda_set_single_stream(rt_cuda *c, int single)
{
    if (c)
        c->single_stream = single != 0;
}

#endif
