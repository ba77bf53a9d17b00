/* tokenizer.c — the public tokenizer API: opening a model folder's
 * tokenizer.json, encoding text as Hugging Face tokenizers does (added
 * tokens, normalizer, pre-tokenizers, BPE, post-processor), decoding ids
 * through the byte-level decoder, and a streaming decoder that emits only
 * complete UTF-8. A tokenizer is read-only once open: any number of
 * threads may encode and decode with it at once. */
#include "runtime/tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"
#include "file.h"

/* ---- opening ------------------------------------------------------------------------ */

/* Reads a whole file of at most cap bytes; *text NULL when it does not
 * exist and `optional`. */
static moec_status read_file(const char *path, size_t cap, int optional, char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
     * writer, forever; it is refused below as not a regular file */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && optional && errno == ENOENT)
        return MOEC_OK;
    if (fd < 0)
        return MOEC_ERR(MOEC_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    moec_status st = MOEC_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        st = MOEC_ERR(MOEC_ERR_IO, "cannot read %s: not a regular file", path);
    else if ((size_t)sb.st_size > cap)
        st = MOEC_ERR(MOEC_ERR_CAPACITY, "%s: %lld bytes, more than the %zu moec reads", path,
                      (long long)sb.st_size, cap);
    else if (!(*text = malloc((size_t)sb.st_size + 1)))
        st = MOEC_ERR(MOEC_ERR_OOM, "out of memory reading %s", path);
    while (st == MOEC_OK && *len < (size_t)sb.st_size) {
        ssize_t k = read(fd, *text + *len, (size_t)sb.st_size - *len);
        if (k <= 0)
            st = MOEC_ERR(MOEC_ERR_IO, "cannot read %s: %s", path, k ? strerror(errno) : "truncated");
        else
            *len += (size_t)k;
    }
    close(fd);
    if (st != MOEC_OK) {
        free(*text);
        *text = NULL;
    }
    return st;
}

static char *join_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* The regexes every tokenizer needs, whatever its file says. */
static moec_status compile_fixed(moec_tokenizer_t *t)
{
    /* ByteLevel's use_regex pattern (GPT-2's) */
    static const char gpt2[] =
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
    /* Rust regex's \w, which decides single_word */
    static const char word[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]";
    char msg[256];
    t->gpt2_re = tok_regex_compile(gpt2, sizeof gpt2 - 1, 0, msg, sizeof msg);
    t->word_re = t->gpt2_re ? tok_regex_compile(word, sizeof word - 1, 0, msg, sizeof msg) : NULL;
    if (!t->word_re)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "a built-in tokenizer regex %s", msg);
    return MOEC_OK;
}

moec_status tok_new(const char *path, moec_tokenizer_t **out)
{
    moec_tokenizer_t *t = calloc(1, sizeof *t);
    *out = NULL;
    if (!t)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory opening the tokenizer %s", path);
    t->unk_id = t->bos_id = t->eos_id = -1;
    tok_trie_init(&t->raw_trie);
    tok_trie_init(&t->norm_trie);
    moec_status st = (t->path = strdup(path))
                         ? compile_fixed(t)
                         : MOEC_ERR(MOEC_ERR_OOM, "out of memory opening the tokenizer %s", path);
    if (st != MOEC_OK) {
        moec_tokenizer_free(t);
        return st;
    }
    *out = t;
    return MOEC_OK;
}

