/* kv_pool.h — the KV block manager behind the scheduler (engine/sched.c):
 * which blocks of the pool are held and by how many sequences, which are
 * free, and which hold a prefix another request may reuse (the prefix
 * cache: a block's hash chains its token ids onto the hash of the blocks
 * before it, as nano-vllm's BlockManager does). Free blocks are taken
 * least recently freed first, those that cache nothing before those that
 * do. Host bookkeeping only: the KV data lives in the backend's pools. */
#ifndef MOEC_ENGINE_KV_POOL_H
#define MOEC_ENGINE_KV_POOL_H

#include <stdint.h>

#include "moec_rt.h"

typedef struct moec_kv_pool {
    int n_blocks, block_size;
    int *ref;              /* per block: the sequences holding it */
    unsigned char *hashed; /* per block: its hash is in the table */
    uint64_t *hash;        /* per block: its chain hash, when hashed */
    int32_t *ids;          /* per block: its block_size token ids, when hashed */
    int *prev, *next;      /* the free list (ref 0), in the order blocks are taken */
    int free_head, free_tail, n_free;
    int n_cached;          /* free blocks that are hashed */
    int *bucket, *chain;   /* the hash table: first block of a bucket, next in it */
    uint64_t mask;
} moec_kv_pool;

/* Every block free. */
moec_status moec_kv_pool_init(moec_kv_pool *p, int n_blocks, int block_size);
void moec_kv_pool_free(moec_kv_pool *p);
/* The hash of a block of ids that follows a block of hash prev (the first
 * block follows MOEC_FNV_SEED). */
uint64_t moec_kv_hash(uint64_t prev, const int32_t *ids, int n);
/* The block cached with hash h and these ids (held or free), or -1. */
int moec_kv_lookup(const moec_kv_pool *p, uint64_t h, const int32_t *ids);
/* One more holder of block b (a cached block found by lookup). */
void moec_kv_hold(moec_kv_pool *p, int b);
/* A free block for a new holder, its cached prefix (if any) forgotten; -1
 * when none is free. */
int moec_kv_take(moec_kv_pool *p);
/* One holder fewer; at none the block is free, still cached if hashed. */
void moec_kv_release(moec_kv_pool *p, int b);
/* Caches held block b (its ids computed) under hash h, unless another block
 * already caches h. */
void moec_kv_publish(moec_kv_pool *p, int b, uint64_t h, const int32_t *ids);

/* Forgets every cached block no sequence holds (their KV is about to be
 * overwritten from outside the scheduler). */
void moec_kv_forget(moec_kv_pool *p);

#endif
