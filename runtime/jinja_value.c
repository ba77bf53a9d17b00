/* jinja_value.c — the values a chat template computes with, as Python has
 * them (jinja2 renders Python objects): the render's arena and its error,
 * Undefined, strings, lists, dicts, equality and order, truth, and the
 * three ways to write a value out — str(), repr() and transformers' tojson
 * (json.dumps) — byte for byte as Python writes them. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "err.h"
#include "runtime/jinja.h"

/* ---- the arena -------------------------------------------------------------------------- */

struct jinja_chunk {
    jinja_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *jinja_alloc(jinja_ctx *c, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!n)
        n = 16;
    jinja_chunk *k = c->chunks;
    if (!k || k->cap - k->used < n) {
        size_t cap = n > ((size_t)64 << 10) ? n : (size_t)64 << 10;
        if (c->used + cap > c->lim.max_memory) {
            JFAIL(c, 0, MOEC_ERR_CAPACITY, "rendering needs more than the %zu MiB of memory a render may take",
                  c->lim.max_memory >> 20);
            return NULL;
        }
        k = malloc(sizeof *k + cap);
        if (!k) {
            JFAIL(c, 0, MOEC_ERR_OOM, "out of memory");
            return NULL;
        }
        k->next = c->chunks;
        k->used = 0;
        k->cap = cap;
        c->chunks = k;
        c->used += cap;
    }
    void *p = k->data + k->used;
    k->used += n;
    memset(p, 0, n);
    return p;
}

void *jinja_grow(jinja_ctx *c, const void *p, size_t n, size_t cap, size_t elem)
{
    if (cap > ((size_t)-1) / 2 / elem) {
        JFAIL(c, 0, MOEC_ERR_CAPACITY, "an array of %zu items", cap);
        return NULL;
    }
    void *q = jinja_alloc(c, cap * elem);
    if (q && n)
        memcpy(q, p, n * elem);
    return q;
}

void jinja_arena_free(jinja_ctx *c)
{
    while (c->chunks) {
        jinja_chunk *k = c->chunks;
        c->chunks = k->next;
        free(k);
    }
}

int jinja_fail(jinja_ctx *c, const char *file, int cline, int line, moec_status st, const char *fmt, ...)
{
    if (c->status != MOEC_OK) /* the first error stands */
        return -1;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->status = st;
    if (line > 0)
        moec_err_set(st, file, cline, "chat template line %d: %s", line, msg);
    else
        moec_err_set(st, file, cline, "chat template: %s", msg);
    return -1;
}

/* ---- UTF-8 -------------------------------------------------------------------------------- */

