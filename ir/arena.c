/* arena.c — the IR's memory: a chunked bump allocator whose blocks are
 * zeroed and 16-byte aligned, freed all at once with its module. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

#define ARENA_ALIGN 16
#define ARENA_CHUNK (64 * 1024)

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t cap;  /* usable bytes from base */
    size_t used;
    unsigned char *base; /* first 16-byte aligned byte after the header */
} arena_chunk;

struct ir_arena {
    arena_chunk *head; /* the chunk being filled; older ones follow */
};

ir_arena *ir_arena_init(void) { return calloc(1, sizeof(ir_arena)); }

void ir_arena_free(ir_arena *a)
{
    if (!a)
        return;
    arena_chunk *c = a->head;
    while (c) {
        arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    free(a);
}

static arena_chunk *arena_chunk_new(size_t need)
{
    size_t cap = need > ARENA_CHUNK ? need : ARENA_CHUNK;
    size_t header = sizeof(arena_chunk) + ARENA_ALIGN;
    if (cap > SIZE_MAX - header)
        return NULL;
    arena_chunk *c = calloc(1, header + cap);
    if (!c)
        return NULL;
    uintptr_t p = (uintptr_t)(c + 1);
    p = (p + ARENA_ALIGN - 1) & ~(uintptr_t)(ARENA_ALIGN - 1);
    c->base = (unsigned char *)p;
    c->cap = cap;
    return c;
}

void *ir_arena_alloc(ir_arena *a, size_t size)
{
    if (!a)
        return NULL;
    if (size == 0)
        size = 1;
    if (size > SIZE_MAX - ARENA_ALIGN)
        return NULL;
    size = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    arena_chunk *c = a->head;
    if (!c || c->cap - c->used < size) {
        arena_chunk *n = arena_chunk_new(size);
        if (!n)
            return NULL;
        /* A big one-off block goes behind the current chunk so the current
         * chunk's free space stays usable. */
        if (c && size > ARENA_CHUNK / 4 && c->cap - c->used >= ARENA_CHUNK / 4) {
            n->next = c->next;
            c->next = n;
            n->used = size;
            return n->base;
        }
        n->next = c;
        a->head = n;
        c = n;
    }
    void *p = c->base + c->used;
    c->used += size;
    return p;
}

char *ir_arena_strdup(ir_arena *a, const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s);
    char *d = ir_arena_alloc(a, n + 1);
    if (d)
        memcpy(d, s, n + 1);
    return d;
}
