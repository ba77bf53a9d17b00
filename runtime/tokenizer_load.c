/* tokenizer_load.c — reads tokenizer.json (and tokenizer_config.json) into
 * a moec_tokenizer: the BPE model, the added tokens, the normalizer, the
 * pre-tokenizers, the post-processor and the decoder. Everything is checked
 * as it is read; a component or setting moec does not implement is refused
 * with an error naming it and its place in the file, never ignored. */
#include "runtime/tokenizer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

/* What is being read, for messages. */
typedef struct ld {
    moec_tokenizer_t *t;
    const char *file;
    tok_buf names;    /* the string each added token decodes as, back to back */
    uint32_t *name_off;
    tok_map specials; /* contents of the special added tokens */
} ld;

static moec_status ld_fail(moec_status st, const char *src, int line, const char *file,
                           const char *where, const char *fmt, ...) MOEC_PRINTF(6, 7);
static moec_status ld_fail(moec_status st, const char *src, int line, const char *file,
                           const char *where, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return moec_err_set(st, src, line, "%s: %s%s%s", file, where, where[0] ? ": " : "", msg);
}
#define FAIL(st, where, ...) ld_fail((st), __FILE__, __LINE__, L->file, (where), __VA_ARGS__)
#define OOM(where) FAIL(MOEC_ERR_OOM, (where), "out of memory")

/* ---- JSON ------------------------------------------------------------------------- */

/* An upper bound on the values a JSON text makes (one per comma, colon,
 * bracket and brace outside strings, plus one) and its deepest nesting, so
 * that a hostile file is refused before cJSON allocates a node for each or
 * recurses into it. */
static size_t json_value_bound(const char *s, size_t n, int *depth)
{
    size_t count = 1;
    int in_str = 0, d = 0;
    *depth = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == ',' || c == ':' || c == '[' || c == '{') {
            count++;
            if (c != ',' && c != ':' && ++d > *depth)
                *depth = d;
        } else if (c == ']' || c == '}') {
            d--;
        }
    }
    return count;
}

static moec_status parse_json(ld *L, const char *text, size_t len, cJSON **out)
{
    int depth;
    size_t values = json_value_bound(text, len, &depth);
    if (values > TOK_MAX_JSON_VALUES)
        return FAIL(MOEC_ERR_CAPACITY, "", "about %zu JSON values, more than the %zu moec reads",
                    values, TOK_MAX_JSON_VALUES);
    if (depth > TOK_MAX_JSON_DEPTH)
        return FAIL(MOEC_ERR_CAPACITY, "", "JSON nested %d deep, more than the %d moec reads", depth,
                    TOK_MAX_JSON_DEPTH);
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!*out)
        return FAIL(MOEC_ERR_FORMAT, "", "not valid JSON (at byte %ld)",
                    end ? (long)(end - text) : 0L);
    if (!cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return FAIL(MOEC_ERR_FORMAT, "", "not a JSON object");
    }
    return MOEC_OK;
}

/* obj's member key, NULL when absent or null. */
static const cJSON *member(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static moec_status get_bool(ld *L, const cJSON *obj, const char *where, const char *key, int def,
                            int *out)
{
    const cJSON *v = member(obj, key);
    if (v && !cJSON_IsBool(v))
        return FAIL(MOEC_ERR_FORMAT, where, "%s must be true or false", key);
    *out = v ? cJSON_IsTrue(v) : def;
    return MOEC_OK;
}

/* A string member (NULL when absent or null). */
static moec_status get_str(ld *L, const cJSON *obj, const char *where, const char *key,
                           const char **out)
{
    const cJSON *v = member(obj, key);
    if (v && !cJSON_IsString(v))
        return FAIL(MOEC_ERR_FORMAT, where, "%s must be a string", key);
    *out = v ? v->valuestring : NULL;
    return MOEC_OK;
}

/* An id: an integer in [0, TOK_MAX_ID]. */
static moec_status get_id(ld *L, const cJSON *v, const char *where, int32_t *out)
{
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!cJSON_IsNumber(v) || d != floor(d) || d < 0 || d > TOK_MAX_ID)
        return FAIL(MOEC_ERR_FORMAT, where, "an id must be an integer from 0 to %d", TOK_MAX_ID);
    *out = (int32_t)d;
    return MOEC_OK;
}

/* A component's "type", required. */
static moec_status get_type(ld *L, const cJSON *obj, const char *where, const char **out)
{
    if (!cJSON_IsObject(obj))
        return FAIL(MOEC_ERR_FORMAT, where, "must be a JSON object or null");
    MOEC_TRY(get_str(L, obj, where, "type", out));
    if (!*out)
        return FAIL(MOEC_ERR_FORMAT, where, "has no type");
    return MOEC_OK;
}

static int utf8_valid(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int cut, k = tok_utf8_next((const unsigned char *)s + i, n - i, &cp, &cut);
        if (k < 0)
            return 0;
        i += (size_t)k;
    }
    return 1;
}

/* ---- the model --------------------------------------------------------------------- */

static moec_status load_vocab(ld *L, const cJSON *vocab)
{
    moec_tokenizer_t *t = L->t;
    if (!cJSON_IsObject(vocab))
        return FAIL(MOEC_ERR_FORMAT, "model.vocab", "must be a JSON object of token -> id");
    uint8_t *seen = calloc((size_t)TOK_MAX_ID + 1, 1);
    if (!seen)
        return OOM("model.vocab");
    moec_status st = MOEC_OK;
    for (const cJSON *e = vocab->child; e && st == MOEC_OK; e = e->next) {
        size_t n = strlen(e->string);
        int32_t id;
        if ((st = get_id(L, e, "model.vocab", &id)) != MOEC_OK)
            break;
        if (n == 0 || n > TOK_MAX_TOKEN_BYTES) {
            st = FAIL(MOEC_ERR_FORMAT, "model.vocab", "a token of %zu bytes (1 to %d allowed)", n,
                      TOK_MAX_TOKEN_BYTES);
        } else if (tok_map_get(&t->vocab, e->string, n) >= 0) {
            st = FAIL(MOEC_ERR_FORMAT, "model.vocab", "'%.80s' appears twice", e->string);
        } else if (seen[id]) {
            st = FAIL(MOEC_ERR_FORMAT, "model.vocab", "id %d is given to two tokens (one is "
                                                       "'%.80s')", (int)id, e->string);
        } else {
            seen[id] = 1;
            if (tok_map_put(&t->vocab, e->string, n, id) < 0)
                st = OOM("model.vocab");
        }
    }
    free(seen);
    return st;
}

