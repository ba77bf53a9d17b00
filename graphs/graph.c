/* graph.c — capture and replay of whole decode steps (graph.h). The
 * cuBLASLt steps are capturable because nothing is chosen or allocated while
 * they run: their algorithms were picked at init and each stream's handle
 * has its own workspace, alive as long as the context. */
#include <stdlib.h>

#include "err.h"
#include "graphs/graph.h"

#ifdef MOEC_HAVE_CUDA

#include "runtime/cuda_internal.h"

struct graph_set {
    rt_cuda *c;
    cudaGraphExec_t (*exec)[2]; /* per bucket: [0] two streams, [1] one stream */
    int off;                    /* 1: launch eagerly even where captured */
};

moec_status graph_set_init(rt_cuda *c, graph_set **out)
{
    if (!c || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "graph_set_init: NULL argument");
    graph_set *g = calloc(1, sizeof *g);
    if (g)
        g->exec = calloc((size_t)c->n_buckets, sizeof *g->exec);
    if (!g || !g->exec) {
        free(g);
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    }
    g->c = c;
    *out = g;
    return MOEC_OK;
}

/* Drops every bucket's graph of mode m. */
static void drop(graph_set *g, int m)
{
    for (int b = 0; b < g->c->n_buckets; b++)
        if (g->exec[b][m]) {
            cudaGraphExecDestroy(g->exec[b][m]);
            g->exec[b][m] = NULL;
        }
}

void graph_set_free(graph_set *g)
{
    if (!g)
        return;
    cudaSetDevice(g->c->device);
    drop(g, 0);
    drop(g, 1);
    free(g->exec);
    free(g);
}

/* Captures one whole step of bucket b, exactly what rt_cuda_launch_step issues
 * (the head fork of stream 1, every step with the plan's own forks and
 * joins, or all on stream 0 in single-stream mode, the tail join). On a
 * failure the capture is still ended (stream 1 joined first, so that no
 * stream is left capturing) and its graph discarded. */
static moec_status capture_bucket(graph_set *g, int b)
{
    rt_cuda *c = g->c;
    rt_cuda_bucket *cb = &c->buckets[b];
    char where[96];
    snprintf(where, sizeof where, "capturing the step of bucket T=%d", cb->b->T);
    MOEC_TRY(CK(cudaStreamBeginCapture(c->stream[0], cudaStreamCaptureModeThreadLocal), where));
    moec_status st = rt_cuda_launch_step(c, cb, -1, where);
    if (st != MOEC_OK && cudaEventRecord(c->tail, c->stream[1]) == cudaSuccess)
        (void)cudaStreamWaitEvent(c->stream[0], c->tail, 0);
    cudaGraph_t graph = NULL;
    if (st == MOEC_OK)
        st = CK(cudaStreamEndCapture(c->stream[0], &graph), where);
    else
        (void)cudaStreamEndCapture(c->stream[0], &graph);
    if (st == MOEC_OK && !graph)
        st = MOEC_ERR(MOEC_ERR_CUDA, "%s: cudaStreamEndCapture gave no graph", where);
    cudaGraphExec_t *exec = &g->exec[b][c->single_stream];
    if (st == MOEC_OK)
        st = CK(cudaGraphInstantiate(exec, graph,
                                     c->prio_on || (cb->prio_high && !rt_cuda_one_stream(c, cb))
                                         ? cudaGraphInstantiateFlagUseNodePriority
                                         : 0),
                where);
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

moec_status graph_capture(graph_set *g)
{
    if (!g)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "graph_capture: the graph set is NULL");
    rt_cuda *c = g->c;
    MOEC_TRY(CK(cudaSetDevice(c->device), "capturing the steps"));
    MOEC_TRY(CK(cudaDeviceSynchronize(), "capturing the steps"));
    drop(g, c->single_stream);
    int debug_sync = c->debug_sync; /* no synchronization may be captured */
    c->debug_sync = 0;
    moec_status st = MOEC_OK;
    for (int b = 0; b < c->n_buckets && st == MOEC_OK; b++)
        st = capture_bucket(g, b);
    c->debug_sync = debug_sync;
    if (st == MOEC_OK)
        st = CK(cudaStreamSynchronize(c->stream[0]), "uploading the captured steps");
    if (st != MOEC_OK)
        drop(g, c->single_stream);
    return st;
}

void graph_set_enabled(graph_set *g, int on)
{
    if (g)
        g->off = !on;
}

int graph_captured(const graph_set *g)
{
    if (!g || !g->c->n_buckets)
        return 0;
    for (int b = 0; b < g->c->n_buckets; b++)
        if (!g->exec[b][g->c->single_stream])
            return 0;
    return 1;
}