moec_status moec_tokenizer_open(const char *model_dir, moec_tokenizer_t **out)
{
    if (!model_dir || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_tokenizer_open: NULL argument");
    *out = NULL;
    /* the files transformers reads beside tokenizer.json, each optional */
    static const char *side_names[] = {"tokenizer_config.json", "special_tokens_map.json",
                                       "added_tokens.json"};
    enum { N_SIDE = sizeof side_names / sizeof *side_names };
    tok_file side[N_SIDE] = {{0}};
    moec_tokenizer_t *t = NULL;
    char *json = NULL, *jinja_path = join_path(model_dir, "chat_template.jinja");
    char *json_path = join_path(model_dir, "tokenizer.json");
    int paths = jinja_path && json_path;
    for (int i = 0; i < N_SIDE; i++)
        paths = paths && (side[i].path = join_path(model_dir, side_names[i]));
    size_t len = 0, jinja_len = 0;
    moec_status st = paths ? tok_new(json_path, &t)
                           : MOEC_ERR(MOEC_ERR_OOM, "out of memory opening the tokenizer of %s",
                                      model_dir);
    free(json_path);
    if (st == MOEC_OK)
        st = read_file(t->path, TOK_MAX_FILE_BYTES, 0, &json, &len);
    for (int i = 0; i < N_SIDE && st == MOEC_OK; i++)
        st = read_file(side[i].path, TOK_MAX_FILE_BYTES, 1, &side[i].text, &side[i].len);
    if (st == MOEC_OK) /* transformers prefers it to tokenizer_config.json's chat_template */
        st = moec_file_read_optional(jinja_path, TOK_MAX_FILE_BYTES, &t->chat_template, &jinja_len);
    if (st == MOEC_OK && t->chat_template && strlen(t->chat_template) != jinja_len)
        st = MOEC_ERR(MOEC_ERR_FORMAT, "%s: a NUL byte in the template", jinja_path);
    if (st == MOEC_OK)
        st = tok_load(t, json, len, &side[0], &side[1], &side[2]);
    free(jinja_path);
    free(json);
    for (int i = 0; i < N_SIDE; i++) {
        free(side[i].text);
        free(side[i].path);
    }
    if (st != MOEC_OK) {
        moec_tokenizer_free(t);
        return st;
    }
    *out = t;
    return MOEC_OK;
}

void moec_tokenizer_free(moec_tokenizer_t *t)
{
    if (!t)
        return;
    free(t->path);
    tok_map_free(&t->vocab);
    tok_merges_free(&t->merges);
    for (int i = 0; i < t->n_steps; i++)
        pcre2_code_free(t->steps[i].re);
    pcre2_code_free(t->gpt2_re);
    pcre2_code_free(t->word_re);
    free(t->added);
    tok_trie_free(&t->raw_trie);
    tok_trie_free(&t->norm_trie);
    tok_map_free(&t->added_ids);
    free(t->prefix);
    free(t->suffix);
    free(t->ids);
    tok_buf_free(&t->dec);
    free(t->bos_token);
    free(t->eos_token);
    free(t->chat_template);
    free(t->chat_template_missing);
    free(t);
}

int32_t moec_tokenizer_token_id(const moec_tokenizer_t *t, const char *token)
{
    return t && token ? tok_token_id(t, token, strlen(token)) : -1;
}

int32_t moec_tokenizer_bos_id(const moec_tokenizer_t *t) { return t ? t->bos_id : -1; }
int32_t moec_tokenizer_eos_id(const moec_tokenizer_t *t) { return t ? t->eos_id : -1; }
int32_t moec_tokenizer_id_count(const moec_tokenizer_t *t) { return t ? t->n_ids : 0; }

/* ---- encoding -------------------------------------------------------------------------- */

/* A piece of the text being encoded: bytes of work.text, or an added token. */
typedef struct tok_span {
    size_t off, len;
    int32_t id; /* >= 0: an added token, final; -1: text still to tokenize */
} tok_span;

typedef struct tok_spans {
    tok_span *v;
    size_t n, cap;
} tok_spans;

/* Everything one encode call allocates. Steps append the text they make to
 * `text` and read the pieces of `in` into `out`. */
typedef struct tok_work {
    const moec_tokenizer_t *t;
    tok_buf text;
    tok_spans in, out;
    tok_ranges events, pieces;
    tok_regex_run rx;
    tok_bpe_scratch bpe;
    tok_ids ids;
} tok_work;

static moec_status push_span(tok_work *w, size_t off, size_t len, int32_t id)
{
    tok_spans *s = &w->out;
    if (len == 0) /* tokenizers drops empty pieces after every split */
        return MOEC_OK;
    tok_span *v = tok_grow(s->v, s->n, &s->cap, sizeof *v);
    if (!v)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory encoding");
    s->v = v;
    s->v[s->n++] = (tok_span){off, len, id};
    return MOEC_OK;
}

/* out becomes the input of the next step. */
static void next_step(tok_work *w)
{
    tok_spans x = w->in;
    w->in = w->out;
    w->out = x;
    w->out.n = 0;
}

static int word_at(tok_work *w, const char *s, size_t n, size_t at)
{
    return tok_regex_match(&w->rx, w->t->word_re, s, n, at, PCRE2_ANCHORED) >= 0;
}

/* single_word: no word character right before start or right after stop. */
static int single_word_ok(tok_work *w, const char *s, size_t n, size_t start, size_t stop)
{
    size_t prev = start;
    while (prev > 0 && ((unsigned char)s[--prev] & 0xc0) == 0x80)
        ;
    return (start == 0 || !word_at(w, s, n, prev)) && (stop == n || !word_at(w, s, n, stop));
}

/* Where the run of whitespace that ends at s[end] starts. */
static size_t white_run_start(const char *s, size_t end)
{
    while (end > 0) {
        size_t p = end;
        while (p > 0 && ((unsigned char)s[--p] & 0xc0) == 0x80)
            ;
        uint32_t cp;
        int cut;
        if (tok_utf8_next((const unsigned char *)s + p, end - p, &cp, &cut) <= 0 ||
            !tok_is_white_space(cp))
            break;
        end = p;
    }
    return end;
}

/* The length of the run of whitespace at the start of s[0..n). */
static size_t white_run_len(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int cut, k = tok_utf8_next((const unsigned char *)s + i, n - i, &cp, &cut);
        if (k <= 0 || !tok_is_white_space(cp))
            break;
        i += (size_t)k;
    }
    return i;
}