/* One merge rule: "a b", or ["a", "b"]. */
static moec_status merge_parts(ld *L, const cJSON *m, const char *where, const char **a,
                               size_t *na, const char **b, size_t *nb)
{
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return FAIL(MOEC_ERR_FORMAT, where, "'%.80s' is not two tokens joined by one space", s);
        *a = s;
        *na = (size_t)(sp - s);
        *b = sp + 1;
        *nb = strlen(sp + 1);
        return MOEC_OK;
    }
    if (cJSON_GetArraySize(m) != 2 || !cJSON_IsString(m->child) || !cJSON_IsString(m->child->next))
        return FAIL(MOEC_ERR_FORMAT, where, "a merge is \"a b\" or [\"a\", \"b\"]");
    *a = m->child->valuestring;
    *na = strlen(*a);
    *b = m->child->next->valuestring;
    *nb = strlen(*b);
    return MOEC_OK;
}

static moec_status load_merges(ld *L, const cJSON *merges)
{
    moec_tokenizer_t *t = L->t;
    if (!cJSON_IsArray(merges))
        return FAIL(MOEC_ERR_FORMAT, "model.merges", "must be a JSON array");
    if (tok_merges_init(&t->merges, (size_t)cJSON_GetArraySize(merges)))
        return OOM("model.merges");
    tok_buf joined = {0};
    moec_status st = MOEC_OK;
    uint32_t rank = 0;
    for (const cJSON *m = merges->child; m && st == MOEC_OK; m = m->next, rank++) {
        char where[64];
        snprintf(where, sizeof where, "model.merges[%u]", rank);
        const char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        if ((st = merge_parts(L, m, where, &a, &na, &b, &nb)) != MOEC_OK)
            break;
        joined.len = 0;
        if (tok_buf_put(&joined, a, na) || tok_buf_put(&joined, b, nb)) {
            st = OOM(where);
            break;
        }
        int32_t ia = tok_map_get(&t->vocab, a, na), ib = tok_map_get(&t->vocab, b, nb);
        int32_t id = tok_map_get(&t->vocab, joined.p, joined.len);
        const char *missing = ia < 0 ? a : ib < 0 ? b : id < 0 ? joined.p : NULL;
        int nmissing = (int)(ia < 0 ? na : ib < 0 ? nb : joined.len);
        if (missing)
            st = FAIL(MOEC_ERR_FORMAT, where, "'%.*s' is not in the vocab", nmissing > 80 ? 80 : nmissing,
                      missing);
        else
            tok_merges_put(&t->merges, ia, ib, rank, id);
    }
    tok_buf_free(&joined);
    return st;
}

/* A prefix or suffix setting: moec's byte-level BPE has neither. */
static moec_status check_affix(ld *L, const cJSON *model, const char *key)
{
    const char *v = NULL;
    MOEC_TRY(get_str(L, model, "model", key, &v));
    if (v && v[0])
        return FAIL(MOEC_ERR_UNSUPPORTED, "model", "%s '%s' is not supported (byte-level BPE has "
                                                   "none)",
                    key, v);
    return MOEC_OK;
}

static moec_status load_model(ld *L, const cJSON *model)
{
    moec_tokenizer_t *t = L->t;
    const char *type = NULL, *unk = NULL;
    if (!model)
        return FAIL(MOEC_ERR_FORMAT, "model", "missing");
    if (!cJSON_IsObject(model))
        return FAIL(MOEC_ERR_FORMAT, "model", "must be a JSON object");
    MOEC_TRY(get_str(L, model, "model", "type", &type));
    if (type ? strcmp(type, "BPE") != 0 : !member(model, "merges"))
        return FAIL(MOEC_ERR_UNSUPPORTED, "model.type", "'%s' is not supported (moec supports BPE)",
                    type ? type : "(none, and no merges)");
    const cJSON *dropout = member(model, "dropout");
    if (dropout && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
        return FAIL(MOEC_ERR_UNSUPPORTED, "model.dropout", "only null or 0 is supported (dropout "
                                                           "makes encoding random)");
    int byte_fallback;
    MOEC_TRY(get_bool(L, model, "model", "byte_fallback", 0, &byte_fallback));
    if (byte_fallback)
        return FAIL(MOEC_ERR_UNSUPPORTED, "model.byte_fallback", "true is not supported (byte-level "
                                                                 "BPE needs no fallback)");
    MOEC_TRY(check_affix(L, model, "continuing_subword_prefix"));
    MOEC_TRY(check_affix(L, model, "end_of_word_suffix"));
    MOEC_TRY(get_bool(L, model, "model", "fuse_unk", 0, &t->fuse_unk));
    MOEC_TRY(get_bool(L, model, "model", "ignore_merges", 0, &t->ignore_merges));
    MOEC_TRY(get_str(L, model, "model", "unk_token", &unk));
    MOEC_TRY(load_vocab(L, member(model, "vocab")));
    MOEC_TRY(load_merges(L, member(model, "merges")));
    t->unk_id = unk ? tok_map_get(&t->vocab, unk, strlen(unk)) : -1;
    if (unk && t->unk_id < 0)
        return FAIL(MOEC_ERR_FORMAT, "model.unk_token", "'%.80s' is not in the vocab", unk);
    return MOEC_OK;
}

/* A Sequence: each component of the array obj[key], in order. */
typedef moec_status (*ld_part)(ld *L, const cJSON *part, const char *where, int depth);
static moec_status load_sequence(ld *L, const cJSON *obj, const char *key, const char *where,
                                 int depth, ld_part load)
{
    const cJSON *list = member(obj, key);
    if (!cJSON_IsArray(list))
        return FAIL(MOEC_ERR_FORMAT, where, "a Sequence needs a %s array", key);
    if (depth >= TOK_MAX_NESTING)
        return FAIL(MOEC_ERR_UNSUPPORTED, where, "Sequences nested more than %d deep", TOK_MAX_NESTING);
    int i = 0;
    for (const cJSON *e = list->child; e; e = e->next, i++) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s.%s[%d]", where, key, i);
        MOEC_TRY(load(L, e, sub, depth + 1));
    }
    return MOEC_OK;
}

