/* serve_metrics.h — what /metrics reports (Prometheus text), gathered on
 * the engine thread and read by the HTTP threads: the engine's own
 * counters (moec_engine_get_stats: requests, tokens, queue depth, KV
 * blocks, prefix hits), time-to-first-token and inter-token-latency
 * histograms of every request of either front end, and the HTTP requests
 * answered by endpoint and status. */
#ifndef MOEC_SAMPLES_SERVE_METRICS_H
#define MOEC_SAMPLES_SERVE_METRICS_H

#include "moec_rt.h"
#include "strbuf.h"

typedef struct serve_metrics serve_metrics;

serve_metrics *serve_metrics_new(void);
void serve_metrics_free(serve_metrics *m);

/* The engine thread: a request's first token came ttft_s after it was
 * submitted; a later one itl_s after the one before. */
void serve_metrics_ttft(serve_metrics *m, double ttft_s);
void serve_metrics_itl(serve_metrics *m, double itl_s);
/* The engine thread: the engine's counters now. */
void serve_metrics_engine(serve_metrics *m, const moec_engine_stats *st);
/* An HTTP thread: a response of this status went out for this endpoint
 * (one of the names serve_http.c routes, or "other"). */
void serve_metrics_http(serve_metrics *m, const char *endpoint, int status);
/* An HTTP thread: HTTP requests accepted and not generating yet. */
void serve_metrics_http_waiting(serve_metrics *m, int waiting);
/* Everything, as Prometheus text format 0.0.4, appended to b. */
void serve_metrics_render(serve_metrics *m, moec_buf *b);

#endif