/* Runs one whole step of cb on the inputs already written: its graph when
 * graph_step may replay it, else rt_cuda_launch_step. */
static moec_status run(graph_set *g, rt_cuda *c, rt_cuda_bucket *cb, const char *where)
{
    cudaGraphExec_t e = g ? g->exec[cb - c->buckets][c->single_stream] : NULL;
    if (e && !g->off && !c->debug_sync)
        return CK(cudaGraphLaunch(e, c->stream[0]), where);
    return rt_cuda_launch_step(c, cb, -1, where);
}

static moec_status check_set(const graph_set *g, const rt_cuda *c)
{
    if (g && g->c != c)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "graph set of another context");
    return MOEC_OK;
}

moec_status graph_step_rows(graph_set *g, rt_cuda *c, int n, const int32_t *tokens,
                            const int32_t *positions, const int32_t *slots, int first, int count,
                            float *logits_out, int32_t *sampled_out)
{
    MOEC_TRY(check_set(g, c));
    rt_cuda_bucket *cb;
    char where[128];
    MOEC_TRY(rt_cuda_begin_step(c, n, tokens, positions, slots, "step", &cb, where, sizeof where));
    MOEC_TRY(run(g, c, cb, where));
    return rt_cuda_end_step(c, cb, n, first, count, logits_out, sampled_out, where);
}

moec_status graph_step(graph_set *g, rt_cuda *c, int n, const int32_t *tokens,
                       const int32_t *positions, const int32_t *slots, float *logits_out,
                       int32_t *sampled_out)
{
    return graph_step_rows(g, c, n, tokens, positions, slots, 0, n, logits_out, sampled_out);
}

moec_status graph_time_steps(graph_set *g, rt_cuda *c, int n, const int32_t *tokens,
                             const int32_t *positions, const int32_t *slots, int warmup,
                             int iters, float *median_ms)
{
    MOEC_TRY(check_set(g, c));
    if (!median_ms || iters < 1 || warmup < 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "graph_time_steps: bad argument");
    rt_cuda_bucket *cb;
    char where[128];
    MOEC_TRY(rt_cuda_begin_step(c, n, tokens, positions, slots, "timed steps", &cb, where,
                                sizeof where));
    for (int i = 0; i < warmup; i++)
        MOEC_TRY(run(g, c, cb, where));
    cudaEvent_t *ev = calloc((size_t)iters + 1, sizeof *ev);
    float *ms = calloc((size_t)iters, sizeof *ms);
    moec_status st = ev && ms ? MOEC_OK : MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    int made = 0;
    for (; st == MOEC_OK && made <= iters; made++)
        st = CK(cudaEventCreate(&ev[made]), where);
    for (int i = 0; st == MOEC_OK && i < iters; i++) {
        st = CK(cudaEventRecord(ev[i], c->stream[0]), where);
        if (st == MOEC_OK)
            st = run(g, c, cb, where);
    }
    if (st == MOEC_OK)
        st = CK(cudaEventRecord(ev[iters], c->stream[0]), where);
    if (st == MOEC_OK)
        st = rt_cuda_sync(c, where);
    for (int i = 0; st == MOEC_OK && i < iters; i++)
        st = CK(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]), where);
    if (st == MOEC_OK)
        *median_ms = rt_median_ms(ms, iters);
    for (int i = 0; i < made; i++)
        cudaEventDestroy(ev[i]);
    free(ev);
    free(ms);
    return st;
}

#else

/* Without the CUDA toolkit no context exists, so none of these is reached
 * with one; each says so. */
#define NO_CUDA MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit")

moec_status graph_set_init(rt_cuda *c, graph_set **out) { return NO_CUDA; }
void graph_set_free(graph_set *g) { (void)g; }
moec_status graph_capture(graph_set *g) { return NO_CUDA; }
void graph_set_enabled(graph_set *g, int on) { (void)g; (void)on; }
int graph_captured(const graph_set *g) { return 0; }
moec_status graph_step_rows(graph_set *g, rt_cuda *c, int n, const int32_t *tokens,
                            const int32_t *positions, const int32_t *slots, int first, int count,
                            float *logits_out, int32_t *sampled_out)
{
    return NO_CUDA;
}
moec_status graph_step(graph_set *g, rt_cuda *c, int n, const int32_t *tokens,
                       const int32_t *positions, const int32_t *slots, float *logits_out,
                       int32_t *sampled_out)
{
    return NO_CUDA;
}
moec_status graph_time_steps(graph_set *g, rt_cuda *c, int n, const int32_t *tokens,
                             const int32_t *positions, const int32_t *slots, int warmup,
                             int iters, float *median_ms)
{
    return NO_CUDA;
}

#endif