/* Cuts the added tokens of `trie` out of one piece, as tokenizers'
 * AddedVocabulary::find_matches: leftmost-longest matches, single_word
 * matches that touch a word dropped, lstrip / rstrip taking the whitespace
 * beside the token into it. */
static moec_status split_added(tok_work *w, const tok_trie *trie, size_t off, size_t len)
{
    const moec_tokenizer_t *t = w->t;
    const char *s = w->text.p + off;
    size_t done = 0; /* the end of the last token taken */
    for (size_t i = 0; i < len;) {
        size_t mlen = 0;
        int32_t k = tok_trie_longest(trie, s + i, len - i, &mlen);
        if (k < 0) {
            i++;
            continue;
        }
        const tok_added *a = &t->added[k];
        size_t start = i, stop = i + mlen;
        i = stop;
        /* split_special_tokens: the match is passed over, as tokenizers'
         * find_matches does, so a shorter token inside it is not taken */
        if (t->split_special && a->special)
            continue;
        if (a->single_word && !single_word_ok(w, s, len, start, stop))
            continue;
        if (a->lstrip) {
            size_t ws = white_run_start(s, start);
            start = ws > done ? ws : done;
        }
        if (a->rstrip)
            stop += white_run_len(s + stop, len - stop);
        if (done < start)
            MOEC_TRY(push_span(w, off + done, start - done, -1));
        MOEC_TRY(push_span(w, off + start, stop - start, a->id));
        done = stop;
    }
    return done < len ? push_span(w, off + done, len - done, -1) : MOEC_OK;
}

static moec_status step_added(tok_work *w, const tok_trie *trie)
{
    for (size_t k = 0; k < w->in.n; k++) {
        tok_span sp = w->in.v[k];
        if (sp.id >= 0 || trie->n == 0)
            MOEC_TRY(push_span(w, sp.off, sp.len, sp.id));
        else
            MOEC_TRY(split_added(w, trie, sp.off, sp.len));
    }
    next_step(w);
    return MOEC_OK;
}

static moec_status step_normalize(tok_work *w)
{
    for (size_t k = 0; k < w->in.n && w->t->nfc; k++) {
        tok_span *sp = &w->in.v[k];
        size_t at = w->text.len;
        int same;
        if (sp->id >= 0)
            continue;
        MOEC_TRY(tok_nfc(w->text.p + sp->off, sp->len, &w->text, &same));
        if (!same) {
            sp->off = at;
            sp->len = w->text.len - at;
        }
    }
    return MOEC_OK;
}

/* ByteLevel: a space in front (add_prefix_space), GPT-2's split (use_regex),
 * then every byte written as its character. */
static moec_status step_byte_level(tok_work *w, const tok_step *st, tok_span sp)
{
    if (st->add_prefix_space && w->text.p[sp.off] != ' ') {
        if (tok_buf_reserve(&w->text, sp.len + 1))
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory encoding");
        char *dst = w->text.p + w->text.len;
        dst[0] = ' ';
        memcpy(dst + 1, w->text.p + sp.off, sp.len);
        sp.off = w->text.len;
        w->text.len += ++sp.len;
    }
    w->pieces.n = 0;
    if (st->use_regex) {
        tok_step gpt2 = {TOK_STEP_SPLIT, w->t->gpt2_re, TOK_ISOLATED, 0, 0, 0};
        MOEC_TRY(tok_split(w->t, &gpt2, w->text.p + sp.off, sp.len, &w->rx, &w->events, &w->pieces));
    } else if (tok_ranges_push(&w->pieces, 0, sp.len, 0)) {
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory encoding");
    }
    for (size_t k = 0; k < w->pieces.n; k++) {
        const tok_range *r = &w->pieces.v[k];
        if (tok_buf_reserve(&w->text, 2 * (r->end - r->start)))
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory encoding");
        const unsigned char *src = (const unsigned char *)w->text.p + sp.off + r->start;
        size_t at = w->text.len;
        for (size_t i = 0; i < r->end - r->start; i++)
            w->text.len += (size_t)tok_utf8_put(tok_byte_char(src[i]), w->text.p + w->text.len);
        MOEC_TRY(push_span(w, at, w->text.len - at, -1));
    }
    return MOEC_OK;
}

