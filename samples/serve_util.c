/* serve_util.c — the helpers the service's files share (serve_util.h). */
#include "samples/serve_util.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void serve_die_oom(void)
{
    fprintf(stderr, "moec-serve: out of memory\n");
    exit(1);
}

void *serve_xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p)
        serve_die_oom();
    return p;
}

void *serve_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p)
        serve_die_oom();
    return p;
}

char *serve_vformat(const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0)
        serve_die_oom(); /* only an invalid format or a length past INT_MAX */
    char *text = serve_xrealloc(NULL, (size_t)n + 1);
    vsnprintf(text, (size_t)n + 1, fmt, ap);
    return text;
}

char *serve_format(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *text = serve_vformat(fmt, ap);
    va_end(ap);
    return text;
}

const char *serve_buf_text(moec_buf *b)
{
    if (b->oom)
        serve_die_oom();
    return b->data ? b->data : "";
}

int serve_json_int(const cJSON *v, long long *out)
{
    if (!cJSON_IsNumber(v))
        return 0;
    double d = v->valuedouble;
    /* 2^53 itself is out: 2^53 + 1 in the text reads as it too */
    if (!isfinite(d) || d != floor(d) || fabs(d) >= 9007199254740992.0)
        return 0;
    *out = (long long)d;
    return 1;
}

int serve_json_float(const cJSON *v, float *out)
{
    double d = v->valuedouble;
    if (isfinite(d) && fabs(d) > FLT_MAX)
        return 0;
    *out = (float)d;
    if (*out == 0 && d != 0)
        *out = copysignf(FLT_TRUE_MIN, (float)d);
    return 1;
}

size_t serve_utf8_invalid_at(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned cp = u[i], min;
        size_t len;
        if (cp < 0x80) {
            i++;
            continue;
        } else if ((cp & 0xE0) == 0xC0) {
            len = 2, cp &= 0x1F, min = 0x80;
        } else if ((cp & 0xF0) == 0xE0) {
            len = 3, cp &= 0x0F, min = 0x800;
        } else if ((cp & 0xF8) == 0xF0) {
            len = 4, cp &= 0x07, min = 0x10000;
        } else {
            return i;
        }
        if (n - i < len)
            return i;
        for (size_t k = 1; k < len; k++) {
            if ((u[i + k] & 0xC0) != 0x80)
                return i;
            cp = cp << 6 | (u[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return i;
        i += len;
    }
    return n;
}

uint64_t serve_seed_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull); /* splitmix64 */
    return (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull >> 11;
}
