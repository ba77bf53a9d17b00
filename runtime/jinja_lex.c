/* jinja_lex.c — a chat template's text into tokens, as jinja2's lexer cuts
 * it in transformers' environment: line breaks made \n, one trailing
 * newline dropped (keep_trailing_newline=False), `-` at a tag's edge
 * strips the whitespace beside it, lstrip_blocks strips the spaces before
 * a block or comment tag alone on its line, trim_blocks drops the newline
 * after one, comments vanish and raw blocks are text. */
#include <stdlib.h>
#include <string.h>

#include "runtime/jinja.h"

typedef struct lexer {
    jinja_ctx *c;
    const char *s;
    size_t n, pos;
    int line;
    int line_starting; /* the last match ended with a newline (lstrip_blocks) */
    jinja_toks *out;
    char balance[JINJA_MAX_NESTING];
    int depth;
} lexer;

static int push(lexer *L, jinja_tok t)
{
    if (L->out->n == L->out->cap) {
        L->out->cap = L->out->cap ? L->out->cap * 2 : 256;
        if (!(L->out->v = jinja_grow(L->c, L->out->v, L->out->n, L->out->cap, sizeof *L->out->v)))
            return -1;
    }
    L->out->v[L->out->n++] = t;
    return 0;
}

static int lines_in(const char *s, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += s[i] == '\n';
    return k;
}

/* Length of the whitespace (Python's \s) at s[0..n), 0 when none. */
static size_t space_len(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int k = jinja_utf8_next(s + i, n - i, &cp);
        if (!jinja_is_space(cp))
            break;
        i += (size_t)k;
    }
    return i;
}

/* s[0..n) without its trailing whitespace (Python's str.rstrip()). */
static size_t rstrip_len(const char *s, size_t n)
{
    size_t keep = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = jinja_utf8_next(s + i, n - i, &cp);
        i += (size_t)k;
        if (!jinja_is_space(cp))
            keep = i;
    }
    return keep;
}

static int starts(const lexer *L, size_t at, const char *lit)
{
    size_t k = strlen(lit);
    return at + k <= L->n && !memcmp(L->s + at, lit, k);
}

/* Text before a tag whose whitespace control is sign, with jinja2's
 * rules: '-' strips all whitespace before it; otherwise a block or
 * comment tag (not {{, and not '+') alone on its line takes the line's
 * leading whitespace. */
static int emit_data(lexer *L, size_t start, size_t end, int sign, int is_var)
{
    size_t n = end - start;
    const char *t = L->s + start;
    int line = L->line;
    L->line += lines_in(t, n);
    if (sign == '-') {
        n = rstrip_len(t, n);
    } else if (sign != '+' && !is_var) {
        size_t l_pos = 0;
        for (size_t i = n; i > 0; i--)
            if (t[i - 1] == '\n') {
                l_pos = i;
                break;
            }
        if ((l_pos > 0 || L->line_starting) && l_pos < n && space_len(t + l_pos, n - l_pos) == n - l_pos)
            n = l_pos;
    }
    if (!n)
        return 0;
    jinja_tok tok = {.kind = JT_DATA, .line = line, .text = {t, n}};
    return push(L, tok);
}

/* ---- literals ---------------------------------------------------------------------------- */

