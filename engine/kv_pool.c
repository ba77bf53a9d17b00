/* kv_pool.c — the KV block manager (kv_pool.h): reference counts, a doubly
 * linked free list and a chained hash table over block ids, all arrays of
 * n_blocks, so that every operation is O(1) but a lookup's chain walk. */
#include "engine/kv_pool.h"

#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "hash.h"

moec_status moec_kv_pool_init(moec_kv_pool *p, int n_blocks, int block_size)
{
    memset(p, 0, sizeof *p);
    if (n_blocks < 1 || block_size < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "a KV pool of %d blocks of %d tokens", n_blocks,
                        block_size);
    size_t n = (size_t)n_blocks, buckets = 16;
    while (buckets < 2 * n)
        buckets *= 2;
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->mask = buckets - 1;
    p->ref = calloc(n, sizeof *p->ref);
    p->hashed = calloc(n, sizeof *p->hashed);
    p->hash = calloc(n, sizeof *p->hash);
    p->ids = malloc(n * (size_t)block_size * sizeof *p->ids);
    p->prev = malloc(n * sizeof *p->prev);
    p->next = malloc(n * sizeof *p->next);
    p->chain = malloc(n * sizeof *p->chain);
    p->bucket = malloc(buckets * sizeof *p->bucket);
    if (!p->ref || !p->hashed || !p->hash || !p->ids || !p->prev || !p->next || !p->chain ||
        !p->bucket) {
        moec_kv_pool_free(p);
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory for the bookkeeping of %d KV blocks",
                        n_blocks);
    }
    for (size_t i = 0; i < buckets; i++)
        p->bucket[i] = -1;
    for (int b = 0; b < n_blocks; b++) {
        p->prev[b] = b - 1;
        p->next[b] = b + 1 < n_blocks ? b + 1 : -1;
    }
    p->free_head = 0;
    p->free_tail = n_blocks - 1;
    p->n_free = n_blocks;
    return MOEC_OK;
}

void moec_kv_pool_free(moec_kv_pool *p)
{
    free(p->ref);
    free(p->hashed);
    free(p->hash);
    free(p->ids);
    free(p->prev);
    free(p->next);
    free(p->chain);
    free(p->bucket);
    memset(p, 0, sizeof *p);
}

uint64_t moec_kv_hash(uint64_t prev, const int32_t *ids, int n)
{
    return moec_fnv1a(moec_fnv1a(MOEC_FNV_SEED, &prev, sizeof prev), ids,
                      (size_t)n * sizeof *ids);
}

static const int32_t *block_ids(const moec_kv_pool *p, int b)
{
    return p->ids + (size_t)b * (size_t)p->block_size;
}

int moec_kv_lookup(const moec_kv_pool *p, uint64_t h, const int32_t *ids)
{
    for (int b = p->bucket[h & p->mask]; b >= 0; b = p->chain[b])
        if (p->hash[b] == h &&
            !memcmp(block_ids(p, b), ids, (size_t)p->block_size * sizeof *ids))
            return b;
    return -1;
}

static void unhash(moec_kv_pool *p, int b)
{
    int *at = &p->bucket[p->hash[b] & p->mask];
    while (*at != b)
        at = &p->chain[*at];
    *at = p->chain[b];
    p->hashed[b] = 0;
}

static void free_list_remove(moec_kv_pool *p, int b)
{
    if (p->prev[b] >= 0)
        p->next[p->prev[b]] = p->next[b];
    else
        p->free_head = p->next[b];
    if (p->next[b] >= 0)
        p->prev[p->next[b]] = p->prev[b];
    else
        p->free_tail = p->prev[b];
    p->n_free--;
    p->n_cached -= p->hashed[b];
}

void moec_kv_hold(moec_kv_pool *p, int b)
{
    if (p->ref[b]++ == 0)
        free_list_remove(p, b);
}

int moec_kv_take(moec_kv_pool *p)
{
    int b = p->free_head;
    if (b < 0)
        return -1;
    free_list_remove(p, b);
    if (p->hashed[b])
        unhash(p, b);
    p->ref[b] = 1;
    return b;
}

/* A block that caches nothing goes first in line to be taken; a cached one
 * last, so the cache forgets its least recently used blocks first. */
void moec_kv_release(moec_kv_pool *p, int b)
{
    if (--p->ref[b] > 0)
        return;
    p->n_free++;
    if (p->hashed[b]) {
        p->n_cached++;
        p->next[b] = -1;
        p->prev[b] = p->free_tail;
        if (p->free_tail >= 0)
            p->next[p->free_tail] = b;
        else
            p->free_head = b;
        p->free_tail = b;
    } else {
        p->prev[b] = -1;
        p->next[b] = p->free_head;
        if (p->free_head >= 0)
            p->prev[p->free_head] = b;
        else
            p->free_tail = b;
        p->free_head = b;
    }
}

void moec_kv_publish(moec_kv_pool *p, int b, uint64_t h, const int32_t *ids)
{
    if (p->hashed[b] || moec_kv_lookup(p, h, ids) >= 0)
        return;
    memcpy(p->ids + (size_t)b * (size_t)p->block_size, ids,
           (size_t)p->block_size * sizeof *ids);
    p->hash[b] = h;
    p->hashed[b] = 1;
    p->chain[b] = p->bucket[h & p->mask];
    p->bucket[h & p->mask] = b;
}

void moec_kv_forget(moec_kv_pool *p)
{
    for (int b = 0; b < p->n_blocks && p->n_cached; b++)
        if (p->hashed[b] && !p->ref[b]) {
            unhash(p, b);
            p->n_cached--;
        }
}
