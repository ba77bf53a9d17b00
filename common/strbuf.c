/* strbuf.c — see strbuf.h. */
#include "strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(moec_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->oom = 1;
}

/* Room for `more` bytes and a NUL after len; 0 once out of memory. */
static int reserve(moec_buf *b, size_t more)
{
    if (b->oom)
        return 0;
    if (b->data && b->cap - b->len > more)
        return 1;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap - b->len <= more) {
        if (cap > ((size_t)-1) / 2) {
            fail(b);
            return 0;
        }
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (!p) {
        fail(b);
        return 0;
    }
    b->data = p;
    b->cap = cap;
    return 1;
}

void moec_buf_put(moec_buf *b, const char *s, size_t n)
{
    if (!reserve(b, n))
        return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void moec_buf_str(moec_buf *b, const char *s) { moec_buf_put(b, s, strlen(s)); }

void moec_buf_printf(moec_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        fail(b);
        return;
    }
    if (!reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void moec_buf_free(moec_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}
