/* tokenizer_bpe.c — the BPE model: the vocab and merge tables, the trie of
 * added tokens, and the merge loop of one word, which applies merges by
 * rank exactly as Hugging Face tokenizers' Word::merge_all does (lowest
 * rank first, leftmost first on ties, stale queue entries skipped). */
#include "runtime/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "err.h"

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h ^ h >> 29;
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    return x ^ x >> 33;
}

/* ---- string map --------------------------------------------------------------- */

static int map_grow(tok_map *m)
{
    size_t slots = m->slots ? 2 * (m->mask + 1) : 64;
    uint32_t *v = calloc(slots, sizeof *v);
    if (!v)
        return -1;
    for (size_t k = 0; k < m->n; k++) {
        const struct tok_map_entry *e = &m->e[k];
        size_t i = hash_bytes(m->keys.p + e->off, e->len) & (slots - 1);
        while (v[i])
            i = (i + 1) & (slots - 1);
        v[i] = (uint32_t)k + 1;
    }
    free(m->slots);
    m->slots = v;
    m->mask = slots - 1;
    return 0;
}

int32_t tok_map_get(const tok_map *m, const char *s, size_t n)
{
    if (!m->slots)
        return -1;
    for (size_t i = hash_bytes(s, n) & m->mask;; i = (i + 1) & m->mask) {
        uint32_t k = m->slots[i];
        if (!k)
            return -1;
        const struct tok_map_entry *e = &m->e[k - 1];
        if (e->len == n && memcmp(m->keys.p + e->off, s, n) == 0)
            return e->val;
    }
}

int tok_map_put(tok_map *m, const char *s, size_t n, int32_t val)
{
    if (tok_map_get(m, s, n) >= 0)
        return 1;
    if ((m->n + 1) * 2 > m->mask + 1 && map_grow(m))
        return -1;
    struct tok_map_entry *e = tok_grow(m->e, m->n, &m->cap, sizeof *e);
    if (!e)
        return -1;
    m->e = e;
    size_t off = m->keys.len;
    if (tok_buf_put(&m->keys, s, n))
        return -1;
    m->e[m->n] = (struct tok_map_entry){off, (uint32_t)n, val};
    size_t i = hash_bytes(s, n) & m->mask;
    while (m->slots[i])
        i = (i + 1) & m->mask;
    m->slots[i] = (uint32_t)++m->n;
    return 0;
}