/* ---- the normalizer ----------------------------------------------------------------- */

static moec_status load_normalizer(ld *L, const cJSON *n, const char *where, int depth)
{
    const char *type = NULL;
    if (!n)
        return MOEC_OK;
    MOEC_TRY(get_type(L, n, where, &type));
    if (strcmp(type, "NFC") == 0) {
        L->t->nfc = 1;
        return MOEC_OK;
    }
    if (strcmp(type, "Sequence") != 0)
        return FAIL(MOEC_ERR_UNSUPPORTED, where, "type '%s' is not supported (moec supports NFC "
                                                 "and Sequence)",
                    type);
    return load_sequence(L, n, "normalizers", where, depth, load_normalizer);
}

/* ---- the pre-tokenizers ----------------------------------------------------------------- */

static tok_step *new_step(ld *L, const char *where, moec_status *st)
{
    moec_tokenizer_t *t = L->t;
    if (t->n_steps == TOK_MAX_STEPS) {
        *st = FAIL(MOEC_ERR_UNSUPPORTED, where, "more than %d pre-tokenizers", TOK_MAX_STEPS);
        return NULL;
    }
    tok_step *s = &t->steps[t->n_steps++];
    memset(s, 0, sizeof *s);
    return s;
}

static moec_status compile_step(ld *L, tok_step *s, const char *pat, int literal, const char *where)
{
    char msg[256];
    s->re = tok_regex_compile(pat, strlen(pat), literal, msg, sizeof msg);
    if (!s->re)
        return FAIL(MOEC_ERR_UNSUPPORTED, where, "the pattern \"%.200s\" %s", pat, msg);
    return MOEC_OK;
}

static moec_status load_split(ld *L, const cJSON *p, const char *where)
{
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                  "Contiguous"};
    moec_status st = MOEC_OK;
    const char *behavior = NULL, *regex = NULL, *string = NULL;
    const cJSON *pat = member(p, "pattern");
    if (!cJSON_IsObject(pat))
        return FAIL(MOEC_ERR_FORMAT, where, "a Split needs a pattern {\"Regex\": ...} or "
                                            "{\"String\": ...}");
    MOEC_TRY(get_str(L, pat, where, "Regex", &regex));
    MOEC_TRY(get_str(L, pat, where, "String", &string));
    if (!regex == !string)
        return FAIL(MOEC_ERR_FORMAT, where, "a Split pattern is either Regex or String");
    MOEC_TRY(get_str(L, p, where, "behavior", &behavior));
    tok_step *s = new_step(L, where, &st);
    if (!s)
        return st;
    s->kind = TOK_STEP_SPLIT;
    MOEC_TRY(get_bool(L, p, where, "invert", 0, &s->invert));
    int b = 0;
    while (b < 5 && (!behavior || strcmp(behavior, names[b]) != 0))
        b++;
    if (b == 5)
        return FAIL(MOEC_ERR_UNSUPPORTED, where, "behavior '%s' is not one of Removed, Isolated, "
                                                 "MergedWithPrevious, MergedWithNext, Contiguous",
                    behavior ? behavior : "(none)");
    s->behavior = (tok_behavior)b;
    return compile_step(L, s, regex ? regex : string, string != NULL, where);
}

static moec_status load_pretok(ld *L, const cJSON *p, const char *where, int depth)
{
    moec_status st = MOEC_OK;
    const char *type = NULL;
    tok_step *s;
    if (!p)
        return MOEC_OK;
    MOEC_TRY(get_type(L, p, where, &type));
    if (strcmp(type, "Split") == 0)
        return load_split(L, p, where);
    if (strcmp(type, "Digits") == 0) {
        int individual;
        MOEC_TRY(get_bool(L, p, where, "individual_digits", 0, &individual));
        if (!(s = new_step(L, where, &st)))
            return st;
        s->kind = TOK_STEP_SPLIT;
        s->behavior = individual ? TOK_ISOLATED : TOK_CONTIGUOUS; /* char::is_numeric is \p{N} */
        return compile_step(L, s, "\\p{N}", 0, where);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        int trim_offsets; /* moves offsets only, which moec does not report */
        if (!(s = new_step(L, where, &st)))
            return st;
        s->kind = TOK_STEP_BYTE_LEVEL;
        MOEC_TRY(get_bool(L, p, where, "add_prefix_space", 1, &s->add_prefix_space));
        MOEC_TRY(get_bool(L, p, where, "use_regex", 1, &s->use_regex));
        return get_bool(L, p, where, "trim_offsets", 1, &trim_offsets);
    }
    if (strcmp(type, "Sequence") != 0)
        return FAIL(MOEC_ERR_UNSUPPORTED, where, "type '%s' is not supported (moec supports Split, "
                                                 "Digits, ByteLevel and Sequence)",
                    type);
    return load_sequence(L, p, "pretokenizers", where, depth, load_pretok);
}

/* ---- added tokens ----------------------------------------------------------------------- */

/* One entry of added_tokens. tokenizers re-numbers added tokens as it reads
 * them (the vocab's id for a token the vocab has, else the next id after
 * the vocab); a file whose ids disagree is refused rather than re-numbered. */