static moec_status step_pretok(tok_work *w, const tok_step *st)
{
    for (size_t k = 0; k < w->in.n; k++) {
        tok_span sp = w->in.v[k];
        if (sp.id >= 0) {
            MOEC_TRY(push_span(w, sp.off, sp.len, sp.id));
        } else if (st->kind == TOK_STEP_BYTE_LEVEL) {
            MOEC_TRY(step_byte_level(w, st, sp));
        } else {
            MOEC_TRY(tok_split(w->t, st, w->text.p + sp.off, sp.len, &w->rx, &w->events, &w->pieces));
            for (size_t i = 0; i < w->pieces.n; i++) {
                const tok_range *r = &w->pieces.v[i];
                MOEC_TRY(push_span(w, sp.off + r->start, r->end - r->start, -1));
            }
        }
    }
    next_step(w);
    return MOEC_OK;
}

static moec_status push_ids(tok_work *w, const int32_t *ids, int n)
{
    for (int i = 0; i < n; i++)
        if (tok_ids_push(&w->ids, ids[i]))
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory encoding");
    return MOEC_OK;
}

static moec_status encode(tok_work *w, const char *text, size_t len, int add_special)
{
    const moec_tokenizer_t *t = w->t;
    size_t used;
    if (tok_regex_run_init(&w->rx, len) ||
        tok_utf8_lossy((const unsigned char *)text, len, 1, &w->text, &used) ||
        tok_buf_reserve(&w->text, 0))
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory encoding %zu bytes", len);
    MOEC_TRY(push_span(w, 0, w->text.len, -1));
    next_step(w);
    MOEC_TRY(step_added(w, &t->raw_trie));
    MOEC_TRY(step_normalize(w));
    MOEC_TRY(step_added(w, &t->norm_trie));
    for (int i = 0; i < t->n_steps; i++)
        MOEC_TRY(step_pretok(w, &t->steps[i]));
    if (add_special)
        MOEC_TRY(push_ids(w, t->prefix, t->n_prefix));
    for (size_t k = 0; k < w->in.n; k++) {
        const tok_span *sp = &w->in.v[k];
        if (sp->id >= 0)
            MOEC_TRY(push_ids(w, &sp->id, 1));
        else
            MOEC_TRY(tok_bpe(t, w->text.p + sp->off, sp->len, &w->bpe, &w->ids));
    }
    if (add_special)
        MOEC_TRY(push_ids(w, t->suffix, t->n_suffix));
    return MOEC_OK;
}

moec_status moec_tokenizer_encode(const moec_tokenizer_t *t, const char *text, size_t len,
                                  int add_special_tokens, int32_t **ids, int *n_ids)
{
    if (!t || (!text && len) || !ids || !n_ids)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_tokenizer_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    if (len > TOK_MAX_TEXT_BYTES)
        return MOEC_ERR(MOEC_ERR_CAPACITY, "a text of %zu bytes is more than the %zu one encode "
                                           "call takes",
                        len, TOK_MAX_TEXT_BYTES);
    tok_work w = {.t = t};
    moec_status st = encode(&w, text ? text : "", len, add_special_tokens);
    if (st == MOEC_OK && tok_ids_push(&w.ids, 0)) /* never a NULL result, even when empty */
        st = MOEC_ERR(MOEC_ERR_OOM, "out of memory encoding");
    tok_buf_free(&w.text);
    free(w.in.v);
    free(w.out.v);
    free(w.events.v);
    free(w.pieces.v);
    tok_regex_run_free(&w.rx);
    tok_bpe_scratch_free(&w.bpe);
    if (st != MOEC_OK) {
        free(w.ids.v);
        return st;
    }
    *ids = w.ids.v;
    *n_ids = (int)w.ids.n - 1;
    return MOEC_OK;
}

/* ---- decoding ---------------------------------------------------------------------------- */

