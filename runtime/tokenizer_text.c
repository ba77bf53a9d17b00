/* tokenizer_text.c — the text-level pieces of the tokenizer: UTF-8 with the
 * standard replacement of invalid bytes, GPT-2's byte-level alphabet, the
 * Split pre-tokenizer's regexes (PCRE2, made to match as Hugging Face
 * tokenizers' Oniguruma does) and behaviours, and NFC (utf8proc). */
#include "runtime/tokenizer.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "err.h"

/* ---- buffers ------------------------------------------------------------------ */

void *tok_grow(void *p, size_t n, size_t *cap, size_t elem)
{
    if (n < *cap)
        return p;
    size_t c = *cap ? 2 * *cap : 64;
    void *q = c <= SIZE_MAX / elem / 2 ? realloc(p, c * elem) : NULL;
    if (q)
        *cap = c;
    return q;
}

int tok_buf_reserve(tok_buf *b, size_t extra)
{
    if (b->cap - b->len > extra)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len <= extra) {
        if (cap > SIZE_MAX / 2)
            return -1;
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int tok_buf_put(tok_buf *b, const void *s, size_t n)
{
    if (tok_buf_reserve(b, n))
        return -1;
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

void tok_buf_free(tok_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

int tok_ranges_push(tok_ranges *r, size_t start, size_t end, int flag)
{
    tok_range *v = tok_grow(r->v, r->n, &r->cap, sizeof *v);
    if (!v)
        return -1;
    r->v = v;
    r->v[r->n++] = (tok_range){start, end, flag};
    return 0;
}

/* ---- UTF-8 ---------------------------------------------------------------------- */

int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp, int *cut)
{
    *cut = 0;
    unsigned b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    /* Unicode's table of well-formed sequences: the second byte's range
     * depends on the first, the others are 80..BF. */
    int need;
    unsigned lo = 0x80, hi = 0xbf;
    uint32_t c;
    if (b >= 0xc2 && b <= 0xdf) {
        need = 2;
        c = b & 0x1f;
    } else if (b >= 0xe0 && b <= 0xef) {
        need = 3;
        c = b & 0x0f;
        if (b == 0xe0)
            lo = 0xa0;
        else if (b == 0xed)
            hi = 0x9f; /* no surrogates */
    } else if (b >= 0xf0 && b <= 0xf4) {
        need = 4;
        c = b & 0x07;
        if (b == 0xf0)
            lo = 0x90;
        else if (b == 0xf4)
            hi = 0x8f; /* nothing above U+10FFFF */
    } else {
        return -1;
    }
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) {
            *cut = 1;
            return -i;
        }
        unsigned x = s[i];
        if (x < lo || x > hi)
            return -i;
        c = c << 6 | (x & 0x3f);
        lo = 0x80;
        hi = 0xbf;
    }
    *cp = c;
    return need;
}

int tok_utf8_lossy(const unsigned char *s, size_t n, int final, tok_buf *out, size_t *used)
{
    static const char fffd[3] = {(char)0xef, (char)0xbf, (char)0xbd};
    size_t i = 0, run = 0; /* s[run..i) is valid and not yet copied */
    *used = 0;
    if (n == 0)
        return 0;
    while (i < n) {
        uint32_t cp;
        int cut;
        int k = tok_utf8_next(s + i, n - i, &cp, &cut);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        if (tok_buf_put(out, s + run, i - run))
            return -1;
        if (cut && !final)
            break;
        if (tok_buf_put(out, fffd, sizeof fffd))
            return -1;
        i += (size_t)-k;
        run = i;
    }
    if (i >= n && tok_buf_put(out, s + run, n - run))
        return -1;
    *used = i < n ? i : n;
    return 0;
}