void tok_map_free(tok_map *m)
{
    tok_buf_free(&m->keys);
    free(m->e);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

/* ---- merges --------------------------------------------------------------------- */

int tok_merges_init(tok_merges *m, size_t count)
{
    size_t slots = 64;
    while (slots < 2 * count)
        slots *= 2;
    m->key = calloc(slots, sizeof *m->key);
    m->rank = malloc(slots * sizeof *m->rank);
    m->id = malloc(slots * sizeof *m->id);
    m->mask = slots - 1;
    return m->key && m->rank && m->id ? 0 : -1;
}

static uint64_t merge_key(int32_t a, int32_t b)
{
    return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1; /* never 0, the empty slot */
}

static size_t merges_slot(const tok_merges *m, uint64_t key)
{
    size_t i = hash_u64(key) & m->mask;
    while (m->key[i] && m->key[i] != key)
        i = (i + 1) & m->mask;
    return i;
}

void tok_merges_put(tok_merges *m, int32_t a, int32_t b, uint32_t rank, int32_t id)
{
    uint64_t key = merge_key(a, b);
    size_t i = merges_slot(m, key);
    m->key[i] = key;
    m->rank[i] = rank;
    m->id[i] = id;
}

int tok_merges_get(const tok_merges *m, int32_t a, int32_t b, uint32_t *rank, int32_t *id)
{
    if (!m->key)
        return 0;
    size_t i = merges_slot(m, merge_key(a, b));
    if (!m->key[i])
        return 0;
    *rank = m->rank[i];
    *id = m->id[i];
    return 1;
}

void tok_merges_free(tok_merges *m)
{
    free(m->key);
    free(m->rank);
    free(m->id);
    memset(m, 0, sizeof *m);
}

/* ---- the trie of added tokens ------------------------------------------------------- */

void tok_trie_init(tok_trie *t)
{
    memset(t, 0, sizeof *t);
    for (int b = 0; b < 256; b++)
        t->root[b] = -1;
}

static int32_t trie_child(const tok_trie *t, int32_t node, unsigned char byte)
{
    if (node < 0)
        return t->root[byte];
    for (int32_t c = t->v[node].child; c >= 0; c = t->v[c].next)
        if (t->v[c].byte == byte)
            return c;
    return -1;
}

static int32_t trie_new(tok_trie *t, int32_t parent, unsigned char byte)
{
    struct tok_trie_node *v = tok_grow(t->v, t->n, &t->cap, sizeof *v);
    if (!v)
        return -1;
    t->v = v;
    int32_t k = (int32_t)t->n++;
    t->v[k] = (struct tok_trie_node){-1, -1, -1, byte};
    if (parent < 0) {
        t->root[byte] = k;
    } else {
        t->v[k].next = t->v[parent].child;
        t->v[parent].child = k;
    }
    return k;
}

int tok_trie_add(tok_trie *t, const char *s, size_t n, int32_t added)
{
    int32_t node = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t c = trie_child(t, node, (unsigned char)s[i]);
        if (c < 0 && (c = trie_new(t, node, (unsigned char)s[i])) < 0)
            return -1;
        node = c;
    }
    if (t->v[node].added >= 0)
        return 1;
    t->v[node].added = added;
    return 0;
}

int32_t tok_trie_longest(const tok_trie *t, const char *s, size_t n, size_t *len)
{
    int32_t best = -1, node = -1;
    for (size_t i = 0; i < n; i++) {
        if ((node = trie_child(t, node, (unsigned char)s[i])) < 0)
            break;
        if (t->v[node].added >= 0) {
            best = t->v[node].added;
            *len = i + 1;
        }
    }
    return best;
}

void tok_trie_free(tok_trie *t)
{
    free(t->v);
    t->v = NULL;
    t->n = t->cap = 0;
}

/* ---- one word ---------------------------------------------------------------------- */

int tok_ids_push(tok_ids *ids, int32_t id)
{
    int32_t *v = tok_grow(ids->v, ids->n, &ids->cap, sizeof *v);
    if (!v)
        return -1;
    ids->v = v;
    ids->v[ids->n++] = id;
    return 0;
}

void tok_bpe_scratch_free(tok_bpe_scratch *sc)
{
    free(sc->sym);
    free(sc->heap);
    memset(sc, 0, sizeof *sc);
}