static moec_status load_added_one(ld *L, const cJSON *a, const char *where, int32_t *next_id)
{
    moec_tokenizer_t *t = L->t;
    const char *content = NULL;
    int32_t id = 0;
    if (!cJSON_IsObject(a))
        return FAIL(MOEC_ERR_FORMAT, where, "must be a JSON object");
    MOEC_TRY(get_str(L, a, where, "content", &content));
    if (!content || !member(a, "id"))
        return FAIL(MOEC_ERR_FORMAT, where, "needs an id and a content");
    MOEC_TRY(get_id(L, member(a, "id"), where, &id));
    size_t n = strlen(content);
    if (n == 0) /* tokenizers ignores empty added tokens */
        return MOEC_OK;
    if (n > TOK_MAX_TOKEN_BYTES || !utf8_valid(content, n))
        return FAIL(MOEC_ERR_FORMAT, where, "the content must be valid UTF-8 of at most %d bytes",
                    TOK_MAX_TOKEN_BYTES);
    if (L->names.len + n > TOK_MAX_ADDED_BYTES)
        return FAIL(MOEC_ERR_CAPACITY, where, "added tokens of more than %zu bytes in all",
                    TOK_MAX_ADDED_BYTES);
    if (tok_map_get(&t->added_ids, content, n) >= 0)
        return FAIL(MOEC_ERR_FORMAT, where, "'%.80s' is already an added token", content);
    int32_t vocab_id = tok_map_get(&t->vocab, content, n);
    int32_t want = vocab_id >= 0 ? vocab_id : (*next_id)++;
    if (id != want)
        return FAIL(MOEC_ERR_FORMAT, where, "'%.80s' has id %d, but tokenizers gives it id %d (%s)",
                    content, (int)id, (int)want,
                    vocab_id >= 0 ? "its id in the vocab" : "the next id after the vocab");
    tok_added *x = &t->added[t->n_added];
    int flags[5];
    static const char *keys[] = {"special", "single_word", "lstrip", "rstrip", "normalized"};
    for (int k = 0; k < 5; k++)
        MOEC_TRY(get_bool(L, a, where, keys[k], k == 4 ? !flags[0] : 0, &flags[k]));
    *x = (tok_added){id, (uint8_t)flags[1], (uint8_t)flags[2], (uint8_t)flags[3],
                     (uint8_t)flags[4], (uint8_t)flags[0]};
    /* A normalized token matches, and decodes as, its normalized form. */
    size_t off = L->names.len;
    int same = 1;
    if (x->normalized && t->nfc)
        MOEC_TRY(tok_nfc(content, n, &L->names, &same));
    if (same && tok_buf_put(&L->names, content, n))
        return OOM(where);
    L->name_off[t->n_added] = (uint32_t)off;
    size_t key_len = L->names.len - off;
    int r = tok_trie_add(x->normalized ? &t->norm_trie : &t->raw_trie, L->names.p + off, key_len,
                         t->n_added);
    if (r > 0)
        return FAIL(MOEC_ERR_FORMAT, where, "'%.80s' matches the same text as another added token",
                    content);
    if (r < 0 || tok_map_put(&t->added_ids, content, n, id) < 0 ||
        (x->special && tok_map_put(&L->specials, content, n, id) < 0))
        return OOM(where);
    t->n_added++;
    return MOEC_OK;
}

static moec_status load_added(ld *L, const cJSON *list)
{
    moec_tokenizer_t *t = L->t;
    if (!list)
        return MOEC_OK;
    if (!cJSON_IsArray(list))
        return FAIL(MOEC_ERR_FORMAT, "added_tokens", "must be a JSON array");
    int n = cJSON_GetArraySize(list);
    t->added = calloc((size_t)n + 1, sizeof *t->added);
    L->name_off = calloc((size_t)n + 2, sizeof *L->name_off);
    if (!t->added || !L->name_off)
        return OOM("added_tokens");
    int32_t next_id = (int32_t)t->vocab.n;
    int i = 0;
    for (const cJSON *a = list->child; a; a = a->next, i++) {
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%d]", i);
        MOEC_TRY(load_added_one(L, a, where, &next_id));
    }
    L->name_off[t->n_added] = (uint32_t)L->names.len;
    return MOEC_OK;
}

int32_t tok_token_id(const moec_tokenizer_t *t, const char *s, size_t n)
{
    int32_t id = tok_map_get(&t->added_ids, s, n);
    return id >= 0 ? id : tok_map_get(&t->vocab, s, n);
}

/* ---- the post-processor ----------------------------------------------------------------- */

/* ids of a TemplateProcessing's special token name, appended to out. */
static moec_status template_ids(ld *L, const cJSON *specials, const char *name, const char *where,
                                tok_ids *out)
{
    const cJSON *sp = specials ? member(specials, name) : NULL;
    const cJSON *ids = sp ? member(sp, "ids") : NULL;
    if (!cJSON_IsArray(ids))
        return FAIL(MOEC_ERR_FORMAT, where, "special token '%.80s' has no ids in special_tokens",
                    name);
    for (const cJSON *e = ids->child; e; e = e->next) {
        int32_t id;
        MOEC_TRY(get_id(L, e, where, &id));
        if (tok_ids_push(out, id))
            return OOM(where);
    }
    return MOEC_OK;
}

/* A TemplateProcessing's single-sequence template: the ids before and after $A. */
static moec_status load_template(ld *L, const cJSON *p, const char *where, tok_ids *pre,
                                 tok_ids *post)
{
    const cJSON *single = member(p, "single"), *specials = member(p, "special_tokens");
    int seen_a = 0;
    if (!cJSON_IsArray(single))
        return FAIL(MOEC_ERR_FORMAT, where, "a TemplateProcessing needs a single template");
    for (const cJSON *e = single->child; e; e = e->next) {
        const cJSON *seq = member(e, "Sequence"), *spec = member(e, "SpecialToken");
        const char *id = NULL;
        if (seq || spec)
            MOEC_TRY(get_str(L, seq ? seq : spec, where, "id", &id));
        if (!id)
            return FAIL(MOEC_ERR_FORMAT, where, "a template piece is {\"Sequence\": {\"id\": ...}} or "
                                                "{\"SpecialToken\": {\"id\": ...}}");
        if (spec) {
            MOEC_TRY(template_ids(L, specials, id, where, seen_a ? post : pre));
        } else if (strcmp(id, "A") != 0 || seen_a) {
            return FAIL(MOEC_ERR_UNSUPPORTED, where, "the single template must hold sequence A once "
                                                     "(and not B)");
        } else {
            seen_a = 1;
        }
    }
    if (!seen_a)
        return FAIL(MOEC_ERR_UNSUPPORTED, where, "the single template must hold sequence A once");
    return MOEC_OK;
}

