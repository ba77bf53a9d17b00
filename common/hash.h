/* hash.h — FNV-1a 64, the one hash behind plan checksums, checkpoint hashes
 * and the cubin cache's payload sums. */
#ifndef MOEC_COMMON_HASH_H
#define MOEC_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>

#define MOEC_FNV_SEED 0xcbf29ce484222325ull

/* Continues hash h over n bytes (start from MOEC_FNV_SEED). */
static inline uint64_t moec_fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

#endif
