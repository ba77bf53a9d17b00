/* err.h — the per-thread last error behind moec_last_error(), and the macros
 * that record an error and return its status. */
#ifndef MOEC_COMMON_ERR_H
#define MOEC_COMMON_ERR_H

#include "moec_rt.h"

#if defined(__GNUC__)
#define MOEC_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MOEC_PRINTF(a, b)
#endif

/* Records "file:line: message" as this thread's last error; returns st. */
moec_status moec_err_set(moec_status st, const char *file, int line, const char *fmt, ...)
    MOEC_PRINTF(4, 5);
/* Prefixes the current last error with more context ("while loading X: ..."). */
moec_status moec_err_wrap(moec_status st, const char *fmt, ...) MOEC_PRINTF(2, 3);
void moec_err_clear(void);

#define MOEC_ERR(st, ...) moec_err_set((st), __FILE__, __LINE__, __VA_ARGS__)
#define MOEC_TRY(expr)                           \
    do {                                         \
        moec_status moec_try_st_ = (expr);       \
        if (moec_try_st_ != MOEC_OK)             \
            return moec_try_st_;                 \
    } while (0)

#endif