/* Wraps the post-processor so far in pre ... post (processors run in order). */
static int wrap_ids(moec_tokenizer_t *t, const tok_ids *pre, const tok_ids *post)
{
    int32_t *p = malloc(((size_t)t->n_prefix + pre->n + 1) * sizeof *p);
    int32_t *s = realloc(t->suffix, ((size_t)t->n_suffix + post->n + 1) * sizeof *s);
    if (s)
        t->suffix = s;
    if (!p || !s) {
        free(p);
        return -1;
    }
    if (pre->n)
        memcpy(p, pre->v, pre->n * sizeof *p);
    if (t->n_prefix)
        memcpy(p + pre->n, t->prefix, (size_t)t->n_prefix * sizeof *p);
    if (post->n)
        memcpy(t->suffix + t->n_suffix, post->v, post->n * sizeof *p);
    free(t->prefix);
    t->prefix = p;
    t->n_prefix += (int)pre->n;
    t->n_suffix += (int)post->n;
    return 0;
}

static moec_status load_post(ld *L, const cJSON *p, const char *where, int depth)
{
    const char *type = NULL;
    if (!p)
        return MOEC_OK;
    MOEC_TRY(get_type(L, p, where, &type));
    if (strcmp(type, "ByteLevel") == 0) /* trims offsets only */
        return MOEC_OK;
    if (strcmp(type, "TemplateProcessing") == 0) {
        tok_ids pre = {0}, post = {0};
        moec_status st = load_template(L, p, where, &pre, &post);
        if (st == MOEC_OK && wrap_ids(L->t, &pre, &post))
            st = OOM(where);
        free(pre.v);
        free(post.v);
        return st;
    }
    if (strcmp(type, "Sequence") != 0)
        return FAIL(MOEC_ERR_UNSUPPORTED, where, "type '%s' is not supported (moec supports "
                                                 "ByteLevel, TemplateProcessing and Sequence)",
                    type);
    return load_sequence(L, p, "processors", where, depth, load_post);
}

static moec_status load_decoder(ld *L, const cJSON *d)
{
    const char *type = NULL;
    if (!d)
        return FAIL(MOEC_ERR_UNSUPPORTED, "decoder", "none: moec decodes byte-level BPE and needs "
                                                     "the ByteLevel decoder");
    MOEC_TRY(get_type(L, d, "decoder", &type));
    if (strcmp(type, "ByteLevel") != 0)
        return FAIL(MOEC_ERR_UNSUPPORTED, "decoder", "type '%s' is not supported (moec supports "
                                                     "ByteLevel)",
                    type);
    return MOEC_OK;
}

/* ---- tokenizer_config.json ------------------------------------------------------------------ */

/* bos_token / eos_token: a string, {"content": ...} or null. */
static moec_status config_token(ld *L, const cJSON *cfg, const char *key, const char **out)
{
    const cJSON *v = member(cfg, key);
    *out = NULL;
    if (v && cJSON_IsObject(v))
        MOEC_TRY(get_str(L, v, key, "content", out));
    else if (v && cJSON_IsString(v))
        *out = v->valuestring;
    else if (v)
        return FAIL(MOEC_ERR_FORMAT, key, "must be a string, {\"content\": ...} or null");
    return MOEC_OK;
}

static void mark_special(moec_tokenizer_t *t, int32_t id);

/* A special token of tokenizer_config.json (bos_token, pad_token, an entry
 * of additional_special_tokens, ...) must be an added token of
 * tokenizer.json: transformers adds any other as a special added token,
 * which changes where text is cut and what skip_special_tokens drops.
 * `mark`: the token is made special (mark_special). */
static moec_status config_special(ld *L, const char *key, const char *token, int mark)
{
    if (!token || !token[0])
        return MOEC_OK;
    int32_t id = tok_map_get(&L->t->added_ids, token, strlen(token));
    if (id >= 0) {
        if (mark)
            mark_special(L->t, id);
        return MOEC_OK;
    }
    if (tok_token_id(L->t, token, strlen(token)) < 0)
        return FAIL(MOEC_ERR_FORMAT, key, "'%.80s' is not a token of tokenizer.json", token);
    return FAIL(MOEC_ERR_UNSUPPORTED, key, "'%.80s' is in the vocab but not an added token of "
                                           "tokenizer.json (transformers would make it a special "
                                           "added token; moec does not)",
                token);
}

/* The special token a tokenizer class names when its config leaves the key
 * out (null is none), as transformers 5.17's classes do
 * (hf_tokenizer_probe.py): Qwen2Tokenizer's unk, eos and pad
 * <|endoftext|>; LlamaTokenizer's bos <s>, eos </s> and unk <unk>, which it
 * adds as new tokens where tokenizer.json lacks them (so moec refuses
 * them, as any special token tokenizer.json lacks). NULL where none. */
static const char *class_default(const char *cls, const char *key)
{
    static const struct {
        const char *cls, *key, *token;
    } defaults[] = {
        {"Qwen2Tokenizer", "unk_token", "<|endoftext|>"},
        {"Qwen2Tokenizer", "eos_token", "<|endoftext|>"},
        {"Qwen2Tokenizer", "pad_token", "<|endoftext|>"},
        {"LlamaTokenizer", "bos_token", "<s>"},
        {"LlamaTokenizer", "eos_token", "</s>"},
        {"LlamaTokenizer", "unk_token", "<unk>"},
    };
    size_t n = cls ? strlen(cls) : 0;
    if (n >= 4 && !strcmp(cls + n - 4, "Fast")) /* Qwen2TokenizerFast, LlamaTokenizerFast */
        n -= 4;
    for (size_t i = 0; i < sizeof defaults / sizeof *defaults; i++)
        if (strlen(defaults[i].cls) == n && !strncmp(cls, defaults[i].cls, n) &&
            !strcmp(key, defaults[i].key))
            return defaults[i].token;
    return NULL;
}

