/* strbuf.h — the one growing text buffer (IR text, generated CUDA source,
 * safetensors headers). After an allocation failure it stays empty with
 * `oom` set, so that writers check once, at the end. */
#ifndef MOEC_COMMON_STRBUF_H
#define MOEC_COMMON_STRBUF_H

#include <stddef.h>

typedef struct moec_buf {
    char *data; /* NUL-terminated once anything was written */
    size_t len, cap;
    int oom;
} moec_buf;

void moec_buf_put(moec_buf *b, const char *s, size_t n);
void moec_buf_str(moec_buf *b, const char *s);
void moec_buf_printf(moec_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void moec_buf_free(moec_buf *b);

#endif