static int heap_less(const struct tok_heap_entry *a, const struct tok_heap_entry *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int heap_push(tok_bpe_scratch *sc, uint32_t rank, uint32_t pos, int32_t id)
{
    struct tok_heap_entry *h = tok_grow(sc->heap, sc->heap_n, &sc->heap_cap, sizeof *h);
    if (!h)
        return -1;
    sc->heap = h;
    size_t i = sc->heap_n++;
    struct tok_heap_entry e = {rank, pos, id};
    while (i > 0 && heap_less(&e, &sc->heap[(i - 1) / 2])) {
        sc->heap[i] = sc->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    sc->heap[i] = e;
    return 0;
}

static struct tok_heap_entry heap_pop(tok_bpe_scratch *sc)
{
    struct tok_heap_entry top = sc->heap[0], last = sc->heap[--sc->heap_n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= sc->heap_n)
            break;
        if (c + 1 < sc->heap_n && heap_less(&sc->heap[c + 1], &sc->heap[c]))
            c++;
        if (!heap_less(&sc->heap[c], &last))
            break;
        sc->heap[i] = sc->heap[c];
        i = c;
    }
    if (sc->heap_n)
        sc->heap[i] = last;
    return top;
}

/* Queues the merge of the symbol at pos with its right neighbour, if any rule merges them. */
static int queue_pair(const moec_tokenizer_t *t, tok_bpe_scratch *sc, int32_t pos)
{
    const struct tok_symbol *s = sc->sym;
    uint32_t rank;
    int32_t id;
    if (pos < 0 || s[pos].next < 0 || !tok_merges_get(&t->merges, s[pos].id, s[s[pos].next].id, &rank, &id))
        return 0;
    return heap_push(sc, rank, (uint32_t)pos, id);
}

static void add_symbol(tok_bpe_scratch *sc, size_t *n, int32_t id, uint32_t len)
{
    sc->sym[*n] = (struct tok_symbol){id, (int32_t)*n - 1, -1, len};
    if (*n > 0)
        sc->sym[*n - 1].next = (int32_t)*n;
    (*n)++;
}

/* The word's first symbols: one per character found in the vocab, with
 * unk_token (fused or not) for the others, or nothing when there is no
 * unk_token, as tokenizers' merge_word does. */
static size_t initial_symbols(const moec_tokenizer_t *t, const char *s, size_t n, tok_bpe_scratch *sc)
{
    size_t k = 0;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < n;) {
        size_t len = 1;
        while (i + len < n && ((unsigned char)s[i + len] & 0xc0) == 0x80)
            len++;
        int32_t id = tok_map_get(&t->vocab, s + i, len);
        if (id >= 0) {
            if (unk_len)
                add_symbol(sc, &k, t->unk_id, unk_len);
            unk_len = 0;
            add_symbol(sc, &k, id, (uint32_t)len);
        } else if (t->unk_id >= 0) {
            if (unk_len && !t->fuse_unk) {
                add_symbol(sc, &k, t->unk_id, unk_len);
                unk_len = 0;
            }
            unk_len += (uint32_t)len;
        }
        i += len;
    }
    if (unk_len)
        add_symbol(sc, &k, t->unk_id, unk_len);
    return k;
}

moec_status tok_bpe(const moec_tokenizer_t *t, const char *s, size_t n, tok_bpe_scratch *sc,
                    tok_ids *out)
{
    if (t->ignore_merges) {
        int32_t id = tok_map_get(&t->vocab, s, n);
        if (id >= 0)
            return tok_ids_push(out, id) ? MOEC_ERR(MOEC_ERR_OOM, "out of memory encoding") : MOEC_OK;
    }
    if (n > sc->sym_cap) {
        struct tok_symbol *v = realloc(sc->sym, n * sizeof *v);
        if (!v)
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory encoding a %zu-byte word", n);
        sc->sym = v;
        sc->sym_cap = n;
    }
    size_t count = initial_symbols(t, s, n, sc);
    struct tok_symbol *sym = sc->sym;
    sc->heap_n = 0;
    for (size_t i = 0; i + 1 < count; i++)
        if (queue_pair(t, sc, (int32_t)i))
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory encoding a %zu-byte word", n);
    while (sc->heap_n) {
        struct tok_heap_entry top = heap_pop(sc);
        struct tok_symbol *left = &sym[top.pos];
        uint32_t rank;
        int32_t id;
        if (left->len == 0 || left->next < 0)
            continue;
        struct tok_symbol *right = &sym[left->next];
        /* a queued merge whose pair has changed since is stale */
        if (!tok_merges_get(&t->merges, left->id, right->id, &rank, &id) || id != top.id)
            continue;
        left->id = top.id;
        left->len += right->len;
        left->next = right->next;
        right->len = 0;
        if (left->next >= 0)
            sym[left->next].prev = (int32_t)top.pos;
        if (queue_pair(t, sc, left->prev) || queue_pair(t, sc, (int32_t)top.pos))
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory encoding a %zu-byte word", n);
    }
    for (size_t i = 0; i < count; i++)
        if (sym[i].len && tok_ids_push(out, sym[i].id))
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory encoding");
    return MOEC_OK;
}
