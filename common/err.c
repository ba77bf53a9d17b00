/* err.c — per-thread last error. Errors are values: every library function
 * returns a moec_status and leaves its message here. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[4096];
static _Thread_local size_t message_at; /* where the message starts, past "file:line: " */

const char *moec_last_error(void) { return last_error[0] ? last_error : "no error"; }

const char *moec_last_error_message(void)
{
    return last_error[0] ? last_error + message_at : "no error";
}

void moec_err_clear(void)
{
    last_error[0] = '\0';
    message_at = 0;
}

moec_status moec_err_set(moec_status st, const char *file, int line, const char *fmt, ...)
{
    const char *base = strrchr(file, '/');
    int n = snprintf(last_error, sizeof last_error, "%s:%d: ", base ? base + 1 : file, line);
    if (n < 0 || (size_t)n >= sizeof last_error)
        n = 0;
    message_at = (size_t)n;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
    va_end(ap);
    return st;
}

moec_status moec_err_wrap(moec_status st, const char *fmt, ...)
{
    char prefix[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    size_t plen = strlen(prefix) + 2; /* "prefix: " */
    size_t keep = strlen(last_error);
    if (keep > sizeof last_error - 1 - plen)
        keep = sizeof last_error - 1 - plen;
    memmove(last_error + plen, last_error, keep);
    last_error[plen + keep] = '\0';
    memcpy(last_error, prefix, plen - 2);
    last_error[plen - 2] = ':';
    last_error[plen - 1] = ' ';
    message_at = 0; /* the context comes first: all of it is the message */
    return st;
}

const char *moec_status_name(moec_status st)
{
    switch (st) {
    case MOEC_OK: return "ok";
    case MOEC_ERR_INVALID_ARG: return "invalid argument";
    case MOEC_ERR_IO: return "I/O error";
    case MOEC_ERR_FORMAT: return "malformed input";
    case MOEC_ERR_UNSUPPORTED: return "unsupported";
    case MOEC_ERR_MISMATCH: return "weight mismatch";
    case MOEC_ERR_OOM: return "out of memory";
    case MOEC_ERR_CAPACITY: return "capacity exceeded";
    case MOEC_ERR_NO_DEVICE: return "no CUDA device";
    case MOEC_ERR_CUDA: return "CUDA error";
    case MOEC_ERR_INTERNAL: return "internal error";
    case MOEC_ERR_NUMERIC: return "numeric error";
    case MOEC_ERR_NOT_FOUND: return "not found";
    }
    return "unknown status";
}