static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }
static int is_name_start(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static int is_name_char(char ch) { return is_name_start(ch) || is_digit(ch); }

/* Digits with single underscores between them ((\d+_)*\d+) at s[i..]:
 * their end, or i when there are none. */
static size_t digits(const lexer *L, size_t i)
{
    size_t j = i;
    while (j < L->n && is_digit(L->s[j])) {
        j++;
        if (j + 1 < L->n && L->s[j] == '_' && is_digit(L->s[j + 1]))
            j++;
    }
    return j;
}

/* A float (jinja2's float_re) at pos: its end, or pos. */
static size_t float_end(const lexer *L)
{
    size_t p = L->pos;
    if (p > 0 && L->s[p - 1] == '.')
        return p;
    size_t i = digits(L, p);
    if (i == p)
        return p;
    size_t frac = i;
    if (i < L->n && L->s[i] == '.') {
        size_t j = digits(L, i + 1);
        if (j > i + 1)
            frac = j;
    }
    size_t e = frac;
    if (e < L->n && (L->s[e] == 'e' || L->s[e] == 'E')) {
        size_t k = e + 1;
        if (k < L->n && (L->s[k] == '+' || L->s[k] == '-'))
            k++;
        size_t j = digits(L, k);
        if (j > k)
            return j;
    }
    return frac > i ? frac : p;
}

static int lex_number(lexer *L)
{
    char buf[128];
    size_t end = float_end(L), k = 0;
    jinja_tok t = {.line = L->line};
    if (end > L->pos) {
        for (size_t i = L->pos; i < end && k + 1 < sizeof buf; i++)
            if (L->s[i] != '_')
                buf[k++] = L->s[i];
        buf[k] = 0;
        t.kind = JT_FLOAT;
        t.f = strtod(buf, NULL);
        L->pos = end;
        return push(L, t);
    }
    /* integers: 0x.., 0o.., 0b.., [1-9](_?\d)*, 0(_?0)* */
    int base = 10;
    size_t i = L->pos, end_int;
    if (L->s[i] == '0' && i + 2 < L->n && strchr("xXoObB", L->s[i + 1])) {
        char b = (char)(L->s[i + 1] | 0x20);
        base = b == 'x' ? 16 : b == 'o' ? 8 : 2;
        i += 2;
        end_int = i;
        while (end_int < L->n && (is_name_char(L->s[end_int])))
            end_int++;
    } else {
        end_int = digits(L, i);
    }
    int64_t v = 0;
    int any = 0;
    for (size_t j = i; j < end_int; j++) {
        char ch = (char)(L->s[j] | 0x20);
        int d = is_digit(L->s[j]) ? L->s[j] - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (L->s[j] == '_')
            continue;
        if (d < 0 || d >= base || (base == 10 && L->s[i] == '0' && d))
            return JFAIL(L->c, L->line, MOEC_ERR_FORMAT, "a malformed number '%.*s'",
                         (int)(end_int - L->pos), L->s + L->pos);
        if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v))
            return JFAIL(L->c, L->line, MOEC_ERR_UNSUPPORTED,
                         "the integer %.*s is larger than moec's 64-bit integers",
                         (int)(end_int - L->pos), L->s + L->pos);
        any = 1;
    }
    if (!any)
        return JFAIL(L->c, L->line, MOEC_ERR_FORMAT, "a malformed number '%.*s'",
                     (int)(end_int - L->pos), L->s + L->pos);
    t.kind = JT_INT;
    t.i = v;
    L->pos = end_int;
    return push(L, t);
}

static int hexval(const char *s, size_t n, uint32_t *v)
{
    *v = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = (char)(s[i] | 0x20);
        int d = is_digit(s[i]) ? s[i] - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (d < 0)
            return -1;
        *v = *v * 16 + (uint32_t)d;
    }
    return 0;
}

/* A string literal: its value is Python's unicode-escape decoding of the
 * text between the quotes, as jinja2 computes it (unknown escapes stay). */