/* Appends the bytes of one id (none for an id with no token, or a special
 * one when skipping them, as tokenizers' decode does). */
static moec_status id_bytes(const moec_tokenizer_t *t, int32_t id, int skip_special, tok_buf *out)
{
    if (id < 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "cannot decode the negative id %d", (int)id);
    if (id >= t->n_ids || !t->ids[id].present || (skip_special && t->ids[id].special))
        return MOEC_OK;
    if (tok_buf_put(out, t->dec.p + t->ids[id].off, t->ids[id].len))
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory decoding");
    return MOEC_OK;
}

moec_status moec_tokenizer_decode(const moec_tokenizer_t *t, const int32_t *ids, int n_ids,
                                  int skip_special_tokens, char **text, size_t *len)
{
    if (!t || (!ids && n_ids) || n_ids < 0 || !text || !len)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_tokenizer_decode: NULL argument or negative count");
    *text = NULL;
    *len = 0;
    tok_buf raw = {0}, out = {0};
    moec_status st = MOEC_OK;
    for (int i = 0; i < n_ids && st == MOEC_OK; i++)
        st = id_bytes(t, ids[i], skip_special_tokens, &raw);
    size_t used;
    if (st == MOEC_OK &&
        (tok_utf8_lossy((const unsigned char *)raw.p, raw.len, 1, &out, &used) ||
         tok_buf_put(&out, "", 0)))
        st = MOEC_ERR(MOEC_ERR_OOM, "out of memory decoding");
    tok_buf_free(&raw);
    if (st != MOEC_OK) {
        tok_buf_free(&out);
        return st;
    }
    *text = out.p;
    *len = out.len;
    return MOEC_OK;
}

/* ---- streaming ------------------------------------------------------------------------------ */

struct moec_detokenizer {
    const moec_tokenizer_t *t;
    int skip_special;
    tok_buf in;  /* the bytes not yet emitted: at most a cut-off UTF-8 beginning */
    tok_buf out; /* the text of the last call */
};

moec_status moec_detokenizer_init(const moec_tokenizer_t *t, int skip_special_tokens,
                                  moec_detokenizer_t **out)
{
    if (!t || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_detokenizer_init: NULL argument");
    *out = calloc(1, sizeof **out);
    if (!*out)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory making a detokenizer");
    (*out)->t = t;
    (*out)->skip_special = skip_special_tokens;
    return MOEC_OK;
}

/* Emits what of d->in is complete (all of it when `final`). */
static moec_status detok_emit(moec_detokenizer_t *d, int final, const char **text, size_t *len)
{
    size_t used;
    d->out.len = 0;
    if (tok_utf8_lossy((const unsigned char *)d->in.p, d->in.len, final, &d->out, &used) ||
        tok_buf_put(&d->out, "", 0))
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory decoding");
    if (used) {
        memmove(d->in.p, d->in.p + used, d->in.len - used);
        d->in.len -= used;
    }
    *text = d->out.p;
    *len = d->out.len;
    return MOEC_OK;
}

moec_status moec_detokenizer_push(moec_detokenizer_t *d, int32_t id, const char **text, size_t *len)
{
    return moec_detokenizer_push_offset(d, id, text, len, NULL);
}

moec_status moec_detokenizer_push_offset(moec_detokenizer_t *d, int32_t id, const char **text,
                                         size_t *len, int *before)
{
    if (!d || !text || !len)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_detokenizer_push: NULL argument");
    *text = "";
    *len = 0;
    if (before)
        *before = 0;
    size_t held = d->in.len; /* a valid beginning cut off (detok_emit kept no more) */
    MOEC_TRY(id_bytes(d->t, id, d->skip_special, &d->in));
    if (before && held && d->in.len > held) {
        /* the held bytes are a U+FFFD of their own when this id's first
         * byte does not continue them: their maximal subpart ends there */
        uint32_t cp;
        int cut, k = tok_utf8_next((const unsigned char *)d->in.p, held + 1, &cp, &cut);
        *before = k < 0 && !cut && (size_t)-k == held;
    }
    return detok_emit(d, 0, text, len);
}

moec_status moec_detokenizer_finish(moec_detokenizer_t *d, const char **text, size_t *len)
{
    if (!d || !text || !len)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_detokenizer_finish: NULL argument");
    return detok_emit(d, 1, text, len);
}

void moec_detokenizer_free(moec_detokenizer_t *d)
{
    if (!d)
        return;
    tok_buf_free(&d->in);
    tok_buf_free(&d->out);
    free(d);
}
