/* serve_util.h — what the service's files (serve.c, serve_http.c,
 * serve_metrics.c) share: allocations that end the program when memory
 * runs out (a sample may; the library never does), formatted strings,
 * integers read from JSON, the UTF-8 check of what a client sent, and the
 * head that every request handed to the engine starts with. */
#ifndef MOEC_SAMPLES_SERVE_UTIL_H
#define MOEC_SAMPLES_SERVE_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "strbuf.h"

__attribute__((noreturn)) void serve_die_oom(void);
void *serve_xrealloc(void *p, size_t n);
void *serve_xcalloc(size_t n, size_t size);
/* vsnprintf / snprintf into a new string (free()). */
char *serve_vformat(const char *fmt, va_list ap);
char *serve_format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* b's text so far, or the end of the program when a write ran out of memory. */
const char *serve_buf_text(moec_buf *b);

/* v as an int when it is a JSON number with an integral value that a double
 * holds exactly and alone (within +-(2^53 - 1): 2^53 + 1 would read as 2^53,
 * another number than the one sent). */
int serve_json_int(const cJSON *v, long long *out);
/* A JSON number as the float the engine's settings are: 0 when it is past
 * a float's range (it would become an infinity, which the engine would name
 * instead of the number sent). One too small for a float becomes the least
 * float of its sign, not 0: a tiny top_p must not turn into 0, "no filter". */
int serve_json_float(const cJSON *v, float *out);

/* The offset of the first byte of s[0..n) that is not part of valid UTF-8
 * (a stray continuation byte, a cut or overlong sequence, a surrogate, a
 * code point past U+10FFFF); n when all of it is valid. */
size_t serve_utf8_invalid_at(const char *s, size_t n);

/* The next seed of a stream of them (state advanced), for requests that
 * name none: each differs. */
uint64_t serve_seed_next(uint64_t *state);

/* The first member of whatever a request's `user` points at (serve.c's
 * line requests, serve_http.c's HTTP ones): which front end submitted it,
 * and its times, for the latency histograms of /metrics. */
typedef struct serve_req_head {
    int http;        /* 1: serve_http.c's; 0: a request line's */
    double t_submit; /* moec_now_s() when the engine took it */
    double t_last;   /* when its last token came */
} serve_req_head;

#endif
