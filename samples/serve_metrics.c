/* serve_metrics.c — the numbers /metrics reports (serve_metrics.h). One
 * mutex: the engine thread writes a few numbers a token, the HTTP threads
 * read them all when a scraper asks. */
#include "samples/serve_metrics.h"

#include <pthread.h>
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

static void gauge(moec_buf *b, const char *name, const char *help, double v)
{
    head(b, name, "gauge", help);
    moec_buf_printf(b, "%s %.17g\n", name, v);
}

static void counter(moec_buf *b, const char *name, const char *help, unsigned long long v)
{
    head(b, name, "counter", help);
    moec_buf_printf(b, "%s %llu\n", name, v);
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

void serve_metrics_render(serve_metrics *m, moec_buf *b)
{
    pthread_mutex_lock(&m->mu);
    const moec_engine_stats *st = &m->engine;
    gauge(b, "moec_requests_running", "Requests in the running set, holding KV blocks.",
          st->running);
    gauge(b, "moec_requests_waiting", "Requests in the engine's queue (new or preempted).",
          st->waiting);
    gauge(b, "moec_http_requests_waiting",
          "HTTP requests accepted that have no token yet (--max-waiting bounds them).",
          m->http_waiting);
    gauge(b, "moec_kv_blocks", "Blocks in the KV pool.", st->kv_blocks);
    gauge(b, "moec_kv_blocks_used", "KV blocks held by running requests.", st->kv_blocks_used);
    gauge(b, "moec_kv_blocks_cached", "KV blocks held by none, caching a prefix.",
          st->kv_blocks_cached);
    gauge(b, "moec_prefix_cache_hit_rate",
          "Prompt tokens the prefix cache saved over the prompt tokens admitted.",
          st->prefix_hit_rate);
    gauge(b, "moec_generation_tokens_per_second", "Generated tokens per second of step time.",
          st->tokens_per_s);
    counter(b, "moec_steps_total", "Engine steps run.", st->steps);
    counter(b, "moec_requests_finished_total", "Requests that ended (length, eos, stop).",
            st->requests_done);
    counter(b, "moec_requests_cancelled_total",
            "Requests cancelled (a client gone, a stop string, a cancel line).",
            st->requests_cancelled);
    counter(b, "moec_preemptions_total", "Running requests preempted to be recomputed.",
            st->preemptions);
    counter(b, "moec_prompt_tokens_total", "Prompt tokens admitted.", st->prompt_tokens);
    counter(b, "moec_prompt_tokens_cached_total",
            "Prompt tokens whose prefill the prefix cache saved.", st->cached_tokens);
    counter(b, "moec_generation_tokens_total", "Tokens generated.", st->generated_tokens);
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