int jinja_utf8_next(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    unsigned b = u[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    int need = b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3 : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
    if (!need || (size_t)need > n)
        goto bad;
    unsigned lo = b == 0xe0 ? 0xa0 : b == 0xf0 ? 0x90 : 0x80, hi = b == 0xed ? 0x9f : b == 0xf4 ? 0x8f : 0xbf;
    uint32_t v = b & (0x7f >> need);
    for (int k = 1; k < need; k++, lo = 0x80, hi = 0xbf) {
        if (u[k] < lo || u[k] > hi)
            goto bad;
        v = v << 6 | (u[k] & 0x3f);
    }
    *cp = v;
    return need;
bad:
    *cp = 0xfffd;
    return 1;
}

void jinja_utf8_put(moec_buf *b, uint32_t cp)
{
    char s[4];
    int n;
    if (cp < 0x80) {
        s[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        s[0] = (char)(0xc0 | cp >> 6);
        s[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        s[0] = (char)(0xe0 | cp >> 12);
        s[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        s[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        s[0] = (char)(0xf0 | cp >> 18);
        s[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        s[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        s[3] = (char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    moec_buf_put(b, s, (size_t)n);
}

size_t jinja_utf8_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; k++) {
        uint32_t cp;
        i += (size_t)jinja_utf8_next(s + i, n - i, &cp);
    }
    return k;
}

int jinja_is_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

/* ---- making values ---------------------------------------------------------------------- */

jinja_value jinja_undefined(jinja_ctx *c, const char *fmt, ...)
{
    jinja_value v = {.kind = JV_UNDEF};
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0)
        return v;
    if ((size_t)n >= sizeof msg)
        n = sizeof msg - 1;
    char *p = jinja_alloc(c, (size_t)n + 1);
    if (p) {
        memcpy(p, msg, (size_t)n);
        v.u.s.p = p;
        v.u.s.n = (size_t)n;
    }
    return v;
}

int jinja_fail_undefined(jinja_ctx *c, int line, const jinja_value *v)
{
    if (v->u.s.p)
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "%.*s", (int)v->u.s.n, v->u.s.p);
    return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "an undefined value is used");
}

int jinja_new_str(jinja_ctx *c, int line, const char *p, size_t n, jinja_value *out)
{
    if (n > c->lim.max_output)
        return JFAIL(c, line, MOEC_ERR_CAPACITY, "a string of %zu bytes, more than the %zu a render may make", n,
                     c->lim.max_output);
    char *s = jinja_alloc(c, n + 1);
    if (!s)
        return -1;
    if (n)
        memcpy(s, p, n);
    *out = jinja_str_value(s, n);
    return 0;
}

int jinja_buf_to_str(jinja_ctx *c, int line, moec_buf *b, jinja_value *out)
{
    int rc = b->oom ? JFAIL(c, line, MOEC_ERR_OOM, "out of memory") : jinja_new_str(c, line, b->data, b->len, out);
    moec_buf_free(b);
    return rc;
}

int jinja_new_list(jinja_ctx *c, size_t n, jinja_value *out)
{
    jinja_list *l = jinja_alloc(c, sizeof *l);
    if (!l || (n && n > ((size_t)-1) / sizeof(jinja_value) / 2) || !(l->v = jinja_alloc(c, n * sizeof *l->v)))
        return l ? JFAIL(c, 0, MOEC_ERR_CAPACITY, "a list of %zu items", n) : -1;
    l->n = n;
    *out = (jinja_value){.kind = JV_LIST, .u.l = l};
    return 0;
}

int jinja_new_dict(jinja_ctx *c, size_t cap, jinja_kind kind, jinja_value *out)
{
    jinja_dict *d = jinja_alloc(c, sizeof *d);
    if (!d)
        return -1;
    if (cap < 4)
        cap = 4;
    if (!(d->k = jinja_alloc(c, cap * sizeof *d->k)) || !(d->v = jinja_alloc(c, cap * sizeof *d->v)))
        return -1;
    d->cap = cap;
    *out = (jinja_value){.kind = (uint8_t)kind, .u.d = d};
    return 0;
}

int jinja_dict_set(jinja_ctx *c, jinja_dict *d, jinja_value key, jinja_value val)
{
    for (size_t i = 0; i < d->n; i++)
        if (jinja_equal(&d->k[i], &key)) {
            d->v[i] = val;
            return 0;
        }
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 4;
        if (!(d->k = jinja_grow(c, d->k, d->n, d->cap, sizeof *d->k)) ||
            !(d->v = jinja_grow(c, d->v, d->n, d->cap, sizeof *d->v)))
            return -1;
    }
    d->k[d->n] = key;
    d->v[d->n++] = val;
    return 0;
}

const jinja_value *jinja_dict_get(const jinja_dict *d, const char *key, size_t n)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].kind == JV_STR && d->k[i].u.s.n == n && !memcmp(d->k[i].u.s.p, key, n))
            return &d->v[i];
    return NULL;
}

const jinja_value *jinja_dict_find(const jinja_dict *d, const jinja_value *key)
{
    for (size_t i = 0; i < d->n; i++)
        if (jinja_equal(&d->k[i], key))
            return &d->v[i];
    return NULL;
}