/* A config's special token `key` (config_token), or its class's default
 * where the key is left out; where gets the key, and names the default. */
static moec_status special_of(ld *L, const cJSON *cfg, const char *cls, const char *key,
                              const char **tok, char *where, size_t cap)
{
    const char *def = cJSON_GetObjectItemCaseSensitive(cfg, key) ? NULL : class_default(cls, key);
    snprintf(where, cap, def ? "%s (%.40s's default)" : "%s", key, cls);
    if (def) {
        *tok = def;
        return MOEC_OK;
    }
    return config_token(L, cfg, key, tok);
}

/* The added token of id `id`, NULL where none. */
static tok_added *added_of(moec_tokenizer_t *t, int32_t id)
{
    for (int k = 0; k < t->n_added; k++)
        if (t->added[k].id == id)
            return &t->added[k];
    return NULL;
}

/* An added token made special (by a config's special token, or
 * added_tokens_decoder): skip_special_tokens drops it, split_special_tokens
 * encodes it as text, as transformers' tokenizer has it. */
static void mark_special(moec_tokenizer_t *t, int32_t id)
{
    tok_added *a = added_of(t, id);
    if (a)
        a->special = 1;
    if (id >= 0 && id < t->n_ids)
        t->ids[id].special = 1;
}

/* The special tokens a config names one to a key (additional_special_tokens,
 * a list, aside). */
static const char *const special_keys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                           "pad_token", "cls_token", "mask_token"};
enum { N_SPECIAL_KEYS = sizeof special_keys / sizeof *special_keys };

/* Every special token of a config (tokenizer_config.json, or
 * special_tokens_map.json), checked as config_special and marked special:
 * transformers' decode drops them all with skip_special_tokens, whatever
 * tokenizer.json's own flag says. */
static moec_status config_specials(ld *L, const cJSON *cfg, const char *cls, int mark)
{
    const char *tok = NULL;
    char where[96];
    for (int k = 0; k < N_SPECIAL_KEYS; k++) {
        MOEC_TRY(special_of(L, cfg, cls, special_keys[k], &tok, where, sizeof where));
        MOEC_TRY(config_special(L, where, tok, mark));
    }
    const cJSON *extra = member(cfg, "additional_special_tokens");
    if (extra && !cJSON_IsArray(extra))
        return FAIL(MOEC_ERR_FORMAT, "additional_special_tokens", "must be a list");
    int i = 0;
    for (const cJSON *e = extra ? extra->child : NULL; e; e = e->next, i++) {
        snprintf(where, sizeof where, "additional_special_tokens[%d]", i);
        tok = NULL;
        if (cJSON_IsObject(e))
            MOEC_TRY(get_str(L, e, where, "content", &tok));
        else if (cJSON_IsString(e))
            tok = e->valuestring;
        else
            return FAIL(MOEC_ERR_FORMAT, where, "must be a string or {\"content\": ...}");
        MOEC_TRY(config_special(L, where, tok, mark));
    }
    return MOEC_OK;
}

static moec_status dup_str(ld *L, const char *where, const char *s, char **out)
{
    if (s && !(*out = strdup(s)))
        return OOM(where);
    return MOEC_OK;
}

/* chat_template: a string, or a list of {"name", "template"} of which
 * transformers renders the one named "default". */
static moec_status load_chat_template(ld *L, const cJSON *cfg)
{
    moec_tokenizer_t *t = L->t;
    const cJSON *ct = member(cfg, "chat_template");
    if (!ct)
        return MOEC_OK;
    if (cJSON_IsString(ct))
        return dup_str(L, "chat_template", ct->valuestring, &t->chat_template);
    if (!cJSON_IsArray(ct))
        return FAIL(MOEC_ERR_FORMAT, "chat_template", "must be a string or a list of {\"name\", \"template\"}");
    char names[256] = "";
    size_t used = 0;
    for (const cJSON *e = ct->child; e; e = e->next) {
        const char *name = NULL, *tmpl = NULL;
        if (!cJSON_IsObject(e))
            return FAIL(MOEC_ERR_FORMAT, "chat_template", "a list entry is not a {\"name\", \"template\"} object");
        MOEC_TRY(get_str(L, e, "chat_template", "name", &name));
        MOEC_TRY(get_str(L, e, "chat_template", "template", &tmpl));
        if (!name || !tmpl)
            return FAIL(MOEC_ERR_FORMAT, "chat_template", "a list entry lacks its name or template");
        if (!strcmp(name, "default"))
            return dup_str(L, "chat_template", tmpl, &t->chat_template);
        if (used + 1 < sizeof names)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s'%s'", used ? ", " : "", name);
    }
    char msg[512];
    snprintf(msg, sizeof msg, "%s: chat_template lists templates (%s) but none named 'default'", L->file, names);
    return dup_str(L, "chat_template", msg, &t->chat_template_missing);
}

/* tokenizer_config.json's added_tokens_decoder ({"id": {"content", flags}}):
 * transformers adds an entry tokenizer.json lacks and renumbers the added
 * tokens around an entry whose id differs, so both are refused. It adds the
 * others again with the entry's flags: special true makes the token special
 * (as a config's special token), and single_word, lstrip and rstrip replace
 * tokenizer.json's (transformers 5.17: lstrip true here takes the space
 * before the token). normalized, which moves a token to the other trie, and
 * special false for a special token (transformers still dropped it in
 * skip_special_tokens where its class names it) are refused where they
 * disagree with tokenizer.json. */
