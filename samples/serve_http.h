/* serve_http.h — moec-serve's OpenAI-compatible HTTP/1.1 API (--http),
 * served by GNU libmicrohttpd's threads beside the engine thread (serve.c's
 * loop), which alone touches the engine: requests come to it through a
 * queue and a wake-up descriptor, tokens go back through each request's
 * bounded buffer. See serve_http.c. */
#ifndef MOEC_SAMPLES_SERVE_HTTP_H
#define MOEC_SAMPLES_SERVE_HTTP_H

#include <poll.h>
#include <stddef.h>

#include "moec_rt.h"
#include "samples/serve_metrics.h"

typedef struct serve_http serve_http;

typedef struct serve_http_config {
    const char *host;       /* a numeric IPv4 or IPv6 address to bind */
    int port;               /* 0: a free one (serve_http_port says which) */
    const char *model_name; /* the id requests must name in "model" */
    int max_connections;    /* connections at once; one more is closed at once */
    int max_waiting;        /* HTTP requests accepted with no token yet; one more gets 429 */
    size_t max_body;        /* bytes of a request body; more gets 413 */
    unsigned timeout_s;     /* a connection idle this long is closed */
    int threads;            /* HTTP threads */
    int max_seq_len;        /* the engine's */
    int max_len;            /* moec_engine_max_len: the longest sequence the engine takes
                             * (max_model_len; chat's default max_tokens runs to it) */
    int vocab;              /* the engine's: stop_token_ids are checked against it */
} serve_http_config;

/* 0 when host is a numeric IPv4 or IPv6 address serve_http_start can bind,
 * else -1 said on stderr: checked as the options are read, before the model
 * loads. */
int serve_http_host_check(const char *host);

/* Starts serving (threads running, port bound); the tokenizer and metrics
 * stay the caller's and must outlive it. 0, or -1 with the reason on stderr. */
int serve_http_start(const serve_http_config *cfg, const moec_tokenizer_t *tok,
                     serve_metrics *metrics, serve_http **out);
int serve_http_port(const serve_http *h);

/* The engine thread, each turn of its loop: appends to *pfd (grown as
 * needed; *cap its room, np the entries before) what to poll: the wake-up
 * descriptor, and the sockets of requests waiting for the engine, whose
 * clients may hang up. Returns the new count. */
int serve_http_poll_fds(serve_http *h, struct pollfd **pfd, int *cap, int np);
/* Right after the poll (pfd: the entries serve_http_poll_fds added, or NULL
 * when the poll reported nothing): cancels the requests whose clients went
 * away, submits the new ones. */
void serve_http_pump(serve_http *h, moec_engine_t *engine, const struct pollfd *pfd);
/* An engine event of an HTTP request (its user points at a serve_req_head
 * with http set). */
void serve_http_event(serve_http *h, moec_engine_t *engine, const moec_event *ev);
/* Ends every request (clients still waiting get 503), stops the threads,
 * frees h. The engine is the caller's to free after. */
void serve_http_stop(serve_http *h);

#endif