int jinja_from_json(jinja_ctx *c, const cJSON *j, jinja_value *out)
{
    if (cJSON_IsNull(j)) {
        *out = jinja_none();
    } else if (cJSON_IsBool(j)) {
        *out = jinja_bool(cJSON_IsTrue(j));
    } else if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        *out = d == floor(d) && fabs(d) <= 9007199254740992.0 ? jinja_int((int64_t)d) : jinja_float(d);
    } else if (cJSON_IsString(j)) {
        return jinja_new_str(c, 0, j->valuestring, strlen(j->valuestring), out);
    } else if (cJSON_IsArray(j)) {
        if (jinja_new_list(c, (size_t)cJSON_GetArraySize(j), out))
            return -1;
        size_t i = 0;
        for (const cJSON *e = j->child; e; e = e->next)
            if (jinja_from_json(c, e, &out->u.l->v[i++]))
                return -1;
    } else if (cJSON_IsObject(j)) {
        if (jinja_new_dict(c, (size_t)cJSON_GetArraySize(j), JV_DICT, out))
            return -1;
        for (const cJSON *e = j->child; e; e = e->next) {
            jinja_value k, v;
            if (jinja_new_str(c, 0, e->string, strlen(e->string), &k) || jinja_from_json(c, e, &v) ||
                jinja_dict_set(c, out->u.d, k, v))
                return -1;
        }
    } else {
        return JFAIL(c, 0, MOEC_ERR_INVALID_ARG, "a JSON value of an unknown kind");
    }
    return 0;
}

/* ---- what values are -------------------------------------------------------------------- */

const char *jinja_type_name(const jinja_value *v)
{
    switch ((jinja_kind)v->kind) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v->tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_LOOP: return "LoopContext";
    case JV_FUNC: return "function";
    case JV_MACRO: return "Macro";
    case JV_METHOD: return "builtin_function_or_method";
    }
    return "object";
}

int jinja_truthy(const jinja_value *v)
{
    switch ((jinja_kind)v->kind) {
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0;
    case JV_STR: return v->u.s.n != 0;
    case JV_LIST: return v->u.l->n != 0;
    case JV_DICT: return v->u.d->n != 0;
    default: return 1;
    }
}

static int is_number(const jinja_value *v) { return v->kind == JV_BOOL || v->kind == JV_INT || v->kind == JV_FLOAT; }
static double as_double(const jinja_value *v)
{
    return v->kind == JV_FLOAT ? v->u.f : v->kind == JV_INT ? (double)v->u.i : (double)v->u.b;
}
static int64_t as_int(const jinja_value *v) { return v->kind == JV_INT ? v->u.i : v->u.b; }

/* Values nest at most this deep where equality, order and writing them
 * out recurse (a template can nest lists in a loop; the stack cannot). */
#define VALUE_MAX_DEPTH 1000

static int equal_at(const jinja_value *a, const jinja_value *b, int depth);

int jinja_equal(const jinja_value *a, const jinja_value *b) { return equal_at(a, b, 0); }

/* Beyond VALUE_MAX_DEPTH, containers are equal only when they are the same. */
static int equal_at(const jinja_value *a, const jinja_value *b, int depth)
{
    if (is_number(a) && is_number(b)) {
        if (a->kind == JV_FLOAT || b->kind == JV_FLOAT)
            return as_double(a) == as_double(b);
        return as_int(a) == as_int(b);
    }
    if (a->kind != b->kind)
        return 0;
    switch ((jinja_kind)a->kind) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR: return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
    case JV_LIST:
        if (a->tuple != b->tuple || a->u.l->n != b->u.l->n)
            return 0;
        if (a->u.l == b->u.l || depth >= VALUE_MAX_DEPTH)
            return a->u.l == b->u.l;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!equal_at(&a->u.l->v[i], &b->u.l->v[i], depth + 1))
                return 0;
        return 1;
    case JV_DICT:
        if (a->u.d->n != b->u.d->n)
            return 0;
        if (a->u.d == b->u.d || depth >= VALUE_MAX_DEPTH)
            return a->u.d == b->u.d;
        for (size_t i = 0; i < a->u.d->n; i++) {
            const jinja_value *o = jinja_dict_find(b->u.d, &a->u.d->k[i]);
            if (!o || !equal_at(&a->u.d->v[i], o, depth + 1))
                return 0;
        }
        return 1;
    case JV_NS: return a->u.d == b->u.d;
    case JV_LOOP: return a->u.loop == b->u.loop;
    case JV_FUNC: return a->id == b->id;
    case JV_MACRO: return a->u.macro == b->u.macro;
    case JV_METHOD: return a->id == b->id && equal_at(a->u.self, b->u.self, depth + 1);
    default: return 0;
    }
}