static moec_status load_added_decoder(ld *L, const cJSON *dec)
{
    moec_tokenizer_t *t = L->t;
    if (!dec)
        return MOEC_OK;
    if (!cJSON_IsObject(dec))
        return FAIL(MOEC_ERR_FORMAT, "added_tokens_decoder", "must be a JSON object");
    for (const cJSON *e = dec->child; e; e = e->next) {
        char where[96], *end = NULL;
        snprintf(where, sizeof where, "added_tokens_decoder[\"%.40s\"]", e->string);
        long id = strtol(e->string, &end, 10);
        const char *content = NULL;
        if (!e->string[0] || *end || id < 0 || id > TOK_MAX_ID)
            return FAIL(MOEC_ERR_FORMAT, where, "the key must be an id from 0 to %d", TOK_MAX_ID);
        if (!cJSON_IsObject(e))
            return FAIL(MOEC_ERR_FORMAT, where, "must be a JSON object");
        MOEC_TRY(get_str(L, e, where, "content", &content));
        if (!content)
            return FAIL(MOEC_ERR_FORMAT, where, "needs a content");
        int32_t have = tok_map_get(&t->added_ids, content, strlen(content));
        if (have < 0)
            return FAIL(MOEC_ERR_UNSUPPORTED, where, "'%.80s' is not an added token of "
                                                     "tokenizer.json (transformers would add it; "
                                                     "moec does not)",
                        content);
        if (have != id)
            return FAIL(MOEC_ERR_UNSUPPORTED, where, "'%.80s' is id %d in tokenizer.json "
                                                     "(transformers would renumber the added "
                                                     "tokens; moec does not)",
                        content, (int)have);
        tok_added *a = added_of(t, have);
        int special, normalized, single_word, lstrip, rstrip;
        MOEC_TRY(get_bool(L, e, where, "special", a->special, &special));
        MOEC_TRY(get_bool(L, e, where, "normalized", a->normalized, &normalized));
        MOEC_TRY(get_bool(L, e, where, "single_word", a->single_word, &single_word));
        MOEC_TRY(get_bool(L, e, where, "lstrip", a->lstrip, &lstrip));
        MOEC_TRY(get_bool(L, e, where, "rstrip", a->rstrip, &rstrip));
        const char *bad = special < a->special          ? "special"
                          : normalized != a->normalized ? "normalized"
                                                        : NULL;
        int here = special < a->special ? special : normalized;
        if (bad)
            return FAIL(MOEC_ERR_UNSUPPORTED, where, "%s %s, but %s in tokenizer.json", bad,
                        here ? "true" : "false", here ? "false" : "true");
        if (special)
            mark_special(t, have);
        a->single_word = (uint8_t)single_word;
        a->lstrip = (uint8_t)lstrip;
        a->rstrip = (uint8_t)rstrip;
    }
    return MOEC_OK;
}

static moec_status load_config(ld *L, const cJSON *cfg)
{
    moec_tokenizer_t *t = L->t;
    const char *cls = NULL, *bos = NULL, *eos = NULL;
    char where[96];
    MOEC_TRY(get_str(L, cfg, "", "tokenizer_class", &cls));
    MOEC_TRY(load_added_decoder(L, member(cfg, "added_tokens_decoder")));
    MOEC_TRY(config_specials(L, cfg, cls, 1));
    MOEC_TRY(special_of(L, cfg, cls, "bos_token", &bos, where, sizeof where));
    MOEC_TRY(special_of(L, cfg, cls, "eos_token", &eos, where, sizeof where));
    t->bos_id = bos ? tok_token_id(t, bos, strlen(bos)) : -1;
    t->eos_id = eos ? tok_token_id(t, eos, strlen(eos)) : -1;
    MOEC_TRY(dup_str(L, "bos_token", bos, &t->bos_token));
    MOEC_TRY(dup_str(L, "eos_token", eos, &t->eos_token));
    MOEC_TRY(get_bool(L, cfg, "", "split_special_tokens", 0, &t->split_special));
    /* transformers' decode would then take the space out of " ." " ," " n't"
     * " 's" ...; moec decodes (and streams) as tokenizers does, without it */
    int clean_up;
    MOEC_TRY(get_bool(L, cfg, "", "clean_up_tokenization_spaces", 0, &clean_up));
    if (clean_up)
        return FAIL(MOEC_ERR_UNSUPPORTED, "clean_up_tokenization_spaces",
                    "true is not supported (moec decodes as tokenizers does, without the "
                    "clean-up)");
    if (!t->chat_template) /* chat_template.jinja, read first, wins */
        MOEC_TRY(load_chat_template(L, cfg));
    /* add_bos_token / add_eos_token are not read: transformers 5.17's
     * LlamaTokenizerFast keeps tokenizer.json's post-processor whatever they
     * say (hf_tokenizer_probe.py: a BOS template adds the BOS with
     * add_bos_token false; ByteLevel or none adds none with it true) */
    return MOEC_OK;
}

/* ---- the id table ------------------------------------------------------------------------- */

/* What the ByteLevel decoder gives a token: its characters' bytes when all
 * are in the byte-level alphabet, else its own UTF-8. */
static int set_id(ld *L, int32_t id, const char *s, size_t n)
{
    moec_tokenizer_t *t = L->t;
    tok_idinfo *info = &t->ids[id];
    size_t off = t->dec.len;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int cut, k = tok_utf8_next((const unsigned char *)s + i, n - i, &cp, &cut);
        int b = k > 0 ? tok_char_byte(cp) : -1;
        if (b < 0) {
            t->dec.len = off;
            if (tok_buf_put(&t->dec, s, n))
                return -1;
            break;
        }
        char c = (char)b;
        if (tok_buf_put(&t->dec, &c, 1))
            return -1;
        i += (size_t)k;
    }
    info->off = (uint32_t)off;
    info->len = (uint32_t)(t->dec.len - off);
    info->present = 1;
    info->special = tok_map_get(&L->specials, s, n) >= 0;
    return 0;
}