static int lex_string(lexer *L)
{
    char q = L->s[L->pos];
    size_t i = L->pos + 1;
    int line = L->line;
    moec_buf b = {0};
    while (i < L->n && L->s[i] != q) {
        char ch = L->s[i];
        if (ch != '\\') {
            moec_buf_put(&b, &ch, 1);
            i++;
            continue;
        }
        if (i + 1 >= L->n)
            break;
        char e = L->s[i + 1];
        const char *simple = strchr("\\'\"abfnrtv\n", e);
        static const char simple_to[] = "\\'\"\a\b\f\n\r\t\v";
        if (simple && e) {
            if (e != '\n')
                moec_buf_put(&b, &simple_to[simple - "\\'\"abfnrtv\n"], 1);
            i += 2;
        } else if (e >= '0' && e <= '7') {
            uint32_t v = 0;
            size_t k = i + 1;
            while (k < L->n && k < i + 4 && L->s[k] >= '0' && L->s[k] <= '7')
                v = v * 8 + (uint32_t)(L->s[k++] - '0');
            jinja_utf8_put(&b, v);
            i = k;
        } else if (e == 'x' || e == 'u' || e == 'U') {
            size_t k = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t v;
            if (i + 2 + k > L->n || hexval(L->s + i + 2, k, &v) || v > 0x10ffff ||
                (v >= 0xd800 && v <= 0xdfff)) {
                moec_buf_free(&b);
                return JFAIL(L->c, line, MOEC_ERR_FORMAT, "a malformed \\%c escape in a string literal", e);
            }
            jinja_utf8_put(&b, v);
            i += 2 + k;
        } else if (e == 'N') {
            moec_buf_free(&b);
            return JFAIL(L->c, line, MOEC_ERR_UNSUPPORTED, "\\N{...} escapes in string literals are not supported");
        } else if ((unsigned char)e >= 0x80) {
            /* jinja2 backslash-escapes non-ASCII first: "\é" reads "\xe9" */
            uint32_t cp;
            int k = jinja_utf8_next(L->s + i + 1, L->n - i - 1, &cp);
            moec_buf_printf(&b, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", cp);
            i += 1 + (size_t)k;
        } else {
            moec_buf_put(&b, L->s + i, 2);
            i += 2;
        }
    }
    if (i >= L->n) {
        moec_buf_free(&b);
        return JFAIL(L->c, line, MOEC_ERR_FORMAT, "a string literal is not closed");
    }
    L->line += lines_in(L->s + L->pos, i + 1 - L->pos);
    L->pos = i + 1;
    jinja_value v;
    if (jinja_buf_to_str(L->c, line, &b, &v))
        return -1;
    jinja_tok t = {.kind = JT_STRING, .line = line, .text = v.u.s};
    return push(L, t);
}

static int lex_operator(lexer *L)
{
    static const struct {
        char s[3];
        int op;
    } two[] = {{"//", JOP_FLOORDIV}, {"**", JOP_POW}, {"==", JOP_EQ},
               {"!=", JOP_NE},       {">=", JOP_GE},  {"<=", JOP_LE}};
    jinja_tok t = {.kind = JT_OP, .line = L->line};
    for (size_t k = 0; k < sizeof two / sizeof two[0]; k++)
        if (starts(L, L->pos, two[k].s)) {
            t.op = two[k].op;
            L->pos += 2;
            return push(L, t);
        }
    char ch = L->s[L->pos];
    if (!ch || !strchr("+-/*%~[](){}><=.:|,;", ch)) {
        uint32_t cp;
        int k = jinja_utf8_next(L->s + L->pos, L->n - L->pos, &cp);
        return JFAIL(L->c, L->line, MOEC_ERR_FORMAT, "unexpected character '%.*s' in a tag", k,
                     L->s + L->pos);
    }
    if (ch == '(' || ch == '[' || ch == '{') {
        if (L->depth == JINJA_MAX_NESTING)
            return JFAIL(L->c, L->line, MOEC_ERR_CAPACITY, "brackets nested more than %d deep",
                         JINJA_MAX_NESTING);
        L->balance[L->depth++] = ch == '(' ? ')' : ch == '[' ? ']' : '}';
    } else if (ch == ')' || ch == ']' || ch == '}') {
        if (!L->depth)
            return JFAIL(L->c, L->line, MOEC_ERR_FORMAT, "unexpected '%c'", ch);
        if (L->balance[--L->depth] != ch)
            return JFAIL(L->c, L->line, MOEC_ERR_FORMAT, "unexpected '%c', expected '%c'", ch,
                         L->balance[L->depth]);
    }
    t.op = ch;
    L->pos++;
    return push(L, t);
}

/* ---- tags --------------------------------------------------------------------------------- */

/* The end of a block (%}) or comment (#}) tag at p with its whitespace
 * control: its length with what it strips after it, or 0. */
static size_t close_len(const lexer *L, size_t p, char kind)
{
    char plus[4] = {'+', kind, '}', 0}, minus[4] = {'-', kind, '}', 0}, plain[3] = {kind, '}', 0};
    if (starts(L, p, plus))
        return 3;
    if (starts(L, p, minus))
        return 3 + space_len(L->s + p + 3, L->n - p - 3);
    if (starts(L, p, plain))
        return (size_t)2 + (p + 2 < L->n && L->s[p + 2] == '\n');
    return 0;
}

/* The end of a {{ }} (is_block 0) or {% %} tag at pos: its length
 * including what it strips after it, or 0. */
static size_t tag_end(const lexer *L, int is_block)
{
    size_t p = L->pos;
    if (is_block) /* %} drops one newline after it: trim_blocks */
        return close_len(L, p, '%');
    if (L->s[p] == '-' && starts(L, p + 1, "}}"))
        return 3 + space_len(L->s + p + 3, L->n - p - 3);
    return starts(L, p, "}}") ? 2 : 0;
}

/* Tokens of a {{ }} or {% %} tag, from after its opening. */
static int lex_tag(lexer *L, int is_block, int open_line)
{
    jinja_tok begin = {.kind = is_block ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, .line = L->line};
    if (push(L, begin))
        return -1;
    L->depth = 0;
    for (;;) {
        if (L->pos >= L->n)
            return JFAIL(L->c, open_line, MOEC_ERR_FORMAT, "the template ends inside this %s tag",
                         is_block ? "{% %}" : "{{ }}");
        size_t k = L->depth ? 0 : tag_end(L, is_block);
        if (k) {
            jinja_tok t = {.kind = is_block ? JT_BLOCK_END : JT_VAR_END, .line = L->line};
            L->line += lines_in(L->s + L->pos, k);
            L->line_starting = L->s[L->pos + k - 1] == '\n';
            L->pos += k;
            return push(L, t);
        }
        char ch = L->s[L->pos];
        size_t sp = space_len(L->s + L->pos, L->n - L->pos);
        int rc;
        if (sp) {
            L->line += lines_in(L->s + L->pos, sp);
            L->pos += sp;
            continue;
        } else if (is_digit(ch)) {
            rc = lex_number(L);
        } else if (is_name_start(ch)) {
            size_t i = L->pos;
            while (i < L->n && is_name_char(L->s[i]))
                i++;
            jinja_tok t = {.kind = JT_NAME, .line = L->line, .text = {L->s + L->pos, i - L->pos}};
            L->pos = i;
            rc = push(L, t);
        } else if (ch == '\'' || ch == '"') {
            rc = lex_string(L);
        } else {
            rc = lex_operator(L);
        }
        if (rc)
            return rc;
    }
}

/* A comment from after its opening: skipped, with what its end strips. */
static int lex_comment(lexer *L, int open_line)
{
    for (size_t p = L->pos; p < L->n; p++) {
        size_t k = close_len(L, p, '#');
        if (k) {
            L->line += lines_in(L->s + L->pos, p + k - L->pos);
            L->line_starting = L->s[p + k - 1] == '\n';
            L->pos = p + k;
            return 0;
        }
    }
    return JFAIL(L->c, open_line, MOEC_ERR_FORMAT, "a comment {# is not closed by #}");
}

/* {% raw %} at pos (its opening was already matched, `len` bytes long):
 * the text up to {% endraw %} is data. */
static int lex_raw(lexer *L, size_t len, int open_line)
{
    L->pos += len;
    L->line_starting = L->s[L->pos - 1] == '\n';
    for (size_t p = L->pos; p + 1 < L->n; p++) {
        if (L->s[p] != '{' || L->s[p + 1] != '%')
            continue;
        size_t q = p + 2;
        int sign = q < L->n && (L->s[q] == '-' || L->s[q] == '+') ? L->s[q++] : 0;
        q += space_len(L->s + q, L->n - q);
        if (!starts(L, q, "endraw"))
            continue;
        q += 6;
        q += space_len(L->s + q, L->n - q);
        size_t k = close_len(L, q, '%');
        if (!k)
            continue;
        if (emit_data(L, L->pos, p, sign, 0))
            return -1;
        L->line += lines_in(L->s + p, q + k - p);
        L->line_starting = L->s[q + k - 1] == '\n';
        L->pos = q + k;
        return 0;
    }
    return JFAIL(L->c, open_line, MOEC_ERR_FORMAT, "a {%% raw %%} block is not closed by {%% endraw %%}");
}

/* The length of a {% raw %} opening at p ({%, sign, "raw", -%} or %}), or 0. */
static size_t raw_begin(const lexer *L, size_t p)
{
    size_t q = p + 2;
    if (q < L->n && (L->s[q] == '-' || L->s[q] == '+'))
        q++;
    q += space_len(L->s + q, L->n - q);
    if (!starts(L, q, "raw"))
        return 0;
    q += 3;
    q += space_len(L->s + q, L->n - q);
    if (L->s[q] == '-' && starts(L, q + 1, "%}"))
        return q + 3 + space_len(L->s + q + 3, L->n - q - 3) - p;
    return starts(L, q, "%}") ? q + 2 - p : 0;
}

int jinja_lex(jinja_ctx *c, const char *src, size_t len, jinja_toks *out)
{
    /* line breaks become \n; one trailing newline goes */
    char *s = jinja_alloc(c, len + 1);
    if (!s)
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    s[n] = 0;
    lexer L = {.c = c, .s = s, .n = n, .line = 1, .line_starting = 1, .out = out};
    while (L.pos < L.n) {
        size_t p = L.pos;
        while (p + 1 < L.n && !(L.s[p] == '{' && (L.s[p + 1] == '{' || L.s[p + 1] == '%' || L.s[p + 1] == '#')))
            p++;
        if (p + 1 >= L.n) { /* no tag left: the rest is text */
            if (emit_data(&L, L.pos, L.n, '+', 1))
                return -1;
            break;
        }
        char kind = L.s[p + 1];
        int sign = p + 2 < L.n && (L.s[p + 2] == '-' || L.s[p + 2] == '+') ? L.s[p + 2] : 0;
        size_t raw = kind == '%' ? raw_begin(&L, p) : 0;
        if (emit_data(&L, L.pos, p, sign, kind == '{'))
            return -1;
        int open_line = L.line;
        L.line_starting = 0;
        L.pos = p;
        int rc;
        if (raw) {
            rc = lex_raw(&L, raw, open_line);
        } else {
            L.pos = p + 2 + (sign != 0);
            rc = kind == '#' ? lex_comment(&L, open_line) : lex_tag(&L, kind == '%', open_line);
        }
        if (rc)
            return rc;
    }
    jinja_tok eof = {.kind = JT_EOF, .line = L.line};
    return push(&L, eof);
}