/* -1, 0, 1 as a compares with b; 2 when they do not order (or nest
 * beyond VALUE_MAX_DEPTH). */
static int cmp3_at(const jinja_value *a, const jinja_value *b, int depth)
{
    if (is_number(a) && is_number(b)) {
        if (a->kind == JV_FLOAT || b->kind == JV_FLOAT) {
            double x = as_double(a), y = as_double(b);
            return x < y ? -1 : x > y ? 1 : x == y ? 0 : 3; /* 3: NaN, every comparison false */
        }
        int64_t x = as_int(a), y = as_int(b);
        return x < y ? -1 : x > y;
    }
    if (a->kind == JV_STR && b->kind == JV_STR) { /* UTF-8 orders as code points */
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int r = memcmp(a->u.s.p, b->u.s.p, n);
        return r < 0 ? -1 : r > 0 ? 1 : a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
    }
    if (a->kind == JV_LIST && b->kind == JV_LIST && a->tuple == b->tuple && depth < VALUE_MAX_DEPTH) {
        for (size_t i = 0; i < a->u.l->n && i < b->u.l->n; i++) {
            if (equal_at(&a->u.l->v[i], &b->u.l->v[i], depth + 1))
                continue;
            return cmp3_at(&a->u.l->v[i], &b->u.l->v[i], depth + 1);
        }
        return a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n;
    }
    return 2;
}

static int cmp3(const jinja_value *a, const jinja_value *b) { return cmp3_at(a, b, 0); }

int jinja_order(jinja_ctx *c, int line, int op, const jinja_value *a, const jinja_value *b, int *res)
{
    int r = cmp3(a, b);
    const char *sym = op == '<' ? "<" : op == JOP_LE ? "<=" : op == '>' ? ">" : ">=";
    if (r == 2) {
        if (a->kind == JV_UNDEF)
            return jinja_fail_undefined(c, line, a);
        if (b->kind == JV_UNDEF)
            return jinja_fail_undefined(c, line, b);
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "'%s' not supported between instances of '%s' and '%s'", sym,
                     jinja_type_name(a), jinja_type_name(b));
    }
    *res = r == 3 ? 0 : op == '<' ? r < 0 : op == JOP_LE ? r <= 0 : op == '>' ? r > 0 : r >= 0;
    return 0;
}

/* ---- writing values out ------------------------------------------------------------------- */