static moec_status build_ids(ld *L)
{
    moec_tokenizer_t *t = L->t;
    int32_t max = -1;
    for (size_t k = 0; k < t->vocab.n; k++)
        max = t->vocab.e[k].val > max ? t->vocab.e[k].val : max;
    for (int k = 0; k < t->n_added; k++)
        max = t->added[k].id > max ? t->added[k].id : max;
    t->n_ids = max + 1;
    t->ids = calloc((size_t)t->n_ids + 1, sizeof *t->ids);
    if (!t->ids)
        return OOM("");
    for (size_t k = 0; k < t->vocab.n; k++) {
        const struct tok_map_entry *e = &t->vocab.e[k];
        if (set_id(L, e->val, t->vocab.keys.p + e->off, e->len))
            return OOM("model.vocab");
    }
    for (int k = 0; k < t->n_added; k++) { /* an added token's text wins over the vocab's */
        size_t off = L->name_off[k], end = L->name_off[k + 1];
        if (set_id(L, t->added[k].id, L->names.p + off, end - off))
            return OOM("added_tokens");
    }
    return MOEC_OK;
}

/* ---- the whole file ------------------------------------------------------------------------ */

static moec_status refuse_set(ld *L, const cJSON *root, const char *key)
{
    if (member(root, key))
        return FAIL(MOEC_ERR_UNSUPPORTED, key, "is not supported (it must be null)");
    return MOEC_OK;
}

static moec_status load_root(ld *L, const cJSON *root)
{
    /* tokenizers refuses any other ("Unknown tokenizer version") */
    const cJSON *version = member(root, "version");
    if (version && !cJSON_IsString(version))
        return FAIL(MOEC_ERR_FORMAT, "version", "must be a string");
    if (version && strcmp(version->valuestring, "1.0") != 0)
        return FAIL(MOEC_ERR_UNSUPPORTED, "version", "'%.40s' is not supported (tokenizers reads "
                                                     "\"1.0\")",
                    version->valuestring);
    MOEC_TRY(refuse_set(L, root, "truncation"));
    MOEC_TRY(refuse_set(L, root, "padding"));
    MOEC_TRY(load_model(L, member(root, "model")));
    MOEC_TRY(load_normalizer(L, member(root, "normalizer"), "normalizer", 0));
    MOEC_TRY(load_added(L, member(root, "added_tokens")));
    MOEC_TRY(load_pretok(L, member(root, "pre_tokenizer"), "pre_tokenizer", 0));
    MOEC_TRY(load_post(L, member(root, "post_processor"), "post_processor", 0));
    MOEC_TRY(load_decoder(L, member(root, "decoder")));
    return build_ids(L);
}

/* special_tokens_map.json: its special tokens (checked against
 * tokenizer.json first, so that an error names this file) replace
 * tokenizer_config.json's, as transformers reads the two. */
static moec_status merge_special_map(ld *L, cJSON *map, cJSON *cfg)
{
    MOEC_TRY(config_specials(L, map, NULL, 0));
    for (int k = 0; k <= N_SPECIAL_KEYS; k++) {
        const char *key = k < N_SPECIAL_KEYS ? special_keys[k] : "additional_special_tokens";
        cJSON *v = cJSON_DetachItemFromObjectCaseSensitive(map, key);
        if (!v)
            continue;
        int ok = cJSON_GetObjectItemCaseSensitive(cfg, key)
                     ? cJSON_ReplaceItemInObjectCaseSensitive(cfg, key, v)
                     : cJSON_AddItemToObject(cfg, key, v);
        if (!ok) {
            cJSON_Delete(v);
            return OOM(key);
        }
    }
    return MOEC_OK;
}

/* added_tokens.json ({"content": id}): an entry that is not tokenizer.json's
 * added token of that id is refused, as added_tokens_decoder's. */
static moec_status check_added_json(ld *L, const cJSON *added)
{
    for (const cJSON *e = added->child; e; e = e->next) {
        char where[96];
        snprintf(where, sizeof where, "\"%.60s\"", e->string);
        int32_t id, have = tok_map_get(&L->t->added_ids, e->string, strlen(e->string));
        MOEC_TRY(get_id(L, e, where, &id));
        if (have < 0)
            return FAIL(MOEC_ERR_UNSUPPORTED, where, "not an added token of tokenizer.json "
                                                     "(transformers would add it; moec does not)");
        if (have != id)
            return FAIL(MOEC_ERR_UNSUPPORTED, where, "id %d here, %d in tokenizer.json", (int)id,
                        (int)have);
    }
    return MOEC_OK;
}

static moec_status load_side_files(ld *L, const tok_file *config, const tok_file *map,
                                   const tok_file *added)
{
    cJSON *cfg = NULL, *m = NULL, *a = NULL;
    moec_status st = MOEC_OK;
    if (config->text) {
        L->file = config->path;
        st = parse_json(L, config->text, config->len, &cfg);
    } else if (map->text && !(cfg = cJSON_CreateObject())) {
        st = OOM("");
    }
    if (st == MOEC_OK && map->text) {
        L->file = map->path;
        st = parse_json(L, map->text, map->len, &m);
        if (st == MOEC_OK)
            st = merge_special_map(L, m, cfg);
    }
    if (st == MOEC_OK && cfg) {
        L->file = config->text ? config->path : map->path;
        st = load_config(L, cfg);
    }
    if (st == MOEC_OK && added->text) {
        L->file = added->path;
        st = parse_json(L, added->text, added->len, &a);
        if (st == MOEC_OK)
            st = check_added_json(L, a);
    }
    cJSON_Delete(cfg);
    cJSON_Delete(m);
    cJSON_Delete(a);
    return st;
}

moec_status tok_load(moec_tokenizer_t *t, const char *json, size_t len, const tok_file *config,
                     const tok_file *map, const tok_file *added)
{
    ld ctx = {.t = t, .file = t->path}, *L = &ctx;
    cJSON *root = NULL;
    moec_status st = parse_json(L, json, len, &root);
    if (st == MOEC_OK)
        st = load_root(L, root);
    if (st == MOEC_OK && !t->prefix && !(t->prefix = calloc(1, sizeof *t->prefix)))
        st = OOM("");
    if (st == MOEC_OK && !t->suffix && !(t->suffix = calloc(1, sizeof *t->suffix)))
        st = OOM("");
    if (st == MOEC_OK)
        st = load_side_files(L, config, map, added);
    cJSON_Delete(root);
    tok_buf_free(&L->names);
    free(L->name_off);
    tok_map_free(&L->specials);
    return st;
}
