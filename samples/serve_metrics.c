/* serve_metrics.c — the numbers /metrics reports (serve_metrics.h). One
 * mutex: the engine thread writes a few numbers a token, the HTTP threads
 * read them all when a scraper asks. */
#include "samples/serve_metrics.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "samples/serve_util.h"

/* Bucket bounds in seconds (vLLM's, so that dashboards compare). */
static const double TTFT_BOUNDS[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                     0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
static const double ITL_BOUNDS[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
                                    0.2,   0.3,   0.4,  0.5,   0.75, 1.0,   2.5};
#define N_TTFT (sizeof TTFT_BOUNDS / sizeof *TTFT_BOUNDS)
#define N_ITL (sizeof ITL_BOUNDS / sizeof *ITL_BOUNDS)
#define MAX_BUCKETS 24

typedef struct histogram {
    const double *bounds;
    int n;                              /* bounds; the +Inf bucket is count */
    unsigned long long le[MAX_BUCKETS]; /* observations <= bounds[i] (not cumulative) */
    unsigned long long count;
    double sum;
} histogram;

/* HTTP responses by endpoint and status: a short list, grown as met. */
#define MAX_HTTP_ROWS 64
typedef struct http_row {
    const char *endpoint; /* a string literal of serve_http.c */
    int status;
    unsigned long long n;
} http_row;

struct serve_metrics {
    pthread_mutex_t mu;
    histogram ttft, itl;
    moec_engine_stats engine;
    http_row http[MAX_HTTP_ROWS];
    int n_http;
    int http_waiting;
};

serve_metrics *serve_metrics_new(void)
{
    serve_metrics *m = serve_xcalloc(1, sizeof *m);
    if (pthread_mutex_init(&m->mu, NULL))
        serve_die_oom();
    m->ttft = (histogram){.bounds = TTFT_BOUNDS, .n = (int)N_TTFT};
    m->itl = (histogram){.bounds = ITL_BOUNDS, .n = (int)N_ITL};
    return m;
}

void serve_metrics_free(serve_metrics *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static void observe(serve_metrics *m, histogram *h, double v)
{
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < h->n && v > h->bounds[i])
        i++;
    if (i < h->n)
        h->le[i]++;
    h->count++;
    h->sum += v;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_ttft(serve_metrics *m, double ttft_s) { observe(m, &m->ttft, ttft_s); }
void serve_metrics_itl(serve_metrics *m, double itl_s) { observe(m, &m->itl, itl_s); }

void serve_metrics_engine(serve_metrics *m, const moec_engine_stats *st)
{
    pthread_mutex_lock(&m->mu);
    m->engine = *st;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_http(serve_metrics *m, const char *endpoint, int status)
{
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_http &&
           !(m->http[i].status == status && !strcmp(m->http[i].endpoint, endpoint)))
        i++;
    if (i == m->n_http && i < MAX_HTTP_ROWS)
        m->http[m->n_http++] = (http_row){.endpoint = endpoint, .status = status};
    if (i < MAX_HTTP_ROWS)
        m->http[i].n++;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_http_waiting(serve_metrics *m, int waiting)
{
    pthread_mutex_lock(&m->mu);
    m->http_waiting = waiting;
    pthread_mutex_unlock(&m->mu);
}

static void head(moec_buf *b, const char *name, const char *type, const char *help)
{
    moec_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void render_histogram(moec_buf *b, const char *name, const char *help, const histogram *h)
{
    head(b, name, "histogram", help);
    unsigned long long cum = 0;
    for (int i = 0; i < h->n; i++) {
        cum += h->le[i];
        moec_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], cum);
    }
    moec_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n", name,
                    h->count, name, h->sum, name, h->count);
}

/* The engine's numbers (moec_engine_stats fields of three kinds), by
 * their names here. */
typedef enum stat_kind { STAT_INT, STAT_DOUBLE, STAT_U64 } stat_kind;
typedef struct engine_metric {
    const char *name, *type, *help;
    size_t off;
    stat_kind kind;
} engine_metric;
#define STAT(field, kind) offsetof(moec_engine_stats, field), kind

static const engine_metric ENGINE_METRICS[] = {
    {"moec_requests_running", "gauge", "Requests in the running set, holding KV blocks.",
     STAT(running, STAT_INT)},
    {"moec_requests_waiting", "gauge", "Requests in the engine's queue (new or preempted).",
     STAT(waiting, STAT_INT)},
    {"moec_kv_blocks", "gauge", "Blocks in the KV pool.", STAT(kv_blocks, STAT_INT)},
    {"moec_kv_blocks_used", "gauge", "KV blocks held by running requests.",
     STAT(kv_blocks_used, STAT_INT)},
    {"moec_kv_blocks_cached", "gauge", "KV blocks held by none, caching a prefix.",
     STAT(kv_blocks_cached, STAT_INT)},
    {"moec_prefix_cache_hit_rate", "gauge",
     "Prompt tokens the prefix cache saved over the prompt tokens admitted.",
     STAT(prefix_hit_rate, STAT_DOUBLE)},
    {"moec_generation_tokens_per_second", "gauge", "Generated tokens per second of step time.",
     STAT(tokens_per_s, STAT_DOUBLE)},
    {"moec_steps_total", "counter", "Engine steps run.", STAT(steps, STAT_U64)},
    {"moec_requests_finished_total", "counter", "Requests that ended (length, eos, stop).",
     STAT(requests_done, STAT_U64)},
    {"moec_requests_cancelled_total", "counter",
     "Requests cancelled (a client gone, a stop string, a cancel line).",
     STAT(requests_cancelled, STAT_U64)},
    {"moec_preemptions_total", "counter", "Running requests preempted to be recomputed.",
     STAT(preemptions, STAT_U64)},
    {"moec_prompt_tokens_total", "counter", "Prompt tokens admitted.",
     STAT(prompt_tokens, STAT_U64)},
    {"moec_prompt_tokens_cached_total", "counter",
     "Prompt tokens whose prefill the prefix cache saved.", STAT(cached_tokens, STAT_U64)},
    {"moec_generation_tokens_total", "counter", "Tokens generated.",
     STAT(generated_tokens, STAT_U64)},
};

static void render_stat(moec_buf *b, const engine_metric *e, const moec_engine_stats *st)
{
    const char *p = (const char *)st + e->off;
    head(b, e->name, e->type, e->help);
    if (e->kind == STAT_INT)
        moec_buf_printf(b, "%s %d\n", e->name, *(const int *)p);
    else if (e->kind == STAT_DOUBLE)
        moec_buf_printf(b, "%s %.17g\n", e->name, *(const double *)p);
    else
        moec_buf_printf(b, "%s %llu\n", e->name, (unsigned long long)*(const uint64_t *)p);
}

void serve_metrics_render(serve_metrics *m, moec_buf *b)
{
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < sizeof ENGINE_METRICS / sizeof *ENGINE_METRICS; i++)
        render_stat(b, &ENGINE_METRICS[i], &m->engine);
    head(b, "moec_http_requests_waiting", "gauge",
         "HTTP requests accepted that have no token yet (--max-waiting bounds them).");
    moec_buf_printf(b, "moec_http_requests_waiting %d\n", m->http_waiting);
    render_histogram(b, "moec_time_to_first_token_seconds",
                     "From a request's submission to its first token.", &m->ttft);
    render_histogram(b, "moec_inter_token_latency_seconds",
                     "Between two consecutive tokens of a request.", &m->itl);
    head(b, "moec_http_requests_total", "counter", "HTTP responses by endpoint and status.");
    for (int i = 0; i < m->n_http; i++)
        moec_buf_printf(b, "moec_http_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
                        m->http[i].endpoint, m->http[i].status, m->http[i].n);
    pthread_mutex_unlock(&m->mu);
}