int tok_utf8_put(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

int tok_is_white_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

/* ---- the byte-level alphabet ------------------------------------------------------ */

/* GPT-2's table: the printable bytes stand for themselves; the other 68
 * (00..20, 7F..A0, AD) for U+0100 onwards, in byte order. */
static int byte_is_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

uint32_t tok_byte_char(unsigned b)
{
    if (byte_is_printable(b))
        return b;
    if (b <= 0x20)
        return 0x100 + b;
    if (b >= 0x7f && b <= 0xa0)
        return 0x100 + 33 + (b - 0x7f);
    return 0x100 + 67; /* 0xad */
}

int tok_char_byte(uint32_t cp)
{
    if (cp < 0x100)
        return byte_is_printable(cp) ? (int)cp : -1;
    if (cp > 0x143)
        return -1;
    unsigned k = cp - 0x100;
    if (k <= 32)
        return (int)k;
    if (k <= 66)
        return (int)(0x7f + k - 33);
    return 0xad;
}

/* ---- regexes ---------------------------------------------------------------------- */

static int put_str(tok_buf *out, const char *s) { return tok_buf_put(out, s, strlen(s)); }

static int is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* One escape \e of the pattern (outside or inside a class) as PCRE2 must
 * read it to match what Oniguruma does; i indexes the escaped character
 * and moves past what was consumed. 0, or -1 with the reason in msg. */
static int rx_escape(const char *p, size_t n, size_t *i, int in_class, tok_buf *out, char *msg,
                     size_t cap)
{
    char e = p[*i];
    int r = 0;
    switch (e) {
    case 's': /* Oniguruma's \s is White_Space; PCRE2's adds U+180E */
        return put_str(out, "\\p{White_Space}");
    case 'S':
        return put_str(out, "\\P{White_Space}");
    case 'w': /* Oniguruma's \w has marks and connectors; PCRE2's has not */
        return put_str(out, in_class ? "\\p{L}\\p{M}\\p{N}\\p{Pc}" : "[\\p{L}\\p{M}\\p{N}\\p{Pc}]");
    case 'h': /* Oniguruma's \h is a hex digit; PCRE2's a horizontal space */
        return put_str(out, in_class ? "0-9a-fA-F" : "[0-9a-fA-F]");
    case 'W':
    case 'H':
        if (in_class) {
            snprintf(msg, cap, "\\%c inside a character class is not supported", e);
            return -1;
        }
        return put_str(out, e == 'W' ? "[^\\p{L}\\p{M}\\p{N}\\p{Pc}]" : "[^0-9a-fA-F]");
    case 'v': /* Oniguruma's \v is the vertical tab; PCRE2's all vertical space */
        return put_str(out, "\\x{0b}");
    case 'u':
        if (*i + 4 < n && is_hex(p[*i + 1]) && is_hex(p[*i + 2]) && is_hex(p[*i + 3]) &&
            is_hex(p[*i + 4])) {
            r = put_str(out, "\\x{") || tok_buf_put(out, p + *i + 1, 4) || put_str(out, "}");
            *i += 4;
            return r ? -1 : 0;
        }
        snprintf(msg, cap, "\\u must be followed by four hex digits");
        return -1;
    case 'b':
    case 'B':
        if (in_class && e == 'b')
            return put_str(out, "\\x{08}");
        snprintf(msg, cap, "\\%c (a word boundary: Oniguruma's words differ) is not supported", e);
        return -1;
    case 'Q':
    case 'V':
        snprintf(msg, cap, "\\%c is not supported", e);
        return -1;
    default:
        return tok_buf_put(out, p + *i - 1, 2);
    }
}

/* An inline option group "(?flags:" or "(?flags)" at p[i] == '(' keeps only
 * flags both engines read the same (i, x); 0, or -1 with msg. */
static int rx_options(const char *p, size_t n, size_t i, char *msg, size_t cap)
{
    for (size_t j = i + 2; j < n && p[j] != ':' && p[j] != ')'; j++) {
        char f = p[j];
        if (f == '-' || f == 'i' || f == 'x')
            continue;
        if ((f >= 'a' && f <= 'z') || (f >= 'A' && f <= 'Z')) {
            snprintf(msg, cap, "the inline option (?%c) is not supported", f);
            return -1;
        }
        break; /* a group such as (?: (?= (?<name> */
    }
    return 0;
}

/* Rewrites an Oniguruma (Ruby syntax) pattern for PCRE2 into out. */
static int rx_translate(const char *p, size_t n, tok_buf *out, char *msg, size_t cap)
{
    int in_class = 0;
    size_t class_first = 0; /* a ']' here is a literal, not the end */
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        int r;
        if (c == '\\') {
            if (++i == n) {
                snprintf(msg, cap, "the pattern ends with a backslash");
                return -1;
            }
            r = rx_escape(p, n, &i, in_class, out, msg, cap);
        } else if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') {
            const char *end = memchr(p + i, ']', n - i); /* [:alpha:] */
            size_t k = end ? (size_t)(end - p) + 1 : n;
            r = tok_buf_put(out, p + i, k - i);
            i = k - 1;
        } else if (in_class && (c == '[' || (c == '&' && i + 1 < n && p[i + 1] == '&'))) {
            snprintf(msg, cap, "Oniguruma's nested classes and class intersection (&&) are not "
                               "supported");
            return -1;
        } else if (in_class) {
            if (c == ']' && i != class_first)
                in_class = 0;
            r = tok_buf_put(out, &c, 1);
        } else if (c == '[') {
            in_class = 1;
            class_first = i + 1 < n && p[i + 1] == '^' ? i + 2 : i + 1;
            r = tok_buf_put(out, p + i, class_first - i);
            i = class_first - 1;
        } else {
            if (c == '(' && i + 1 < n && p[i + 1] == '?' && rx_options(p, n, i, msg, cap))
                return -1;
            r = tok_buf_put(out, &c, 1);
        }
        if (r) {
            if (!msg[0])
                snprintf(msg, cap, "out of memory");
            return -1;
        }
    }
    return 0;
}

