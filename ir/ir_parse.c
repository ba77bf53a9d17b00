/* ir_parse.c — reads the IR text form back into a module: a hand-written
 * lexer that tracks line and column, and a recursive-descent parser that
 * checks each line as it reads it (names, types, bindings, attributes,
 * shapes), so every error points at "file:line:col". Any input, however
 * malformed, gives MOEC_ERR_FORMAT and never a crash: every loop consumes a
 * token or stops. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "ir/ir_internal.h"

#define MAX_NUMBER_LEN 400
#define MAX_INT_LIST 65536

typedef enum tok_kind {
    TK_EOF,
    TK_NEWLINE,
    TK_IDENT,  /* [A-Za-z_][A-Za-z0-9_.]* */
    TK_VALUE,  /* %name; text excludes the '%' */
    TK_INT,
    TK_FLOAT,
    TK_STRING, /* text is the raw inside of the quotes, escapes unresolved */
    TK_LBRACE,
    TK_RBRACE,
    TK_LBRACKET,
    TK_RBRACKET,
    TK_LPAREN,
    TK_RPAREN,
    TK_COMMA,
    TK_COLON,
    TK_EQUAL,
    TK_AT,
    TK_STAR,
} tok_kind;

typedef struct token {
    tok_kind kind;
    const char *text;
    size_t len;
    int line, col;
    int64_t i;
    double f;
} token;

typedef struct parser {
    const char *src;
    size_t pos;
    int line, col;
    const char *file;
    token tok;
    ir_module *m;
    ir_name_map names;
} parser;

