/* graph.h — CUDA Graphs over a runtime context (runtime/cuda_rt.h): per
 * batch bucket, one whole decode step captured over the context's fixed
 * buffers (the shared-expert stream forked and joined inside the capture
 * with events), replayed with one launch; and the policy that says when
 * (graphs on unless eager or MOEC_DISABLE_GRAPHS=1; one stream or two).
 * graphs/ is built on runtime/ and nothing below it knows graphs exist. */
#ifndef MOEC_GRAPH_H
#define MOEC_GRAPH_H

#include "runtime/cuda_rt.h"

/* The graphs of one context: for every bucket, one per stream mode (two
 * streams, one stream), each captured or not. */
typedef struct graph_set graph_set;

/* An empty set for c (which must outlive it). */
moec_status graph_set_init(rt_cuda *c, graph_set **out);
void graph_set_free(graph_set *g);

/* Captures one whole step of every bucket, exactly what rt_cuda_launch
 * issues, in the context's current stream mode, and uploads it; the graphs
 * of the other mode are kept. A failure names the bucket, drops this mode's
 * graphs and leaves the context usable eagerly. */
moec_status graph_capture(graph_set *g);
/* 1 (the default): replay where captured; 0: launch eagerly. */
void graph_set_enabled(graph_set *g, int on);
/* 1 when every bucket has a graph in the context's current stream mode. */
int graph_captured(const graph_set *g);

/* One step as rt_cuda_step runs it, but replayed from the bucket's graph of
 * the current stream mode when there is one, graphs are enabled and steps
 * are not synchronized one by one (MOEC_CUDA_SYNC=1, which needs eager
 * launches to name a fault). g may be NULL: eager. */
moec_status graph_step(graph_set *g, rt_cuda *c, int n, const int32_t *tokens,
                       const int32_t *positions, const int32_t *slots, float *logits_out,
                       int32_t *sampled_out);
/* graph_step with only the logits of rows first .. first + count - 1
 * copied back (into logits_out, count rows): a step's sampled rows only. */
moec_status graph_step_rows(graph_set *g, rt_cuda *c, int n, const int32_t *tokens,
                            const int32_t *positions, const int32_t *slots, int first, int count,
                            float *logits_out, int32_t *sampled_out);
/* Benchmarking: writes the inputs once, runs `warmup` steps of the bucket
 * holding n tokens as graph_step would (no copy-back), then `iters` more,
 * each between two events on stream 0; *median_ms is the median. */
moec_status graph_time_steps(graph_set *g, rt_cuda *c, int n, const int32_t *tokens,
                             const int32_t *positions, const int32_t *slots, int warmup,
                             int iters, float *median_ms);

/* ---- policy (graph_policy.c) --------------------------------------------- */

/* 1 when MOEC_DISABLE_GRAPHS is set to anything but "" or "0". */
int graph_disabled_by_env(void);
/* After rt_cuda_init: the stream mode (one stream when single_stream or
 * MOEC_SINGLE_STREAM=1), then, unless eager or MOEC_DISABLE_GRAPHS=1,
 * every bucket captured; *out gets the set (empty when eager) and
 * *capture_s the seconds capture took (0 when eager). */
moec_status graph_bind(rt_cuda *c, int eager, int single_stream, graph_set **out,
                       double *capture_s);

#endif