pcre2_code *tok_regex_compile(const char *pat, size_t len, int literal, char *msg, size_t cap)
{
    tok_buf src = {0};
    msg[0] = '\0';
    if (literal) {
        if (tok_buf_put(&src, pat, len)) {
            snprintf(msg, cap, "out of memory");
            return NULL;
        }
    } else if (rx_translate(pat, len, &src, msg, cap)) {
        tok_buf_free(&src);
        return NULL;
    } else if (tok_buf_put(&src, "", 0)) { /* an empty pattern still needs a buffer */
        snprintf(msg, cap, "out of memory");
        return NULL;
    }
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) {
        tok_buf_free(&src);
        snprintf(msg, cap, "out of memory");
        return NULL;
    }
    /* Ruby syntax as tokenizers compiles it: `^` and `$` work at line ends,
     * `.` takes anything but a newline, and lines end at LF only. */
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    uint32_t opt = literal ? PCRE2_LITERAL | PCRE2_UTF
                           : PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE |
                                 PCRE2_NEVER_BACKSLASH_C | PCRE2_AUTO_CALLOUT;
    int err;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)src.p, src.len, opt, &err, &at, cc);
    pcre2_compile_context_free(cc);
    tok_buf_free(&src);
    if (!re) {
        PCRE2_UCHAR why[160];
        pcre2_get_error_message(err, why, sizeof why);
        snprintf(msg, cap, "does not compile: %s", (const char *)why);
        return NULL;
    }
    /* No JIT: encoding time goes to BPE, not the regexes (measured), JIT
     * code trips valgrind, and the step callouts would slow it anyway. */
    return re;
}

/* Every pattern item visited costs one step of the encode call's budget. */
static int rx_step(pcre2_callout_block *b, void *data)
{
    (void)b;
    long long *left = data;
    return --*left < 0 ? PCRE2_ERROR_CALLOUT : 0;
}

int tok_regex_run_init(tok_regex_run *run, size_t text_len)
{
    run->budget = TOK_REGEX_STEPS_BASE + TOK_REGEX_STEPS_PER_BYTE * (long long)text_len;
    run->left = run->budget;
    run->md = pcre2_match_data_create(1, NULL);
    run->mc = pcre2_match_context_create(NULL);
    if (!run->md || !run->mc)
        return -1;
    pcre2_set_match_limit(run->mc, TOK_REGEX_MATCH_LIMIT);
    pcre2_set_heap_limit(run->mc, TOK_REGEX_HEAP_KIB);
    pcre2_set_callout(run->mc, rx_step, &run->left);
    return 0;
}

void tok_regex_run_free(tok_regex_run *run)
{
    pcre2_match_data_free(run->md);
    pcre2_match_context_free(run->mc);
}

int tok_regex_match(tok_regex_run *run, const pcre2_code *re, const char *s, size_t n, size_t from,
                    uint32_t options)
{
    return pcre2_match(re, (PCRE2_SPTR)s, n, from, options | PCRE2_NO_UTF_CHECK, run->md, run->mc);
}

static size_t char_len(const char *s, size_t i, size_t n)
{
    size_t k = 1;
    while (i + k < n && ((unsigned char)s[i + k] & 0xc0) == 0x80)
        k++;
    return k;
}