static moec_status perr(const parser *p, int line, int col, const char *fmt, ...) MOEC_PRINTF(4, 5);
static moec_status perr(const parser *p, int line, int col, const char *fmt, ...)
{
    char msg[IR_MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return MOEC_ERR(MOEC_ERR_FORMAT, "%s:%d:%d: %s", p->file, line, col, msg);
}

/* Error at the current token. */
#define PERR(p, ...) perr((p), (p)->tok.line, (p)->tok.col, __VA_ARGS__)

static int is_ident_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int is_name_char(char c) { return is_ident_start(c) || is_digit(c) || c == '.'; }

static int tok_is(const token *t, tok_kind k, const char *text)
{
    return t->kind == k && strlen(text) == t->len && !memcmp(t->text, text, t->len);
}

/* A short description of a token for "found ..." in messages. */
static void tok_desc(const token *t, char *buf, size_t cap)
{
    int n = t->len > 32 ? 32 : (int)t->len;
    const char *more = t->len > 32 ? "..." : "";
    switch (t->kind) {
    case TK_EOF: snprintf(buf, cap, "end of file"); return;
    case TK_NEWLINE: snprintf(buf, cap, "end of line"); return;
    case TK_IDENT: snprintf(buf, cap, "'%.*s%s'", n, t->text, more); return;
    case TK_VALUE: snprintf(buf, cap, "'%%%.*s%s'", n, t->text, more); return;
    case TK_INT:
    case TK_FLOAT: snprintf(buf, cap, "number '%.*s%s'", n, t->text, more); return;
    case TK_STRING: snprintf(buf, cap, "string \"%.*s%s\"", n, t->text, more); return;
    default: snprintf(buf, cap, "'%.*s'", n, t->text); return;
    }
}

/* ---- lexer ---------------------------------------------------------------- */

static char peek_at(const parser *p, size_t k) { return p->src[p->pos + k]; }

static void advance(parser *p, size_t k)
{
    p->pos += k;
    p->col += (int)k;
}

static moec_status lex_number(parser *p, token *t)
{
    size_t n = 0;
    int is_float = 0;
    if (peek_at(p, 0) == '-')
        n++;
    const char *s = p->src + p->pos;
    if ((!strncmp(s + n, "inf", 3) || !strncmp(s + n, "nan", 3)) && !is_name_char(s[n + 3])) {
        n += 3;
        is_float = 1;
    } else {
        size_t digits = 0;
        while (is_digit(s[n]))
            n++, digits++;
        if (s[n] == '.') {
            is_float = 1;
            n++;
            while (is_digit(s[n]))
                n++, digits++;
        }
        if (!digits)
            return perr(p, t->line, t->col, "malformed number '%.*s'", (int)(n ? n : 1), s);
        if (s[n] == 'e' || s[n] == 'E') {
            is_float = 1;
            n++;
            if (s[n] == '+' || s[n] == '-')
                n++;
            size_t exp_digits = 0;
            while (is_digit(s[n]))
                n++, exp_digits++;
            if (!exp_digits)
                return perr(p, t->line, t->col, "malformed number '%.*s'", (int)n, s);
        }
    }
    if (is_name_char(s[n])) {
        size_t m = n;
        while (is_name_char(s[m]) && m < 40)
            m++;
        return perr(p, t->line, t->col, "malformed number '%.*s'", (int)m, s);
    }
    if (n > MAX_NUMBER_LEN)
        return perr(p, t->line, t->col, "number too long");
    t->text = s;
    t->len = n;
    if (is_float) {
        char buf[MAX_NUMBER_LEN + 1];
        memcpy(buf, s, n);
        buf[n] = '\0';
        t->kind = TK_FLOAT;
        t->f = strtod(buf, NULL);
    } else {
        int neg = s[0] == '-';
        uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, v = 0;
        for (size_t k = neg; k < n; k++) {
            uint64_t d = (uint64_t)(s[k] - '0');
            if (v > (limit - d) / 10)
                return perr(p, t->line, t->col, "integer '%.*s' out of range", (int)n, s);
            v = v * 10 + d;
        }
        t->kind = TK_INT;
        t->i = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
    }
    advance(p, n);
    return MOEC_OK;
}

static moec_status lex_string(parser *p, token *t)
{
    size_t n = 1; /* past the opening quote */
    const char *s = p->src + p->pos;
    for (;;) {
        char c = s[n];
        if (c == '"')
            break;
        if (c == '\0' || c == '\n')
            return perr(p, t->line, t->col, "unterminated string");
        if ((unsigned char)c < 0x20 || c == 0x7f)
            return perr(p, t->line, t->col + (int)n, "control character in string");
        if (c == '\\') {
            char e = s[n + 1];
            if (e != '"' && e != '\\') {
                if ((unsigned char)e < 0x20 || e == 0x7f)
                    return perr(p, t->line, t->col + (int)n, "unknown escape in string");
                return perr(p, t->line, t->col + (int)n, "unknown escape '\\%c' in string", e);
            }
            n++;
        }
        n++;
    }
    t->kind = TK_STRING;
    t->text = s + 1;
    t->len = n - 1;
    advance(p, n + 1);
    return MOEC_OK;
}

/* Reads the next token into p->tok. */
static moec_status next(parser *p)
{
    token *t = &p->tok;
    for (;;) {
        char c = peek_at(p, 0);
        if (c == ' ' || c == '\t' || c == '\r') {
            advance(p, 1);
        } else if (c == '#') {
            while (peek_at(p, 0) && peek_at(p, 0) != '\n')
                advance(p, 1);
        } else {
            break;
        }
    }
    memset(t, 0, sizeof *t);
    t->line = p->line;
    t->col = p->col;
    t->text = p->src + p->pos;
    t->len = 1;
    char c = peek_at(p, 0);
    static const char PUNCT[] = "{}[](),:=@*";
    static const tok_kind PUNCT_KIND[] = {TK_LBRACE, TK_RBRACE, TK_LBRACKET, TK_RBRACKET,
                                          TK_LPAREN, TK_RPAREN, TK_COMMA,    TK_COLON,
                                          TK_EQUAL,  TK_AT,     TK_STAR};
    if (c == '\0') {
        t->kind = TK_EOF;
        t->len = 0;
        return MOEC_OK;
    }
    if (c == '\n') {
        t->kind = TK_NEWLINE;
        p->pos++;
        p->line++;
        p->col = 1;
        return MOEC_OK;
    }
    const char *pc = strchr(PUNCT, c);
    if (pc) {
        t->kind = PUNCT_KIND[pc - PUNCT];
        advance(p, 1);
        return MOEC_OK;
    }
    if (c == '%') {
        size_t n = 0;
        while (is_name_char(peek_at(p, 1 + n)))
            n++;
        if (!n)
            return perr(p, t->line, t->col, "expected a value name after '%%'");
        t->kind = TK_VALUE;
        t->text = p->src + p->pos + 1;
        t->len = n;
        advance(p, n + 1);
        return MOEC_OK;
    }
    if (is_ident_start(c)) {
        size_t n = 0;
        while (is_name_char(peek_at(p, n)))
            n++;
        t->kind = TK_IDENT;
        t->len = n;
        advance(p, n);
        return MOEC_OK;
    }
    if (is_digit(c) || c == '-' || c == '.')
        return lex_number(p, t);
    if (c == '"')
        return lex_string(p, t);
    if (c > 0x20 && c < 0x7f)
        return perr(p, t->line, t->col, "unexpected character '%c'", c);
    return perr(p, t->line, t->col, "unexpected byte 0x%02x", (unsigned char)c);
}

static moec_status expect(parser *p, tok_kind k, const char *what)
{
    if (p->tok.kind != k) {
        char found[64];
        tok_desc(&p->tok, found, sizeof found);
        return PERR(p, "expected %s, found %s", what, found);
    }
    return next(p);
}

static moec_status skip_newlines(parser *p)
{
    while (p->tok.kind == TK_NEWLINE)
        MOEC_TRY(next(p));
    return MOEC_OK;
}

/* ---- values --------------------------------------------------------------- */

static char *arena_strndup(parser *p, const char *s, size_t n)
{
    char *d = ir_arena_alloc(p->m->arena, n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

static moec_status oom(parser *p)
{
    return perr(p, p->tok.line, p->tok.col, "out of memory");
}

/* The current STRING token's contents, escapes resolved, in the arena. */
static moec_status take_string(parser *p, const char **out)
{
    const token *t = &p->tok;
    char *d = ir_arena_alloc(p->m->arena, t->len + 1);
    if (!d)
        return oom(p);
    size_t n = 0;
    for (size_t k = 0; k < t->len; k++) {
        if (t->text[k] == '\\' && k + 1 < t->len)
            k++;
        d[n++] = t->text[k];
    }
    d[n] = '\0';
    *out = d;
    return next(p);
}

/* An attribute or meta value: int, float, string or int list. */
static moec_status parse_value(parser *p, ir_attr *a)
{
    token *t = &p->tok;
    if (t->kind == TK_INT) {
        a->kind = IR_ATTR_INT;
        a->i = t->i;
        return next(p);
    }
    if (t->kind == TK_FLOAT) {
        a->kind = IR_ATTR_FLOAT;
        a->f = t->f;
        return next(p);
    }
    if (tok_is(t, TK_IDENT, "inf") || tok_is(t, TK_IDENT, "nan")) {
        a->kind = IR_ATTR_FLOAT;
        a->f = strtod(t->text[0] == 'i' ? "inf" : "nan", NULL);
        return next(p);
    }
    if (t->kind == TK_STRING) {
        a->kind = IR_ATTR_STR;
        return take_string(p, &a->s);
    }
    if (t->kind == TK_LBRACKET) {
        a->kind = IR_ATTR_INTS;
        int cap = 0;
        MOEC_TRY(next(p));
        while (t->kind != TK_RBRACKET) {
            if (t->kind != TK_INT) {
                char found[64];
                tok_desc(t, found, sizeof found);
                return PERR(p, "expected an int in the list, found %s", found);
            }
            if (a->n >= MAX_INT_LIST)
                return PERR(p, "int list longer than %d", MAX_INT_LIST);
            if (a->n == cap) {
                cap = cap ? cap * 2 : 8;
                int64_t *grown = ir_arena_alloc(p->m->arena, sizeof *grown * (size_t)cap);
                if (!grown)
                    return oom(p);
                if (a->n)
                    memcpy(grown, a->ints, sizeof *grown * (size_t)a->n);
                a->ints = grown;
            }
            a->ints[a->n++] = t->i;
            MOEC_TRY(next(p));
            if (t->kind == TK_COMMA)
                MOEC_TRY(next(p));
            else if (t->kind != TK_RBRACKET) {
                char found[64];
                tok_desc(t, found, sizeof found);
                return PERR(p, "expected ',' or ']' in int list, found %s", found);
            }
        }
        return next(p);
    }
    char found[64];
    tok_desc(t, found, sizeof found);
    return PERR(p, "expected a value (int, float, string or int list), found %s", found);
}

/* dtype[d0, d1, ...] with T allowed only first. */
static moec_status parse_type(parser *p, ir_type *ty)
{
    token *t = &p->tok;
    memset(ty, 0, sizeof *ty);
    if (t->kind != TK_IDENT) {
        char found[64];
        tok_desc(t, found, sizeof found);
        return PERR(p, "expected a dtype, found %s", found);
    }
    char name[8] = "";
    if (t->len < sizeof name) {
        memcpy(name, t->text, t->len);
        name[t->len] = '\0';
    }
    if (ir_dtype_from_name(name, &ty->dtype))
        return PERR(p, "unknown dtype '%.*s'", t->len > 32 ? 32 : (int)t->len, t->text);
    MOEC_TRY(next(p));
    MOEC_TRY(expect(p, TK_LBRACKET, "'[' after the dtype"));
    for (;;) {
        if (ty->rank >= IR_MAX_RANK)
            return PERR(p, "more than %d dimensions", IR_MAX_RANK);
        if (tok_is(t, TK_IDENT, "T")) {
            if (ty->rank != 0)
                return PERR(p, "T may only be the first dimension");
            ty->dims[ty->rank++] = IR_DIM_T;
        } else if (t->kind == TK_INT) {
            if (t->i < 1 || t->i > IR_DIM_MAX)
                return PERR(p, "dimension %" PRId64 " out of range [1, %lld]", t->i, IR_DIM_MAX);
            ty->dims[ty->rank++] = t->i;
        } else {
            char found[64];
            tok_desc(t, found, sizeof found);
            return PERR(p, "expected a dimension (an int or T), found %s", found);
        }
        MOEC_TRY(next(p));
        if (t->kind == TK_RBRACKET)
            break;
        if (t->kind != TK_COMMA) {
            char found[64];
            tok_desc(t, found, sizeof found);
            return PERR(p, "expected ',' or ']' in the type, found %s", found);
        }
        MOEC_TRY(next(p));
    }
    if (!ir_type_valid(ty, 1))
        return PERR(p, "type has more than %lld elements", IR_NUMEL_MAX);
    return next(p);
}

/* A new value name at the current token: not yet defined. */
static moec_status check_fresh_name(parser *p)
{
    if (ir_name_map_get(&p->names, p->tok.text, p->tok.len))
        return PERR(p, "duplicate value %%%.*s", (int)p->tok.len, p->tok.text);
    return MOEC_OK;
}

static moec_status define(parser *p, const token *name, ir_value_kind kind, ir_value **out)
{
    ir_value *v = ir_module_new_value(p->m, name->text, name->len, kind);
    if (!v || ir_name_map_put(&p->names, v))
        return perr(p, name->line, name->col, "out of memory");
    *out = v;
    return MOEC_OK;
}

/* An optional "@<n>*T" after an activation's type: its planned arena offset
 * per token; -1 when absent. */
static moec_status parse_offset(parser *p, int64_t *off)
{
    token *t = &p->tok;
    *off = -1;
    if (t->kind != TK_AT)
        return MOEC_OK;
    MOEC_TRY(next(p));
    if (t->kind != TK_INT || t->i < 0) {
        char found[64];
        tok_desc(t, found, sizeof found);
        return PERR(p, "expected an arena offset (an int >= 0) after '@', found %s", found);
    }
    int64_t v = t->i;
    MOEC_TRY(next(p));
    MOEC_TRY(expect(p, TK_STAR, "'*T' after the arena offset"));
    if (!tok_is(t, TK_IDENT, "T")) {
        char found[64];
        tok_desc(t, found, sizeof found);
        return PERR(p, "expected 'T' after '@%" PRId64 "*', found %s", v, found);
    }
    *off = v;
    return next(p);
}

/* ---- declarations --------------------------------------------------------- */

static moec_status parse_meta(parser *p)
{
    token *t = &p->tok;
    MOEC_TRY(next(p));
    if (t->kind != TK_IDENT) {
        char found[64];
        tok_desc(t, found, sizeof found);
        return PERR(p, "expected a meta key, found %s", found);
    }
    token key = *t;
    char *k = arena_strndup(p, key.text, key.len);
    if (!k)
        return oom(p);
    if (!ir_key_valid(k))
        return PERR(p, "invalid meta key '%s'", k);
    if (ir_module_meta(p->m, k))
        return PERR(p, "duplicate meta key '%s'", k);
    MOEC_TRY(next(p));
    MOEC_TRY(expect(p, TK_EQUAL, "'=' after the meta key"));
    ir_attr val = {0};
    MOEC_TRY(parse_value(p, &val));
    ir_attr *a;
    if (ir_module_meta_slot(p->m, k, val.kind, &a) != MOEC_OK)
        return perr(p, key.line, key.col, "out of memory");
    val.key = a->key;
    *a = val;
    return MOEC_OK;
}

static moec_status parse_input(parser *p)
{
    token *t = &p->tok;
    MOEC_TRY(next(p));
    if (t->kind != TK_VALUE) {
        char found[64];
        tok_desc(t, found, sizeof found);
        return PERR(p, "expected a value name after 'input', found %s", found);
    }
    MOEC_TRY(check_fresh_name(p));
    token name = *t;
    int cap = (int)(sizeof p->m->inputs / sizeof p->m->inputs[0]);
    if (p->m->n_inputs >= cap)
        return PERR(p, "too many inputs (at most %d)", cap);
    MOEC_TRY(next(p));
    MOEC_TRY(expect(p, TK_COLON, "':' after value name"));
    token type_tok = *t;
    ir_type ty;
    MOEC_TRY(parse_type(p, &ty));
    if (!ir_type_has_t(&ty))
        return perr(p, type_tok.line, type_tok.col,
                    "input %%%.*s must have T as its first dimension", (int)name.len, name.text);
    int64_t off;
    MOEC_TRY(parse_offset(p, &off));
    ir_value *v;
    MOEC_TRY(define(p, &name, IR_VALUE_INPUT, &v));
    v->type = ty;
    v->mem_offset = off;
    p->m->inputs[p->m->n_inputs++] = v;
    return MOEC_OK;
}

static moec_status parse_int_in(parser *p, const char *what, int64_t lo, int64_t hi, int *out)
{
    if (p->tok.kind != TK_INT) {
        char found[64];
        tok_desc(&p->tok, found, sizeof found);
        return PERR(p, "expected %s (an int), found %s", what, found);
    }
    if (p->tok.i < lo || p->tok.i > hi)
        return PERR(p, "%s %" PRId64 " out of range [%" PRId64 ", %" PRId64 "]", what, p->tok.i,
                    lo, hi);
    *out = (int)p->tok.i;
    return next(p);
}

/* A box after a leaf: "[4:8, :, 0:16]" (start:end or ':' per dim). */
static moec_status parse_box(parser *p, ir_binding *b)
{
    token *t = &p->tok;
    MOEC_TRY(next(p));
    for (;;) {
        if (b->box_rank == IR_MAX_RANK)
            return PERR(p, "a slice has at most %d dims", IR_MAX_RANK);
        int d = b->box_rank++;
        if (t->kind == TK_COLON) {
            MOEC_TRY(next(p));
        } else {
            int lo, hi;
            MOEC_TRY(parse_int_in(p, "slice start", 0, INT32_MAX, &lo));
            MOEC_TRY(expect(p, TK_COLON, "':' in the slice start:end"));
            MOEC_TRY(parse_int_in(p, "slice end", (int64_t)lo + 1, INT32_MAX, &hi));
            b->box_start[d] = lo;
            b->box_size[d] = hi - lo;
        }
        if (t->kind != TK_COMMA)
            return expect(p, TK_RBRACKET, "',' or ']' in the slice");
        MOEC_TRY(next(p));
    }
}

/* "name" or stack("pattern", count). */
static moec_status parse_binding_leaf_base(parser *p, ir_binding *b)
{
    token *t = &p->tok;
    if (t->kind == TK_STRING) {
        b->kind = IR_BIND_TENSOR;
        return take_string(p, &b->name);
    }
    if (tok_is(t, TK_IDENT, "stack")) {
        b->kind = IR_BIND_STACK;
        MOEC_TRY(next(p));
        MOEC_TRY(expect(p, TK_LPAREN, "'(' after 'stack'"));
        if (t->kind != TK_STRING) {
            char found[64];
            tok_desc(t, found, sizeof found);
            return PERR(p, "expected the stack's tensor name pattern, found %s", found);
        }
        MOEC_TRY(take_string(p, &b->name));
        MOEC_TRY(expect(p, TK_COMMA, "',' after the stack pattern"));
        MOEC_TRY(parse_int_in(p, "stack count", 1, INT32_MAX, &b->count));
        return expect(p, TK_RPAREN, "')' after the stack count");
    }
    char found[64];
    tok_desc(t, found, sizeof found);
    return PERR(p, "expected a tensor name, stack(...) or concat(...), found %s", found);
}

/* "name" or stack("pattern", count), each with an optional box. */
static moec_status parse_binding_leaf(parser *p, ir_binding *b)
{
    MOEC_TRY(parse_binding_leaf_base(p, b));
    return p->tok.kind == TK_LBRACKET ? parse_box(p, b) : MOEC_OK;
}

static moec_status parse_binding(parser *p, ir_binding *b)
{
    token *t = &p->tok;
    if (!tok_is(t, TK_IDENT, "concat"))
        return parse_binding_leaf(p, b);
    b->kind = IR_BIND_CONCAT;
    MOEC_TRY(next(p));
    MOEC_TRY(expect(p, TK_LPAREN, "'(' after 'concat'"));
    MOEC_TRY(parse_int_in(p, "concat axis", 0, IR_MAX_RANK - 1, &b->axis));
    b->parts = ir_arena_alloc(p->m->arena, sizeof *b->parts * IR_MAX_BIND_PARTS);
    if (!b->parts)
        return oom(p);
    while (t->kind == TK_COMMA) {
        MOEC_TRY(next(p));
        if (b->n_parts >= IR_MAX_BIND_PARTS)
            return PERR(p, "concat binding with more than %d parts", IR_MAX_BIND_PARTS);
        MOEC_TRY(parse_binding_leaf(p, &b->parts[b->n_parts++]));
    }
    if (b->n_parts == 0)
        return PERR(p, "expected ',' and a part after the concat axis");
    return expect(p, TK_RPAREN, "',' or ')' in concat(...)");
}

/* "[rows, cols]": a block's two sizes, after what `after` names. */
static moec_status parse_block(parser *p, int64_t *block, const char *after)
{
    token *t = &p->tok;
    char what[64];
    snprintf(what, sizeof what, "'[' after %s", after);
    MOEC_TRY(expect(p, TK_LBRACKET, what));
    for (int k = 0; k < 2; k++) {
        if (t->kind != TK_INT || t->i < 1 || t->i > IR_DIM_MAX) {
            char found[64];
            tok_desc(t, found, sizeof found);
            return PERR(p, "expected a block size (an int in [1, %lld]), found %s", IR_DIM_MAX,
                        found);
        }
        block[k] = t->i;
        MOEC_TRY(next(p));
        if (k == 0)
            MOEC_TRY(expect(p, TK_COMMA, "',' between the block's rows and columns"));
    }
    return expect(p, TK_RBRACKET, "']' after the block's columns");
}

/* "block_scale[rows, cols] [from [rows, cols]] = <binding>" after a
 * weight's binding and ','. */
static moec_status parse_block_scale(parser *p, ir_block_scale *s)
{
    token *t = &p->tok;
    if (!tok_is(t, TK_IDENT, "block_scale")) {
        char found[64];
        tok_desc(t, found, sizeof found);
        return PERR(p, "expected block_scale after ',', found %s", found);
    }
    MOEC_TRY(next(p));
    MOEC_TRY(parse_block(p, s->block, "block_scale"));
    if (tok_is(t, TK_IDENT, "from")) {
        MOEC_TRY(next(p));
        MOEC_TRY(parse_block(p, s->stored, "from"));
    }
    MOEC_TRY(expect(p, TK_EQUAL, "'=' and the scales' binding"));
    return parse_binding(p, &s->bind);
}

static moec_status parse_weight(parser *p)
{
    token *t = &p->tok;
    MOEC_TRY(next(p));
    if (t->kind != TK_VALUE) {
        char found[64];
        tok_desc(t, found, sizeof found);
        return PERR(p, "expected a value name after 'weight', found %s", found);
    }
    MOEC_TRY(check_fresh_name(p));
    token name = *t;
    MOEC_TRY(next(p));
    MOEC_TRY(expect(p, TK_COLON, "':' after value name"));
    token type_tok = *t;
    ir_type ty;
    MOEC_TRY(parse_type(p, &ty));
    if (ir_type_has_t(&ty))
        return perr(p, type_tok.line, type_tok.col, "weight %%%.*s must not have T",
                    (int)name.len, name.text);
    MOEC_TRY(expect(p, TK_EQUAL, "'=' and the weight's binding"));
    token bind_tok = *t;
    ir_binding b = {0};
    MOEC_TRY(parse_binding(p, &b));
    char msg[IR_MSG_CAP];
    if (ir_binding_check(&b, &ty, msg, sizeof msg) != MOEC_OK)
        return perr(p, bind_tok.line, bind_tok.col, "weight %%%.*s: %s", (int)name.len,
                    name.text, msg);
    ir_value w = {.type = ty, .bind = b};
    token scale_tok = *t;
    if (t->kind == TK_COMMA) {
        MOEC_TRY(next(p));
        scale_tok = *t;
        MOEC_TRY(parse_block_scale(p, &w.scale));
    }
    if (ir_block_scale_check(&w, msg, sizeof msg) != MOEC_OK)
        return perr(p, scale_tok.line, scale_tok.col, "weight %%%.*s: %s", (int)name.len,
                    name.text, msg);
    ir_value *v;
    MOEC_TRY(define(p, &name, IR_VALUE_WEIGHT, &v));
    v->type = ty;
    v->bind = b;
    v->scale = w.scale;
    return MOEC_OK;
}

static moec_status parse_output(parser *p)
{
    token *t = &p->tok;
    MOEC_TRY(next(p));
    if (t->kind != TK_VALUE) {
        char found[64];
        tok_desc(t, found, sizeof found);
        return PERR(p, "expected a value name after 'output', found %s", found);
    }
    ir_value *v = ir_name_map_get(&p->names, t->text, t->len);
    if (!v)
        return PERR(p, "undefined value %%%.*s", (int)t->len, t->text);
    ir_module *m = p->m;
    for (int i = 0; i < m->n_outputs; i++)
        if (m->outputs[i] == v)
            return PERR(p, "%%%s is already an output", v->name);
    int cap = (int)(sizeof m->outputs / sizeof m->outputs[0]);
    if (m->n_outputs >= cap)
        return PERR(p, "too many outputs (at most %d)", cap);
    m->outputs[m->n_outputs++] = v;
    return next(p);
}

typedef struct result_decl {
    token name;
    token type_tok;
    ir_type type;
    int64_t mem_offset;
} result_decl;

static moec_status parse_attrs(parser *p, ir_op *op)
{
    token *t = &p->tok;
    const char *opname = ir_op_name(op->kind);
    MOEC_TRY(next(p));
    while (t->kind != TK_RBRACE) {
        if (t->kind != TK_IDENT) {
            char found[64];
            tok_desc(t, found, sizeof found);
            return PERR(p, "expected an attribute name, found %s", found);
        }
        char key[64];
        int klen = t->len >= sizeof key ? (int)sizeof key - 1 : (int)t->len;
        memcpy(key, t->text, (size_t)klen);
        key[klen] = '\0';
        const char *k = t->len < sizeof key ? ir_op_attr_key(op->kind, key) : NULL;
        if (!k)
            return PERR(p, "unknown attribute '%.*s' for %s", t->len > 32 ? 32 : (int)t->len,
                        t->text, opname);
        if (ir_op_attr(op, k))
            return PERR(p, "duplicate attribute '%s'", k);
        if (op->n_attr >= IR_MAX_ATTRS)
            return PERR(p, "too many attributes");
        MOEC_TRY(next(p));
        MOEC_TRY(expect(p, TK_EQUAL, "'=' after the attribute name"));
        ir_attr a = {0};
        token val_tok = *t;
        MOEC_TRY(parse_value(p, &a));
        ir_attr_kind want;
        ir_op_attr_spec(op->kind, k, &want, NULL);
        if (a.kind != want) {
            static const char *const names[] = {"an int", "a float", "a string", "an int list"};
            return perr(p, val_tok.line, val_tok.col, "attribute '%s' of %s must be %s", k,
                        opname, names[want]);
        }
        a.key = k;
        op->attrs[op->n_attr++] = a;
        if (t->kind == TK_COMMA)
            MOEC_TRY(next(p));
        else if (t->kind != TK_RBRACE) {
            char found[64];
            tok_desc(t, found, sizeof found);
            return PERR(p, "expected ',' or '}' after the attribute, found %s", found);
        }
    }
    return next(p);
}

static moec_status parse_op(parser *p)
{
    token *t = &p->tok;
    token start = *t;
    result_decl res[IR_MAX_RESULTS];
    int n_res = 0;
    for (;;) {
        if (t->kind != TK_VALUE) {
            char found[64];
            tok_desc(t, found, sizeof found);
            return PERR(p, "expected a result name, found %s", found);
        }
        if (n_res >= IR_MAX_RESULTS)
            return PERR(p, "more than %d results", IR_MAX_RESULTS);
        MOEC_TRY(check_fresh_name(p));
        for (int i = 0; i < n_res; i++)
            if (res[i].name.len == t->len && !memcmp(res[i].name.text, t->text, t->len))
                return PERR(p, "duplicate value %%%.*s", (int)t->len, t->text);
        result_decl *r = &res[n_res++];
        r->name = *t;
        MOEC_TRY(next(p));
        MOEC_TRY(expect(p, TK_COLON, "':' after value name"));
        r->type_tok = *t;
        MOEC_TRY(parse_type(p, &r->type));
        MOEC_TRY(parse_offset(p, &r->mem_offset));
        if (t->kind == TK_EQUAL)
            break;
        if (t->kind != TK_COMMA) {
            char found[64];
            tok_desc(t, found, sizeof found);
            return PERR(p, "expected ',' or '=' after the result type, found %s", found);
        }
        MOEC_TRY(next(p));
    }
    MOEC_TRY(next(p));
    if (t->kind != TK_IDENT) {
        char found[64];
        tok_desc(t, found, sizeof found);
        return PERR(p, "expected an op name, found %s", found);
    }
    token op_tok = *t;
    char opname[32];
    ir_op_kind kind;
    if (t->len >= sizeof opname)
        return PERR(p, "unknown op '%.32s...'", t->text);
    memcpy(opname, t->text, t->len);
    opname[t->len] = '\0';
    if (ir_op_kind_from_name(opname, &kind))
        return PERR(p, "unknown op '%s'", opname);
    int min_in, max_in, n_out;
    ir_op_arity(kind, &min_in, &max_in, &n_out);
    if (n_res != n_out)
        return PERR(p, "%s has %d result%s, %d given", opname, n_out, n_out == 1 ? "" : "s",
                    n_res);
    MOEC_TRY(next(p));
    MOEC_TRY(expect(p, TK_LPAREN, "'(' after the op name"));
    ir_value *in[IR_MAX_OPERANDS];
    int n_in = 0;
    while (t->kind != TK_RPAREN) {
        if (t->kind != TK_VALUE) {
            char found[64];
            tok_desc(t, found, sizeof found);
            return PERR(p, "expected an operand, found %s", found);
        }
        ir_value *v = ir_name_map_get(&p->names, t->text, t->len);
        if (!v)
            return PERR(p, "undefined value %%%.*s", (int)t->len, t->text);
        if (n_in >= max_in)
            return PERR(p, "%s takes at most %d operands", opname, max_in);
        in[n_in++] = v;
        MOEC_TRY(next(p));
        if (t->kind == TK_COMMA)
            MOEC_TRY(next(p));
        else if (t->kind != TK_RPAREN) {
            char found[64];
            tok_desc(t, found, sizeof found);
            return PERR(p, "expected ',' or ')' after the operand, found %s", found);
        }
    }
    if (n_in < min_in)
        return PERR(p, "%s takes at least %d operands, %d given", opname, min_in, n_in);
    MOEC_TRY(next(p));
    ir_op *op = ir_module_new_op(p->m, kind);
    if (!op)
        return perr(p, op_tok.line, op_tok.col, "out of memory");
    op->n_in = n_in;
    memcpy(op->in, in, sizeof in[0] * (size_t)n_in);
    if (t->kind == TK_LBRACE)
        MOEC_TRY(parse_attrs(p, op));
    if (tok_is(t, TK_IDENT, "stream")) {
        MOEC_TRY(next(p));
        MOEC_TRY(parse_int_in(p, "stream", 0, 1, &op->stream));
    }
    for (int i = 0; i < n_res; i++) {
        ir_value *v;
        MOEC_TRY(define(p, &res[i].name, IR_VALUE_OP, &v));
        v->type = res[i].type;
        v->mem_offset = res[i].mem_offset;
        v->def = op;
        op->out[i] = v;
        op->n_out = i + 1;
    }
    ir_type inferred[IR_MAX_RESULTS];
    char msg[IR_MSG_CAP];
    if (ir_op_infer_msg(op, inferred, msg, sizeof msg) != MOEC_OK)
        return perr(p, start.line, start.col, "%s", msg);
    for (int i = 0; i < n_res; i++) {
        if (!ir_type_equal(&inferred[i], &res[i].type)) {
            char have[96], want[96];
            ir_type_format(&res[i].type, have, sizeof have);
            ir_type_format(&inferred[i], want, sizeof want);
            return perr(p, res[i].type_tok.line, res[i].type_tok.col,
                        "%%%s: %s: declared type %s, inferred %s", op->out[i]->name, opname,
                        have, want);
        }
    }
    return MOEC_OK;
}

static moec_status parse_module(parser *p)
{
    token *t = &p->tok;
    MOEC_TRY(next(p));
    MOEC_TRY(skip_newlines(p));
    if (!tok_is(t, TK_IDENT, "module")) {
        char found[64];
        tok_desc(t, found, sizeof found);
        return PERR(p, "expected 'module', found %s", found);
    }
    MOEC_TRY(next(p));
    if (t->kind != TK_IDENT) {
        char found[64];
        tok_desc(t, found, sizeof found);
        return PERR(p, "expected the module name, found %s", found);
    }
    if (!(p->m->name = arena_strndup(p, t->text, t->len)))
        return oom(p);
    MOEC_TRY(next(p));
    MOEC_TRY(expect(p, TK_LBRACE, "'{' after the module name"));
    for (;;) {
        if (t->kind != TK_NEWLINE) {
            char found[64];
            tok_desc(t, found, sizeof found);
            return PERR(p, "expected end of line, found %s", found);
        }
        MOEC_TRY(skip_newlines(p));
        if (t->kind == TK_RBRACE)
            break;
        if (t->kind == TK_EOF)
            return PERR(p, "expected '}' at the end of the module");
        if (tok_is(t, TK_IDENT, "meta"))
            MOEC_TRY(parse_meta(p));
        else if (tok_is(t, TK_IDENT, "input"))
            MOEC_TRY(parse_input(p));
        else if (tok_is(t, TK_IDENT, "weight"))
            MOEC_TRY(parse_weight(p));
        else if (tok_is(t, TK_IDENT, "output"))
            MOEC_TRY(parse_output(p));
        else if (t->kind == TK_VALUE)
            MOEC_TRY(parse_op(p));
        else {
            char found[64];
            tok_desc(t, found, sizeof found);
            return PERR(p, "expected meta, input, weight, output, an op or '}', found %s", found);
        }
    }
    if (p->m->n_outputs == 0)
        return PERR(p, "module has no outputs");
    MOEC_TRY(next(p));
    MOEC_TRY(skip_newlines(p));
    if (t->kind != TK_EOF) {
        char found[64];
        tok_desc(t, found, sizeof found);
        return PERR(p, "expected end of file after the module's '}', found %s", found);
    }
    return MOEC_OK;
}

moec_status ir_module_parse(const char *text, const char *filename, ir_module **out)
{
    if (!out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "parse: null output");
    *out = NULL;
    if (!filename)
        filename = "<input>";
    if (!text)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: null text", filename);
    parser p = {.src = text, .line = 1, .col = 1, .file = filename};
    p.m = ir_module_init("");
    if (!p.m)
        return MOEC_ERR(MOEC_ERR_OOM, "%s: out of memory", filename);
    if (ir_name_map_init(&p.names, 256)) {
        ir_module_free(p.m);
        return MOEC_ERR(MOEC_ERR_OOM, "%s: out of memory", filename);
    }
    moec_status st = parse_module(&p);
    ir_name_map_free(&p.names);
    if (st == MOEC_OK && ir_module_verify(p.m) != MOEC_OK)
        st = moec_err_wrap(MOEC_ERR_FORMAT, "%s", filename);
    if (st != MOEC_OK) {
        ir_module_free(p.m);
        return st == MOEC_ERR_OOM ? st : MOEC_ERR_FORMAT;
    }
    *out = p.m;
    return MOEC_OK;
}