void jinja_float_repr(double f, char *buf)
{
    if (isnan(f)) {
        strcpy(buf, "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(buf, f < 0 ? "-inf" : "inf");
        return;
    }
    if (f == 0) {
        strcpy(buf, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) { /* the fewest digits that read back */
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    const char *p = tmp;
    char *o = buf, digits[24];
    int nd = 0;
    if (*p == '-') {
        *o++ = '-';
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    if (exp >= -4 && exp < 16) { /* Python's repr: positional notation */
        if (exp < 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -exp - 1; i++)
                *o++ = '0';
            for (int i = 0; i < nd; i++)
                *o++ = digits[i];
        } else {
            for (int i = 0; i <= exp; i++)
                *o++ = i < nd ? digits[i] : '0';
            *o++ = '.';
            if (nd > exp + 1)
                for (int i = exp + 1; i < nd; i++)
                    *o++ = digits[i];
            else
                *o++ = '0';
        }
        *o = 0;
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            for (int i = 1; i < nd; i++)
                *o++ = digits[i];
        }
        sprintf(o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

/* Python's str.isprintable() for one code point. */
static int printable(uint32_t cp)
{
    if (cp == ' ')
        return 1;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return 0;
    default: return 1;
    }
}

static void write_str_repr(moec_buf *b, const char *s, size_t n)
{
    int has_single = memchr(s, '\'', n) != NULL, has_double = memchr(s, '"', n) != NULL;
    char q = has_single && !has_double ? '"' : '\'';
    moec_buf_put(b, &q, 1);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = jinja_utf8_next(s + i, n - i, &cp);
        if (cp == (uint32_t)q || cp == '\\') {
            moec_buf_put(b, "\\", 1);
            moec_buf_put(b, s + i, 1);
        } else if (cp == '\t' || cp == '\n' || cp == '\r') {
            moec_buf_str(b, cp == '\t' ? "\\t" : cp == '\n' ? "\\n" : "\\r");
        } else if (cp < 0x20 || cp == 0x7f) {
            moec_buf_printf(b, "\\x%02x", cp);
        } else if (cp < 0x7f || printable(cp)) {
            moec_buf_put(b, s + i, (size_t)k);
        } else {
            moec_buf_printf(b, cp <= 0xff ? "\\x%02x" : cp <= 0xffff ? "\\u%04x" : "\\U%08x", cp);
        }
        i += (size_t)k;
    }
    moec_buf_put(b, &q, 1);
}

static int write_value(jinja_ctx *c, int line, moec_buf *b, const jinja_value *v, int repr, int depth);

static int write_items(jinja_ctx *c, int line, moec_buf *b, const jinja_value *v, int depth)
{
    if (v->kind == JV_LIST) {
        const jinja_list *l = v->u.l;
        moec_buf_put(b, v->tuple ? "(" : "[", 1);
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                moec_buf_put(b, ", ", 2);
            if (write_value(c, line, b, &l->v[i], 1, depth + 1))
                return -1;
        }
        if (v->tuple && l->n == 1)
            moec_buf_put(b, ",", 1);
        moec_buf_put(b, v->tuple ? ")" : "]", 1);
        return 0;
    }
    const jinja_dict *d = v->u.d;
    moec_buf_put(b, "{", 1);
    for (size_t i = 0; i < d->n; i++) {
        if (i)
            moec_buf_put(b, ", ", 2);
        if (write_value(c, line, b, &d->k[i], 1, depth + 1))
            return -1;
        moec_buf_put(b, ": ", 2);
        if (write_value(c, line, b, &d->v[i], 1, depth + 1))
            return -1;
    }
    moec_buf_put(b, "}", 1);
    return 0;
}

/* The bounds of writing a value out: its text's length and its nesting. */
static int write_bounds(jinja_ctx *c, int line, const moec_buf *b, int depth)
{
    if (b->len > c->lim.max_output)
        return JFAIL(c, line, MOEC_ERR_CAPACITY, "a value's text is longer than the %zu bytes a render may make",
                     c->lim.max_output);
    if (depth > VALUE_MAX_DEPTH)
        return JFAIL(c, line, MOEC_ERR_CAPACITY, "a value nested more than %d deep", VALUE_MAX_DEPTH);
    return 0;
}

static int write_value(jinja_ctx *c, int line, moec_buf *b, const jinja_value *v, int repr, int depth)
{
    char num[40];
    if (write_bounds(c, line, b, depth))
        return -1;
    switch ((jinja_kind)v->kind) {
    case JV_UNDEF:
        if (repr)
            moec_buf_str(b, "Undefined");
        return 0;
    case JV_NONE: moec_buf_str(b, "None"); return 0;
    case JV_BOOL: moec_buf_str(b, v->u.b ? "True" : "False"); return 0;
    case JV_INT: moec_buf_printf(b, "%lld", (long long)v->u.i); return 0;
    case JV_FLOAT:
        jinja_float_repr(v->u.f, num);
        moec_buf_str(b, num);
        return 0;
    case JV_STR:
        if (repr)
            write_str_repr(b, v->u.s.p, v->u.s.n);
        else
            moec_buf_put(b, v->u.s.p, v->u.s.n);
        return 0;
    case JV_LIST:
    case JV_DICT: return write_items(c, line, b, v, depth);
    case JV_NS: {
        moec_buf_str(b, "<Namespace ");
        jinja_value d = *v;
        d.kind = JV_DICT;
        if (write_items(c, line, b, &d, depth))
            return -1;
        moec_buf_str(b, ">");
        return 0;
    }
    case JV_LOOP:
        moec_buf_printf(b, "<LoopContext %zu/%zu>", v->u.loop->i + 1, v->u.loop->items->n);
        return 0;
    default:
        return JFAIL(c, line, MOEC_ERR_UNSUPPORTED, "a %s cannot be written out (Python would print its address)",
                     jinja_type_name(v));
    }
}

int jinja_write_str(jinja_ctx *c, int line, moec_buf *b, const jinja_value *v)
{
    return write_value(c, line, b, v, 0, 0);
}

int jinja_write_repr(jinja_ctx *c, int line, moec_buf *b, const jinja_value *v)
{
    return write_value(c, line, b, v, 1, 0);
}

int jinja_to_str(jinja_ctx *c, int line, const jinja_value *v, jinja_value *out)
{
    if (v->kind == JV_STR) {
        *out = *v;
        return 0;
    }
    moec_buf b = {0};
    if (jinja_write_str(c, line, &b, v)) {
        moec_buf_free(&b);
        return -1;
    }
    return jinja_buf_to_str(c, line, &b, out);
}

/* ---- JSON, as Python's json.dumps writes it ------------------------------------------------ */

static void json_string(moec_buf *b, const char *s, size_t n, int ensure_ascii)
{
    moec_buf_put(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = jinja_utf8_next(s + i, n - i, &cp);
        switch (cp) {
        case '"': moec_buf_str(b, "\\\""); break;
        case '\\': moec_buf_str(b, "\\\\"); break;
        case '\n': moec_buf_str(b, "\\n"); break;
        case '\r': moec_buf_str(b, "\\r"); break;
        case '\t': moec_buf_str(b, "\\t"); break;
        case '\b': moec_buf_str(b, "\\b"); break;
        case '\f': moec_buf_str(b, "\\f"); break;
        default:
            if (cp < 0x20 || (ensure_ascii && cp > 0x7e && cp != 0x7f)) {
                if (cp >= 0x10000)
                    moec_buf_printf(b, "\\u%04x\\u%04x", 0xd800 + ((cp - 0x10000) >> 10),
                                    0xdc00 + ((cp - 0x10000) & 0x3ff));
                else
                    moec_buf_printf(b, "\\u%04x", cp);
            } else {
                moec_buf_put(b, s + i, (size_t)k);
            }
        }
        i += (size_t)k;
    }
    moec_buf_put(b, "\"", 1);
}

static void json_newline(moec_buf *b, int indent, int level)
{
    moec_buf_put(b, "\n", 1);
    for (int i = 0; i < indent * level; i++)
        moec_buf_put(b, " ", 1);
}

/* A dict key as json.dumps turns it into a string. */
static int json_key(jinja_ctx *c, int line, moec_buf *b, const jinja_value *k, int ensure_ascii)
{
    char num[40];
    switch ((jinja_kind)k->kind) {
    case JV_STR: json_string(b, k->u.s.p, k->u.s.n, ensure_ascii); return 0;
    case JV_NONE: moec_buf_str(b, "\"null\""); return 0;
    case JV_BOOL: moec_buf_str(b, k->u.b ? "\"true\"" : "\"false\""); return 0;
    case JV_INT: moec_buf_printf(b, "\"%lld\"", (long long)k->u.i); return 0;
    case JV_FLOAT:
        jinja_float_repr(k->u.f, num);
        moec_buf_printf(b, "\"%s\"", !strcmp(num, "nan") ? "NaN" : !strcmp(num, "inf") ? "Infinity"
                                     : !strcmp(num, "-inf")                              ? "-Infinity"
                                                                                         : num);
        return 0;
    default:
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "tojson: keys must be str, int, float, bool or None, not %s",
                     jinja_type_name(k));
    }
}

int jinja_write_json(jinja_ctx *c, int line, moec_buf *b, const jinja_value *v, int ensure_ascii, int indent,
                     int sort_keys, int level)
{
    char num[40];
    if (write_bounds(c, line, b, level))
        return -1;
    switch ((jinja_kind)v->kind) {
    case JV_NONE: moec_buf_str(b, "null"); return 0;
    case JV_BOOL: moec_buf_str(b, v->u.b ? "true" : "false"); return 0;
    case JV_INT: moec_buf_printf(b, "%lld", (long long)v->u.i); return 0;
    case JV_FLOAT:
        jinja_float_repr(v->u.f, num);
        moec_buf_str(b, !strcmp(num, "nan") ? "NaN" : !strcmp(num, "inf") ? "Infinity"
                                           : !strcmp(num, "-inf")        ? "-Infinity"
                                                                         : num);
        return 0;
    case JV_STR: json_string(b, v->u.s.p, v->u.s.n, ensure_ascii); return 0;
    case JV_LIST: {
        const jinja_list *l = v->u.l;
        if (!l->n) {
            moec_buf_str(b, "[]");
            return 0;
        }
        moec_buf_put(b, "[", 1);
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                moec_buf_str(b, indent >= 0 ? "," : ", ");
            if (indent >= 0)
                json_newline(b, indent, level + 1);
            if (jinja_write_json(c, line, b, &l->v[i], ensure_ascii, indent, sort_keys, level + 1))
                return -1;
        }
        if (indent >= 0)
            json_newline(b, indent, level);
        moec_buf_put(b, "]", 1);
        return 0;
    }
    case JV_DICT: {
        const jinja_dict *d = v->u.d;
        if (!d->n) {
            moec_buf_str(b, "{}");
            return 0;
        }
        size_t *order = jinja_alloc(c, d->n * sizeof *order);
        if (!order)
            return -1;
        for (size_t i = 0; i < d->n; i++)
            order[i] = i;
        if (sort_keys) {
            for (size_t i = 1; i < d->n; i++)
                if (cmp3(&d->k[0], &d->k[i]) == 2)
                    return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "tojson: sort_keys with keys of mixed types");
            for (size_t i = 1; i < d->n; i++) /* insertion sort: stable, and dicts are small */
                for (size_t j = i; j > 0 && cmp3(&d->k[order[j - 1]], &d->k[order[j]]) == 1; j--) {
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        }
        moec_buf_put(b, "{", 1);
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                moec_buf_str(b, indent >= 0 ? "," : ", ");
            if (indent >= 0)
                json_newline(b, indent, level + 1);
            if (json_key(c, line, b, &d->k[order[i]], ensure_ascii))
                return -1;
            moec_buf_str(b, ": ");
            if (jinja_write_json(c, line, b, &d->v[order[i]], ensure_ascii, indent, sort_keys, level + 1))
                return -1;
        }
        if (indent >= 0)
            json_newline(b, indent, level);
        moec_buf_put(b, "}", 1);
        return 0;
    }
    default:
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "tojson: Object of type %s is not JSON serializable",
                     jinja_type_name(v));
    }
}