/* Every match and every gap between them, in order, with flag 1 on matches. */
static moec_status split_events(const moec_tokenizer_t *t, const pcre2_code *re, const char *s,
                                size_t n, tok_regex_run *run, tok_ranges *ev)
{
    size_t prev = 0, last_end = 0, last_match_end = 0;
    int have_last = 0;
    ev->n = 0;
    while (last_end <= n) {
        int rc = tok_regex_match(run, re, s, n, last_end, 0);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc == PCRE2_ERROR_CALLOUT)
            return MOEC_ERR(MOEC_ERR_CAPACITY, "%s: the pre-tokenizer regexes took more than the "
                                               "%lld steps this text allows (one backtracks too "
                                               "much on a %zu-byte piece)",
                            t->path, run->budget, n);
        if (rc < 0) {
            PCRE2_UCHAR why[160];
            pcre2_get_error_message(rc, why, sizeof why);
            return MOEC_ERR(rc == PCRE2_ERROR_NOMEMORY ? MOEC_ERR_OOM : MOEC_ERR_CAPACITY,
                            "%s: a pre-tokenizer regex gave up on a %zu-byte piece: %s", t->path, n,
                            (const char *)why);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(run->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms && have_last && last_match_end == me) {
            /* Oniguruma's find_iter: no empty match right after a match */
            last_end += last_end < n ? char_len(s, last_end, n) : 1;
            continue;
        }
        last_end = me;
        last_match_end = me;
        have_last = 1;
        if ((prev != ms && tok_ranges_push(ev, prev, ms, 0)) || tok_ranges_push(ev, ms, me, 1))
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory splitting text");
        prev = me;
    }
    if (prev != n && tok_ranges_push(ev, prev, n, 0))
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory splitting text");
    return MOEC_OK;
}

/* Folds the events into pieces as NormalizedString::split's behaviours do. */
static int split_fold(const tok_ranges *ev, tok_behavior b, tok_ranges *out)
{
    int prev_match = 0;
    out->n = 0;
    if (b == TOK_MERGED_NEXT) { /* folded right to left */
        for (size_t k = ev->n; k-- > 0;) {
            const tok_range *e = &ev->v[k];
            if (e->flag && !prev_match && out->n)
                out->v[out->n - 1].start = e->start;
            else if (tok_ranges_push(out, e->start, e->end, 0))
                return -1;
            prev_match = e->flag;
        }
        for (size_t k = 0; k < out->n / 2; k++) {
            tok_range x = out->v[k];
            out->v[k] = out->v[out->n - 1 - k];
            out->v[out->n - 1 - k] = x;
        }
        return 0;
    }
    for (size_t k = 0; k < ev->n; k++) {
        const tok_range *e = &ev->v[k];
        int join = (b == TOK_CONTIGUOUS && e->flag == prev_match) ||
                   (b == TOK_MERGED_PREV && e->flag && !prev_match);
        int drop = b == TOK_REMOVED && e->flag;
        if (!drop && join && out->n)
            out->v[out->n - 1].end = e->end;
        else if (!drop && tok_ranges_push(out, e->start, e->end, 0))
            return -1;
        prev_match = e->flag;
    }
    return 0;
}

moec_status tok_split(const moec_tokenizer_t *t, const tok_step *st, const char *s, size_t n,
                      tok_regex_run *run, tok_ranges *scratch, tok_ranges *out)
{
    MOEC_TRY(split_events(t, st->re, s, n, run, scratch));
    if (st->invert)
        for (size_t k = 0; k < scratch->n; k++)
            scratch->v[k].flag = !scratch->v[k].flag;
    if (split_fold(scratch, st->behavior, out))
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory splitting text");
    return MOEC_OK;
}

/* ---- NFC ---------------------------------------------------------------------------- */

moec_status tok_nfc(const char *s, size_t n, tok_buf *out, int *same)
{
    size_t ascii = 0;
    while (ascii < n && (unsigned char)s[ascii] < 0x80)
        ascii++;
    *same = ascii == n; /* ASCII is in NFC already */
    if (*same)
        return MOEC_OK;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0)
        return MOEC_ERR(r == UTF8PROC_ERROR_NOMEM ? MOEC_ERR_OOM : MOEC_ERR_INTERNAL,
                        "NFC of a %zu-byte piece: %s", n, utf8proc_errmsg(r));
    /* s may point into out: it is not read again once utf8proc_map is done */
    *same = (size_t)r == n && memcmp(dst, s, n) == 0;
    int bad = !*same && tok_buf_put(out, dst, (size_t)r);
    free(dst);
    return bad ? MOEC_ERR(MOEC_ERR_OOM, "out of memory normalizing text") : MOEC_OK;
}
