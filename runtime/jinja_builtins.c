/* jinja_builtins.c — what a chat template reaches by name: attributes and
 * items as jinja2's sandbox resolves them, the methods of str, dict and
 * list that templates call (with Python's semantics), jinja2's filters and
 * tests, and the globals of transformers' environment (range, namespace,
 * dict, raise_exception, strftime_now). A Jinja built-in or Python method
 * moec lacks is an error saying it is not supported; a name that is none
 * is an error saying it is unknown. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "runtime/jinja.h"

/* ---- arguments ---------------------------------------------------------------------------- */

typedef struct jargs {
    const jinja_value *a;
    size_t n;
    const jinja_str *kn;
    const jinja_value *kv;
    size_t nk;
} jargs;

static int name_is(const jinja_str *s, const char *name)
{
    return s->n == strlen(name) && !memcmp(s->p, name, s->n);
}

/* Checks a call against its signature: at most max_pos positional
 * arguments, keywords among names (the parameters in order; a keyword may
 * not repeat a positional one). */
static int check_args(jinja_ctx *c, int line, const char *who, const jargs *A, size_t max_pos,
                      const char *const *names)
{
    if (A->n > max_pos)
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "%s takes at most %zu argument(s), %zu given", who, max_pos, A->n);
    for (size_t k = 0; k < A->nk; k++) {
        size_t i = 0;
        while (names && names[i] && !name_is(&A->kn[k], names[i]))
            i++;
        if (!names || !names[i])
            return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "%s got an unexpected keyword argument '%.*s'", who,
                         (int)A->kn[k].n, A->kn[k].p);
        if (i < A->n)
            return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "%s got multiple values for argument '%s'", who, names[i]);
    }
    return 0;
}

/* The argument at position pos, or the keyword `name`: 1 when given. */
static int get_arg(const jargs *A, size_t pos, const char *name, jinja_value *out)
{
    if (pos < A->n) {
        *out = A->a[pos];
        return 1;
    }
    for (size_t k = 0; name && k < A->nk; k++)
        if (name_is(&A->kn[k], name)) {
            *out = A->kv[k];
            return 1;
        }
    return 0;
}

static int want_int(jinja_ctx *c, int line, const jinja_value *v, const char *what, int64_t *out)
{
    if (v->kind == JV_INT || v->kind == JV_BOOL) {
        *out = v->kind == JV_INT ? v->u.i : v->u.b;
        return 0;
    }
    if (v->kind == JV_UNDEF)
        return jinja_fail_undefined(c, line, v);
    return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "%s must be an integer, not %s", what, jinja_type_name(v));
}

/* ---- strings ------------------------------------------------------------------------------ */

static int str_result(jinja_ctx *c, int line, moec_buf *b, jinja_value *out)
{
    return jinja_buf_to_str(c, line, b, out);
}

/* Is cp among the code points of set (strip's chars; NULL: whitespace)? */
static int in_set(uint32_t cp, const jinja_str *set)
{
    if (!set)
        return jinja_is_space(cp);
    for (size_t i = 0; i < set->n;) {
        uint32_t x;
        i += (size_t)jinja_utf8_next(set->p + i, set->n - i, &x);
        if (x == cp)
            return 1;
    }
    return 0;
}

/* The start of the code point that ends at s[end] (end > 0). */
static size_t cp_before(const char *s, size_t end)
{
    size_t b = end - 1;
    while (b > 0 && end - b < 4 && ((unsigned char)s[b] & 0xc0) == 0x80)
        b--;
    uint32_t cp;
    return (size_t)jinja_utf8_next(s + b, end - b, &cp) == end - b ? b : end - 1;
}

static int space_before(const char *s, size_t end)
{
    uint32_t cp;
    size_t b = cp_before(s, end);
    jinja_utf8_next(s + b, end - b, &cp);
    return jinja_is_space(cp);
}

static int space_at(const char *s, size_t n, size_t i, size_t *len)
{
    uint32_t cp;
    *len = (size_t)jinja_utf8_next(s + i, n - i, &cp);
    return jinja_is_space(cp);
}

/* A growing list of views into a string (split's parts). */
typedef struct strvec {
    jinja_str *v;
    size_t n, cap;
} strvec;

static int sv_push(jinja_ctx *c, strvec *sv, const char *p, size_t n)
{
    if (sv->n == sv->cap) {
        sv->cap = sv->cap ? sv->cap * 2 : 8;
        if (!(sv->v = jinja_grow(c, sv->v, sv->n, sv->cap, sizeof *sv->v)))
            return -1;
    }
    sv->v[sv->n++] = (jinja_str){p, n};
    return 0;
}

/* The parts as a list of strings (in reverse order when `reverse`). */
static int sv_list(jinja_ctx *c, const strvec *sv, int reverse, jinja_value *out)
{
    if (jinja_new_list(c, sv->n, out))
        return -1;
    for (size_t i = 0; i < sv->n; i++) {
        const jinja_str *x = &sv->v[reverse ? sv->n - 1 - i : i];
        out->u.l->v[i] = jinja_str_value(x->p, x->n);
    }
    return 0;
}

/* s stripped of set's code points (NULL: whitespace) on the left and/or right. */
static jinja_value strip(const jinja_value *s, const jinja_str *set, int left, int right)
{
    const char *p = s->u.s.p;
    size_t start = 0, end = s->u.s.n;
    while (left && start < end) {
        uint32_t cp;
        int k = jinja_utf8_next(p + start, end - start, &cp);
        if (!in_set(cp, set))
            break;
        start += (size_t)k;
    }
    while (right && end > start) {
        size_t b = cp_before(p, end);
        uint32_t cp;
        if (b < start)
            b = end - 1;
        jinja_utf8_next(p + b, end - b, &cp);
        if (!in_set(cp, set))
            break;
        end = b;
    }
    jinja_value v = jinja_str_value(p + start, end - start);
    v.tuple = s->tuple;
    return v;
}

static int is_cased(uint32_t cp)
{
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

enum { CASE_LOWER, CASE_UPPER, CASE_TITLE, CASE_CAPITALIZE, CASE_JINJA_TITLE };

/* str.lower(), .upper(), .title(), .capitalize() and jinja2's title
 * filter (each word, cut at runs of - whitespace ( { [ <, gets an upper
 * first character and lower others), by code point. */
static int change_case(jinja_ctx *c, int line, const jinja_str *s, int how, jinja_value *out)
{
    moec_buf b = {0};
    int prev_cased = 0, first = 1;
    for (size_t i = 0; i < s->n;) {
        uint32_t cp, r;
        i += (size_t)jinja_utf8_next(s->p + i, s->n - i, &cp);
        switch (how) {
        case CASE_LOWER: r = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp); break;
        case CASE_UPPER: r = (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp); break;
        case CASE_TITLE:
            r = (uint32_t)(prev_cased ? utf8proc_tolower((utf8proc_int32_t)cp) : utf8proc_totitle((utf8proc_int32_t)cp));
            prev_cased = is_cased(cp);
            break;
        case CASE_CAPITALIZE:
            r = (uint32_t)(first ? utf8proc_totitle((utf8proc_int32_t)cp) : utf8proc_tolower((utf8proc_int32_t)cp));
            break;
        default: { /* jinja2's do_title */
            int sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || jinja_is_space(cp);
            r = sep ? cp : (uint32_t)(first ? utf8proc_toupper((utf8proc_int32_t)cp) : utf8proc_tolower((utf8proc_int32_t)cp));
            first = sep;
            jinja_utf8_put(&b, r);
            continue;
        }
        }
        first = 0;
        jinja_utf8_put(&b, r);
    }
    return str_result(c, line, &b, out);
}

/* The byte offset of the first (last) occurrence of sub in s[from..to), or -1. */
static long long find_bytes(const jinja_str *s, const jinja_str *sub, size_t from, size_t to, int last)
{
    if (sub->n > to - from || to < from)
        return sub->n == 0 && from <= to ? (long long)(last ? to : from) : -1;
    long long hit = -1;
    for (size_t i = from; i + sub->n <= to; i++)
        if (!memcmp(s->p + i, sub->p, sub->n)) {
            hit = (long long)i;
            if (!last)
                break;
        }
    return hit;
}

/* str.split / rsplit (sep NULL: runs of whitespace), at most maxsplit
 * cuts (< 0: all); with maxsplit reached, the rest is one part (keeping
 * its whitespace on the far side, as Python does). */
static int split(jinja_ctx *c, int line, const jinja_str *s, const jinja_str *sep, int64_t maxsplit, int right,
                 jinja_value *out)
{
    strvec parts = {0};
    int64_t cuts = 0;
    size_t k;
    if (sep && !sep->n)
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "empty separator");
    if (sep) {
        size_t lo = 0, hi = s->n; /* what is left to cut */
        for (;; cuts++) {
            long long at = maxsplit < 0 || cuts < maxsplit ? find_bytes(s, sep, lo, hi, right) : -1;
            if (at < 0)
                return sv_push(c, &parts, s->p + lo, hi - lo) || sv_list(c, &parts, right, out);
            if (right ? sv_push(c, &parts, s->p + at + sep->n, hi - (size_t)at - sep->n)
                      : sv_push(c, &parts, s->p + lo, (size_t)at - lo))
                return -1;
            if (right)
                hi = (size_t)at;
            else
                lo = (size_t)at + sep->n;
        }
    }
    if (!right) {
        for (size_t i = 0;; cuts++) {
            while (i < s->n && space_at(s->p, s->n, i, &k))
                i += k;
            if (i >= s->n)
                break;
            if (maxsplit >= 0 && cuts == maxsplit) {
                if (sv_push(c, &parts, s->p + i, s->n - i))
                    return -1;
                break;
            }
            size_t start = i;
            while (i < s->n && !space_at(s->p, s->n, i, &k))
                i += k;
            if (sv_push(c, &parts, s->p + start, i - start))
                return -1;
        }
        return sv_list(c, &parts, 0, out);
    }
    for (size_t end = s->n;; cuts++) {
        while (end > 0 && space_before(s->p, end))
            end = cp_before(s->p, end);
        if (!end)
            break;
        if (maxsplit >= 0 && cuts == maxsplit) {
            if (sv_push(c, &parts, s->p, end))
                return -1;
            break;
        }
        size_t start = end;
        while (start > 0 && !space_before(s->p, start))
            start = cp_before(s->p, start);
        if (sv_push(c, &parts, s->p + start, end - start))
            return -1;
        end = start;
    }
    return sv_list(c, &parts, 1, out);
}

/* str.replace(old, new, count): count < 0 all; an empty old goes between
 * every code point and at both ends, as in Python. */
static int replace(jinja_ctx *c, int line, const jinja_str *s, const jinja_str *old, const jinja_str *new_,
                   int64_t count, jinja_value *out)
{
    moec_buf b = {0};
    int64_t done = 0;
    if (!old->n) {
        for (size_t i = 0;;) {
            if (count < 0 || done < count) {
                moec_buf_put(&b, new_->p, new_->n);
                done++;
            }
            if (i >= s->n)
                break;
            uint32_t cp;
            int k = jinja_utf8_next(s->p + i, s->n - i, &cp);
            moec_buf_put(&b, s->p + i, (size_t)k);
            i += (size_t)k;
            if (b.len > c->lim.max_output)
                break;
        }
        return str_result(c, line, &b, out);
    }
    size_t at = 0;
    while (count < 0 || done < count) {
        long long k = find_bytes(s, old, at, s->n, 0);
        if (k < 0)
            break;
        moec_buf_put(&b, s->p + at, (size_t)k - at);
        moec_buf_put(&b, new_->p, new_->n);
        at = (size_t)k + old->n;
        done++;
        if (b.len > c->lim.max_output)
            break;
    }
    moec_buf_put(&b, s->p + at, s->n - at);
    return str_result(c, line, &b, out);
}

/* The code point index of byte offset off in s. */
static int64_t cp_index(const jinja_str *s, long long off) { return off < 0 ? -1 : (int64_t)jinja_utf8_count(s->p, (size_t)off); }

/* ---- attributes and items ------------------------------------------------------------------ */

enum {
    M_UNSUPPORTED,
    /* str */
    M_STARTSWITH, M_ENDSWITH, M_SPLIT, M_RSPLIT, M_STRIP, M_LSTRIP, M_RSTRIP, M_REPLACE, M_LOWER, M_UPPER,
    M_TITLE, M_CAPITALIZE, M_FIND, M_RFIND, M_INDEX, M_RINDEX, M_COUNT, M_JOIN, M_SPLITLINES, M_ISDIGIT,
    M_ISALPHA, M_ISALNUM, M_ISSPACE, M_ISLOWER, M_ISUPPER, M_REMOVEPREFIX, M_REMOVESUFFIX,
    /* dict */
    M_GET, M_ITEMS, M_KEYS, M_VALUES,
    /* list */
    M_LIST_COUNT, M_LIST_INDEX,
    /* loop */
    M_CYCLE,
};

typedef struct method_def {
    const char *name;
    int id;
} method_def;

/* Every method of Python's str, dict and list: those moec has, and the
 * rest (M_UNSUPPORTED), so that calling one is "not supported" rather
 * than "no attribute". */
static const method_def str_methods[] = {
    {"startswith", M_STARTSWITH}, {"endswith", M_ENDSWITH}, {"split", M_SPLIT}, {"rsplit", M_RSPLIT},
    {"strip", M_STRIP}, {"lstrip", M_LSTRIP}, {"rstrip", M_RSTRIP}, {"replace", M_REPLACE}, {"lower", M_LOWER},
    {"upper", M_UPPER}, {"title", M_TITLE}, {"capitalize", M_CAPITALIZE}, {"find", M_FIND}, {"rfind", M_RFIND},
    {"index", M_INDEX}, {"rindex", M_RINDEX}, {"count", M_COUNT}, {"join", M_JOIN}, {"splitlines", M_SPLITLINES},
    {"isdigit", M_ISDIGIT}, {"isalpha", M_ISALPHA}, {"isalnum", M_ISALNUM}, {"isspace", M_ISSPACE},
    {"islower", M_ISLOWER}, {"isupper", M_ISUPPER}, {"removeprefix", M_REMOVEPREFIX},
    {"removesuffix", M_REMOVESUFFIX}, {"casefold", M_UNSUPPORTED}, {"center", M_UNSUPPORTED},
    {"encode", M_UNSUPPORTED}, {"expandtabs", M_UNSUPPORTED}, {"format", M_UNSUPPORTED},
    {"format_map", M_UNSUPPORTED}, {"isascii", M_UNSUPPORTED}, {"isdecimal", M_UNSUPPORTED},
    {"isidentifier", M_UNSUPPORTED}, {"isnumeric", M_UNSUPPORTED}, {"isprintable", M_UNSUPPORTED},
    {"istitle", M_UNSUPPORTED}, {"ljust", M_UNSUPPORTED}, {"maketrans", M_UNSUPPORTED},
    {"partition", M_UNSUPPORTED}, {"rjust", M_UNSUPPORTED}, {"rpartition", M_UNSUPPORTED},
    {"swapcase", M_UNSUPPORTED}, {"translate", M_UNSUPPORTED}, {"zfill", M_UNSUPPORTED}, {NULL, 0}};
static const method_def dict_methods[] = {
    {"get", M_GET}, {"items", M_ITEMS}, {"keys", M_KEYS}, {"values", M_VALUES}, {"clear", M_UNSUPPORTED},
    {"copy", M_UNSUPPORTED}, {"fromkeys", M_UNSUPPORTED}, {"pop", M_UNSUPPORTED}, {"popitem", M_UNSUPPORTED},
    {"setdefault", M_UNSUPPORTED}, {"update", M_UNSUPPORTED}, {NULL, 0}};
static const method_def list_methods[] = {
    {"count", M_LIST_COUNT}, {"index", M_LIST_INDEX}, {"append", M_UNSUPPORTED}, {"clear", M_UNSUPPORTED},
    {"copy", M_UNSUPPORTED}, {"extend", M_UNSUPPORTED}, {"insert", M_UNSUPPORTED}, {"pop", M_UNSUPPORTED},
    {"remove", M_UNSUPPORTED}, {"reverse", M_UNSUPPORTED}, {"sort", M_UNSUPPORTED}, {NULL, 0}};
static const method_def tuple_methods[] = {{"count", M_LIST_COUNT}, {"index", M_LIST_INDEX}, {NULL, 0}};

static const method_def *find_method(const method_def *defs, const char *name, size_t n)
{
    for (; defs->name; defs++)
        if (strlen(defs->name) == n && !memcmp(defs->name, name, n))
            return defs;
    return NULL;
}

/* A method bound to obj: u.self holds the receiver and the name. */
static int bind(jinja_ctx *c, const jinja_value *obj, const method_def *m, jinja_value *out)
{
    jinja_value *self = jinja_alloc(c, 2 * sizeof *self);
    if (!self)
        return -1;
    self[0] = *obj;
    self[1] = jinja_str_value(m->name, strlen(m->name));
    *out = (jinja_value){.kind = JV_METHOD, .id = (uint16_t)m->id, .u.self = self};
    return 0;
}

/* jinja2's object_type_repr: "dict object", "None", ... */
static const char *type_repr(const jinja_value *v, char *buf, size_t cap)
{
    if (v->kind == JV_NONE)
        return "None";
    snprintf(buf, cap, "%s object", v->kind == JV_NS ? "jinja2.utils.Namespace" : jinja_type_name(v));
    return buf;
}

static jinja_value no_attribute(jinja_ctx *c, const jinja_value *obj, const char *name, size_t n)
{
    char t[64];
    return jinja_undefined(c, "'%s' has no attribute '%.*s'", type_repr(obj, t, sizeof t), (int)n, name);
}

static int loop_attr(jinja_ctx *c, const jinja_value *obj, const char *name, size_t n, jinja_value *out)
{
    const jinja_loop *L = obj->u.loop;
    size_t i = L->i, len = L->items->n;
    jinja_str s = {name, n};
    if (name_is(&s, "index"))
        *out = jinja_int((int64_t)i + 1);
    else if (name_is(&s, "index0"))
        *out = jinja_int((int64_t)i);
    else if (name_is(&s, "revindex"))
        *out = jinja_int((int64_t)(len - i));
    else if (name_is(&s, "revindex0"))
        *out = jinja_int((int64_t)(len - i - 1));
    else if (name_is(&s, "first"))
        *out = jinja_bool(i == 0);
    else if (name_is(&s, "last"))
        *out = jinja_bool(i + 1 == len);
    else if (name_is(&s, "length"))
        *out = jinja_int((int64_t)len);
    else if (name_is(&s, "depth"))
        *out = jinja_int(1);
    else if (name_is(&s, "depth0"))
        *out = jinja_int(0);
    else if (name_is(&s, "previtem"))
        *out = i ? L->items->v[i - 1] : jinja_undefined(c, "there is no previous item");
    else if (name_is(&s, "nextitem"))
        *out = i + 1 < len ? L->items->v[i + 1] : jinja_undefined(c, "there is no next item");
    else if (name_is(&s, "cycle")) {
        static const method_def cycle = {"cycle", M_CYCLE};
        return bind(c, obj, &cycle, out);
    } else if (name_is(&s, "changed")) {
        static const method_def changed = {"changed", M_UNSUPPORTED};
        return bind(c, obj, &changed, out);
    } else
        *out = no_attribute(c, obj, name, n);
    return 0;
}

int jinja_getattr(jinja_ctx *c, int line, const jinja_value *obj, const char *name, size_t n, jinja_value *out)
{
    (void)line;
    const method_def *m = NULL;
    switch ((jinja_kind)obj->kind) {
    case JV_STR: m = find_method(str_methods, name, n); break;
    case JV_LIST: m = find_method(obj->tuple ? tuple_methods : list_methods, name, n); break;
    case JV_DICT:
        if ((m = find_method(dict_methods, name, n)))
            break;
        __attribute__((fallthrough)); /* a key */
    case JV_NS: {
        const jinja_value *v = jinja_dict_get(obj->u.d, name, n);
        *out = v ? *v : no_attribute(c, obj, name, n);
        return 0;
    }
    case JV_LOOP: return loop_attr(c, obj, name, n, out);
    default: break;
    }
    if (m)
        return bind(c, obj, m, out);
    *out = no_attribute(c, obj, name, n);
    return 0;
}

int jinja_getitem(jinja_ctx *c, int line, const jinja_value *obj, const jinja_value *key, jinja_value *out)
{
    char t[64];
    if (obj->kind == JV_DICT) {
        const jinja_value *v = jinja_dict_find(obj->u.d, key);
        if (v) {
            *out = *v;
            return 0;
        }
    } else if ((obj->kind == JV_LIST || obj->kind == JV_STR) && (key->kind == JV_INT || key->kind == JV_BOOL)) {
        int64_t i = key->kind == JV_INT ? key->u.i : key->u.b;
        if (obj->kind == JV_LIST) {
            int64_t n = (int64_t)obj->u.l->n;
            if (i < 0)
                i += n;
            if (i >= 0 && i < n) {
                *out = obj->u.l->v[i];
                return 0;
            }
        } else {
            int64_t n = (int64_t)jinja_utf8_count(obj->u.s.p, obj->u.s.n);
            if (i < 0)
                i += n;
            if (i >= 0 && i < n) {
                size_t at = 0;
                uint32_t cp;
                for (int64_t k = 0; k < i; k++)
                    at += (size_t)jinja_utf8_next(obj->u.s.p + at, obj->u.s.n - at, &cp);
                *out = jinja_str_value(obj->u.s.p + at, (size_t)jinja_utf8_next(obj->u.s.p + at, obj->u.s.n - at, &cp));
                return 0;
            }
        }
    }
    if (key->kind == JV_STR) /* no such item: an attribute of that name */
        return jinja_getattr(c, line, obj, key->u.s.p, key->u.s.n, out);
    moec_buf b = {0};
    if (jinja_write_repr(c, line, &b, key)) {
        moec_buf_free(&b);
        return -1;
    }
    *out = jinja_undefined(c, "%s has no element %s", type_repr(obj, t, sizeof t), b.data ? b.data : "");
    moec_buf_free(&b);
    return 0;
}

int jinja_iterate(jinja_ctx *c, int line, const jinja_value *v, jinja_list **out)
{
    jinja_value l;
    switch ((jinja_kind)v->kind) {
    case JV_UNDEF:
        if (jinja_new_list(c, 0, &l))
            return -1;
        *out = l.u.l;
        return 0;
    case JV_LIST: *out = v->u.l; return 0;
    case JV_DICT:
        if (jinja_new_list(c, v->u.d->n, &l))
            return -1;
        memcpy(l.u.l->v, v->u.d->k, v->u.d->n * sizeof *l.u.l->v);
        *out = l.u.l;
        return 0;
    case JV_STR: {
        if (jinja_new_list(c, jinja_utf8_count(v->u.s.p, v->u.s.n), &l))
            return -1;
        size_t k = 0;
        for (size_t i = 0; i < v->u.s.n;) {
            uint32_t cp;
            int n = jinja_utf8_next(v->u.s.p + i, v->u.s.n - i, &cp);
            l.u.l->v[k++] = jinja_str_value(v->u.s.p + i, (size_t)n);
            i += (size_t)n;
        }
        *out = l.u.l;
        return 0;
    }
    default:
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "'%s' object is not iterable", jinja_type_name(v));
    }
}

/* ---- global functions --------------------------------------------------------------------- */

enum { F_RANGE = 1, F_NAMESPACE, F_DICT, F_RAISE, F_STRFTIME, F_UNSUPPORTED };

static const struct {
    const char *name;
    int id;
} globals[] = {{"range", F_RANGE},           {"namespace", F_NAMESPACE},       {"dict", F_DICT},
               {"raise_exception", F_RAISE}, {"strftime_now", F_STRFTIME},     {"lipsum", F_UNSUPPORTED},
               {"cycler", F_UNSUPPORTED},    {"joiner", F_UNSUPPORTED},        {NULL, 0}};

int jinja_global(jinja_ctx *c, const jinja_str *name, jinja_value *out)
{
    (void)c;
    for (int k = 0; globals[k].name; k++)
        if (name_is(name, globals[k].name)) {
            *out = (jinja_value){.kind = JV_FUNC, .id = (uint16_t)k};
            return 1;
        }
    return 0;
}

static int fn_range(jinja_ctx *c, int line, const jargs *A, jinja_value *out)
{
    int64_t v[3] = {0, 0, 1};
    if (!A->n || A->n > 3 || A->nk)
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "range expects 1 to 3 integer arguments");
    for (size_t i = 0; i < A->n; i++)
        if (want_int(c, line, &A->a[i], "range's argument", &v[A->n == 1 ? 1 : i]))
            return -1;
    int64_t start = v[0], stop = v[1], step = v[2];
    if (!step)
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "range() arg 3 must not be zero");
    double count = step > 0 ? ceil(((double)stop - (double)start) / (double)step)
                            : ceil(((double)start - (double)stop) / (double)-step);
    if (count < 0)
        count = 0;
    if (count > JINJA_MAX_RANGE)
        return JFAIL(c, line, MOEC_ERR_CAPACITY, "range of %.0f items: the sandbox allows at most %d", count,
                     JINJA_MAX_RANGE);
    if (jinja_new_list(c, (size_t)count, out))
        return -1;
    for (size_t i = 0; i < (size_t)count; i++)
        out->u.l->v[i] = jinja_int(start + (int64_t)i * step);
    return 0;
}

/* dict(...) and namespace(...): dict(mapping, **kwargs). */
static int fn_dict(jinja_ctx *c, int line, const jargs *A, jinja_kind kind, jinja_value *out)
{
    if (A->n > 1)
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "%s takes at most one positional argument",
                     kind == JV_NS ? "namespace" : "dict");
    if (jinja_new_dict(c, A->nk + (A->n ? 4 : 0), kind, out))
        return -1;
    if (A->n) {
        if (A->a[0].kind != JV_DICT && A->a[0].kind != JV_NS)
            return JFAIL(c, line, MOEC_ERR_UNSUPPORTED, "%s() from a %s is not supported (only from a dict)",
                         kind == JV_NS ? "namespace" : "dict", jinja_type_name(&A->a[0]));
        const jinja_dict *d = A->a[0].u.d;
        for (size_t i = 0; i < d->n; i++)
            if (jinja_dict_set(c, out->u.d, d->k[i], d->v[i]))
                return -1;
    }
    for (size_t k = 0; k < A->nk; k++) {
        jinja_value key = jinja_str_value(A->kn[k].p, A->kn[k].n);
        if (jinja_dict_set(c, out->u.d, key, A->kv[k]))
            return -1;
    }
    return 0;
}

static int call_function(jinja_ctx *c, int line, int k, const jargs *A, jinja_value *out)
{
    jinja_value v;
    jinja_str s;
    static const char *const msg_names[] = {"message", NULL}, *const fmt_names[] = {"format", NULL};
    switch (globals[k].id) {
    case F_RANGE: return fn_range(c, line, A, out);
    case F_NAMESPACE: return fn_dict(c, line, A, JV_NS, out);
    case F_DICT: return fn_dict(c, line, A, JV_DICT, out);
    case F_RAISE:
        if (check_args(c, line, "raise_exception", A, 1, msg_names))
            return -1;
        if (!get_arg(A, 0, "message", &v))
            return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "raise_exception() missing its message");
        if (jinja_to_str(c, line, &v, &v))
            return -1;
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "the template raised an exception: %.*s", (int)v.u.s.n, v.u.s.p);
    case F_STRFTIME: {
        if (check_args(c, line, "strftime_now", A, 1, fmt_names))
            return -1;
        if (!get_arg(A, 0, "format", &v))
            return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "strftime_now() missing its format");
        if (jinja_want_str(c, line, &v, "strftime_now's format", &s))
            return -1;
        char fmt[256], buf[1024];
        if (s.n >= sizeof fmt)
            return JFAIL(c, line, MOEC_ERR_CAPACITY, "strftime_now's format is longer than %zu bytes", sizeof fmt - 1);
        memcpy(fmt, s.p, s.n);
        fmt[s.n] = 0;
        time_t now = time(NULL);
        struct tm tm;
        if (!localtime_r(&now, &tm))
            return JFAIL(c, line, MOEC_ERR_INTERNAL, "strftime_now: the local time is not known");
        size_t n = strftime(buf, sizeof buf, fmt, &tm);
        if (!n && s.n)
            return JFAIL(c, line, MOEC_ERR_CAPACITY, "strftime_now's result is longer than %zu bytes", sizeof buf);
        return jinja_new_str(c, line, buf, n, out);
    }
    default:
        return JFAIL(c, line, MOEC_ERR_UNSUPPORTED, "the function '%s' is not supported", globals[k].name);
    }
}

/* ---- methods ----------------------------------------------------------------------------- */

static int prefix_match(jinja_ctx *c, int line, const jinja_str *s, const jinja_value *what, int end, int *res)
{
    *res = 0;
    if (what->kind == JV_LIST && what->tuple) {
        for (size_t i = 0; i < what->u.l->n && !*res; i++)
            if (prefix_match(c, line, s, &what->u.l->v[i], end, res))
                return -1;
        return 0;
    }
    jinja_str p;
    if (jinja_want_str(c, line, what, end ? "endswith's argument" : "startswith's argument", &p))
        return -1;
    *res = p.n <= s->n && !memcmp(end ? s->p + s->n - p.n : s->p, p.p, p.n);
    return 0;
}

static int char_class(const jinja_str *s, int id)
{
    if (!s->n)
        return 0;
    int any_cased = 0;
    for (size_t i = 0; i < s->n;) {
        uint32_t cp;
        i += (size_t)jinja_utf8_next(s->p + i, s->n - i, &cp);
        utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
        int alpha = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
        int digit = k == UTF8PROC_CATEGORY_ND;
        switch (id) {
        case M_ISDIGIT: if (!digit) return 0; break;
        case M_ISALPHA: if (!alpha) return 0; break;
        case M_ISALNUM: if (!alpha && !digit && k != UTF8PROC_CATEGORY_NL && k != UTF8PROC_CATEGORY_NO) return 0; break;
        case M_ISSPACE: if (!jinja_is_space(cp)) return 0; break;
        case M_ISLOWER:
            if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT)
                return 0;
            any_cased |= k == UTF8PROC_CATEGORY_LL;
            break;
        default:
            if (k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT)
                return 0;
            any_cased |= k == UTF8PROC_CATEGORY_LU;
        }
    }
    return id == M_ISLOWER || id == M_ISUPPER ? any_cased : 1;
}

static int str_method(jinja_ctx *c, int line, int id, const jinja_value *self, const jargs *A, jinja_value *out)
{
    const jinja_str *s = &self->u.s;
    jinja_value a0, a1, a2;
    jinja_str x, y;
    int64_t k = -1;
    int r;
    static const char *const sep_names[] = {"sep", "maxsplit", NULL}, *const chars_names[] = {"chars", NULL},
                             *const repl_names[] = {"old", "new", "count", NULL};
    switch (id) {
    case M_STARTSWITH:
    case M_ENDSWITH:
        if (A->n != 1 || A->nk)
            return JFAIL(c, line, MOEC_ERR_UNSUPPORTED, "%s with start/end positions is not supported",
                         id == M_STARTSWITH ? "startswith" : "endswith");
        if (prefix_match(c, line, s, &A->a[0], id == M_ENDSWITH, &r))
            return -1;
        *out = jinja_bool(r);
        return 0;
    case M_SPLIT:
    case M_RSPLIT:
        if (check_args(c, line, id == M_SPLIT ? "split" : "rsplit", A, 2, sep_names))
            return -1;
        if (get_arg(A, 1, "maxsplit", &a1) && want_int(c, line, &a1, "maxsplit", &k))
            return -1;
        if (get_arg(A, 0, "sep", &a0) && a0.kind != JV_NONE) {
            if (jinja_want_str(c, line, &a0, "the separator", &x))
                return -1;
            return split(c, line, s, &x, k, id == M_RSPLIT, out);
        }
        return split(c, line, s, NULL, k, id == M_RSPLIT, out);
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP:
        if (check_args(c, line, "strip", A, 1, chars_names))
            return -1;
        if (get_arg(A, 0, "chars", &a0) && a0.kind != JV_NONE) {
            if (jinja_want_str(c, line, &a0, "strip's chars", &x))
                return -1;
            *out = strip(self, &x, id != M_RSTRIP, id != M_LSTRIP);
        } else {
            *out = strip(self, NULL, id != M_RSTRIP, id != M_LSTRIP);
        }
        return 0;
    case M_REPLACE:
        if (check_args(c, line, "replace", A, 3, repl_names) || !get_arg(A, 0, "old", &a0) ||
            !get_arg(A, 1, "new", &a1))
            return c->status ? -1 : JFAIL(c, line, MOEC_ERR_INVALID_ARG, "replace expects old and new");
        if (jinja_want_str(c, line, &a0, "replace's old", &x) || jinja_want_str(c, line, &a1, "replace's new", &y) ||
            (get_arg(A, 2, "count", &a2) && want_int(c, line, &a2, "replace's count", &k)))
            return -1;
        return replace(c, line, s, &x, &y, k, out);
    case M_LOWER:
    case M_UPPER:
    case M_TITLE:
    case M_CAPITALIZE:
        if (check_args(c, line, "this method", A, 0, NULL))
            return -1;
        return change_case(c, line, s, id == M_LOWER ? CASE_LOWER : id == M_UPPER ? CASE_UPPER : id == M_TITLE ? CASE_TITLE : CASE_CAPITALIZE, out);
    case M_FIND:
    case M_RFIND:
    case M_INDEX:
    case M_RINDEX:
    case M_COUNT: {
        if (A->n != 1 || A->nk)
            return JFAIL(c, line, MOEC_ERR_UNSUPPORTED, "find, index and count take one argument in moec");
        if (jinja_want_str(c, line, &A->a[0], "the substring", &x))
            return -1;
        if (id == M_COUNT) {
            int64_t n = 0;
            if (!x.n) {
                n = (int64_t)jinja_utf8_count(s->p, s->n) + 1;
            } else {
                for (long long at = 0; (at = find_bytes(s, &x, (size_t)at, s->n, 0)) >= 0; at += (long long)x.n)
                    n++;
            }
            *out = jinja_int(n);
            return 0;
        }
        long long off = find_bytes(s, &x, 0, s->n, id == M_RFIND || id == M_RINDEX);
        if (off < 0 && (id == M_INDEX || id == M_RINDEX))
            return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "substring not found");
        *out = jinja_int(cp_index(s, off));
        return 0;
    }
    case M_JOIN: {
        jinja_list *items;
        if (A->n != 1 || A->nk)
            return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "join takes one argument");
        if (jinja_iterate(c, line, &A->a[0], &items))
            return -1;
        moec_buf b = {0};
        for (size_t i = 0; i < items->n; i++) {
            if (items->v[i].kind != JV_STR) {
                moec_buf_free(&b);
                return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "sequence item %zu: expected str instance, %s found", i,
                             jinja_type_name(&items->v[i]));
            }
            if (i)
                moec_buf_put(&b, s->p, s->n);
            moec_buf_put(&b, items->v[i].u.s.p, items->v[i].u.s.n);
        }
        return str_result(c, line, &b, out);
    }
    case M_SPLITLINES: {
        if (A->n || A->nk)
            return JFAIL(c, line, MOEC_ERR_UNSUPPORTED, "splitlines with keepends is not supported");
        strvec parts = {0};
        size_t start = 0;
        for (size_t i = 0; i < s->n;) {
            uint32_t cp;
            int n = jinja_utf8_next(s->p + i, s->n - i, &cp);
            int brk = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d ||
                      cp == 0x1e || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
            size_t at = i;
            i += (size_t)n;
            if (!brk)
                continue;
            if (cp == '\r' && i < s->n && s->p[i] == '\n')
                i++;
            if (sv_push(c, &parts, s->p + start, at - start))
                return -1;
            start = i;
        }
        if (start < s->n && sv_push(c, &parts, s->p + start, s->n - start))
            return -1;
        return sv_list(c, &parts, 0, out);
    }
    case M_ISDIGIT:
    case M_ISALPHA:
    case M_ISALNUM:
    case M_ISSPACE:
    case M_ISLOWER:
    case M_ISUPPER:
        if (check_args(c, line, "this method", A, 0, NULL))
            return -1;
        *out = jinja_bool(char_class(s, id));
        return 0;
    case M_REMOVEPREFIX:
    case M_REMOVESUFFIX:
        if (A->n != 1 || A->nk || jinja_want_str(c, line, &A->a[0], "the affix", &x))
            return c->status ? -1 : JFAIL(c, line, MOEC_ERR_INVALID_ARG, "removeprefix/removesuffix take one argument");
        *out = *self;
        if (x.n <= s->n && !memcmp(id == M_REMOVEPREFIX ? s->p : s->p + s->n - x.n, x.p, x.n))
            *out = jinja_str_value(id == M_REMOVEPREFIX ? s->p + x.n : s->p, s->n - x.n);
        return 0;
    }
    return JFAIL(c, line, MOEC_ERR_INTERNAL, "str method %d", id);
}

static int items_of(jinja_ctx *c, const jinja_dict *d, jinja_value *out)
{
    if (jinja_new_list(c, d->n, out))
        return -1;
    for (size_t i = 0; i < d->n; i++) {
        jinja_value pair;
        if (jinja_new_list(c, 2, &pair))
            return -1;
        pair.tuple = 1;
        pair.u.l->v[0] = d->k[i];
        pair.u.l->v[1] = d->v[i];
        out->u.l->v[i] = pair;
    }
    return 0;
}

int jinja_call_native(jinja_ctx *c, int line, const jinja_value *fn, const jinja_value *args, size_t n_args,
                      const jinja_str *kw_names, const jinja_value *kw_vals, size_t n_kw, jinja_value *out)
{
    jargs A = {args, n_args, kw_names, kw_vals, n_kw};
    if (fn->kind == JV_FUNC)
        return call_function(c, line, fn->id, &A, out);
    const jinja_value *self = &fn->u.self[0];
    const jinja_str *name = &fn->u.self[1].u.s;
    jinja_value a0, a1;
    if (jinja_step(c, line))
        return -1;
    switch (fn->id) {
    case M_UNSUPPORTED:
        return JFAIL(c, line, MOEC_ERR_UNSUPPORTED, "the method %s.%.*s is not supported", jinja_type_name(self),
                     (int)name->n, name->p);
    case M_GET: {
        static const char *const names[] = {"key", "default", NULL};
        if (check_args(c, line, "get", &A, 2, names) || !get_arg(&A, 0, "key", &a0))
            return c->status ? -1 : JFAIL(c, line, MOEC_ERR_INVALID_ARG, "get expects a key");
        const jinja_value *v = jinja_dict_find(self->u.d, &a0);
        *out = v ? *v : get_arg(&A, 1, "default", &a1) ? a1 : jinja_none();
        return 0;
    }
    case M_ITEMS:
    case M_KEYS:
    case M_VALUES:
        if (check_args(c, line, name->p, &A, 0, NULL))
            return -1;
        if (fn->id == M_ITEMS)
            return items_of(c, self->u.d, out);
        if (jinja_new_list(c, self->u.d->n, out))
            return -1;
        memcpy(out->u.l->v, fn->id == M_KEYS ? self->u.d->k : self->u.d->v, self->u.d->n * sizeof *out->u.l->v);
        return 0;
    case M_LIST_COUNT:
    case M_LIST_INDEX: {
        int64_t n = 0;
        if (A.n != 1 || A.nk)
            return JFAIL(c, line, MOEC_ERR_UNSUPPORTED, "%s takes one argument in moec", fn->id == M_LIST_COUNT ? "count" : "index");
        for (size_t i = 0; i < self->u.l->n; i++)
            if (jinja_equal(&self->u.l->v[i], &A.a[0])) {
                if (fn->id == M_LIST_INDEX) {
                    *out = jinja_int((int64_t)i);
                    return 0;
                }
                n++;
            }
        if (fn->id == M_LIST_INDEX)
            return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "list.index(x): x not in list");
        *out = jinja_int(n);
        return 0;
    }
    case M_CYCLE:
        if (!A.n || A.nk)
            return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "no items for cycling given");
        *out = A.a[self->u.loop->i % A.n];
        return 0;
    default: return str_method(c, line, fn->id, self, &A, out);
    }
}

/* ---- tests ------------------------------------------------------------------------------- */

enum {
    T_BOOLEAN = 1, T_CALLABLE, T_DEFINED, T_DIVISIBLEBY, T_EQ, T_ESCAPED, T_EVEN, T_FALSE, T_FILTER, T_FLOAT, T_GE,
    T_GT, T_IN, T_INTEGER, T_ITERABLE, T_LE, T_LOWER, T_LT, T_MAPPING, T_NE, T_NONE, T_NUMBER, T_ODD, T_SAMEAS,
    T_SEQUENCE, T_STRING, T_TEST, T_TRUE, T_UNDEFINED, T_UPPER,
};

static const struct {
    const char *name;
    int id;
} tests[] = {{"boolean", T_BOOLEAN}, {"callable", T_CALLABLE}, {"defined", T_DEFINED},
             {"divisibleby", T_DIVISIBLEBY}, {"eq", T_EQ}, {"equalto", T_EQ}, {"==", T_EQ},
             {"escaped", T_ESCAPED}, {"even", T_EVEN}, {"false", T_FALSE}, {"filter", T_FILTER},
             {"float", T_FLOAT}, {"ge", T_GE}, {">=", T_GE}, {"gt", T_GT}, {"greaterthan", T_GT}, {">", T_GT},
             {"in", T_IN}, {"integer", T_INTEGER}, {"iterable", T_ITERABLE}, {"le", T_LE}, {"<=", T_LE},
             {"lower", T_LOWER}, {"lt", T_LT}, {"lessthan", T_LT}, {"<", T_LT}, {"mapping", T_MAPPING},
             {"ne", T_NE}, {"!=", T_NE}, {"none", T_NONE}, {"number", T_NUMBER}, {"odd", T_ODD},
             {"sameas", T_SAMEAS}, {"sequence", T_SEQUENCE}, {"string", T_STRING}, {"test", T_TEST},
             {"true", T_TRUE}, {"undefined", T_UNDEFINED}, {"upper", T_UPPER}, {NULL, 0}};

static int test_id(const jinja_str *name)
{
    for (int k = 0; tests[k].name; k++)
        if (name_is(name, tests[k].name))
            return tests[k].id;
    return 0;
}

int jinja_test_known(jinja_ctx *c, int line, const jinja_str *name)
{
    if (test_id(name))
        return 0;
    return JFAIL(c, line, MOEC_ERR_UNSUPPORTED, "unknown test '%.*s'", (int)(name->n > 40 ? 40 : name->n), name->p);
}

static int filter_index(const jinja_str *name);

int jinja_test(jinja_ctx *c, int line, const jinja_str *name, const jinja_value *v, const jinja_value *args,
               size_t n_args, int *res)
{
    int id = test_id(name);
    int want = id == T_DIVISIBLEBY || id == T_EQ || id == T_GE || id == T_GT || id == T_IN || id == T_LE ||
               id == T_LT || id == T_NE || id == T_SAMEAS;
    if (!id)
        return jinja_test_known(c, line, name);
    if ((size_t)want != n_args)
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "the test '%.*s' takes %d argument(s), %zu given", (int)name->n,
                     name->p, want, n_args);
    const jinja_value *a = args;
    int64_t x, y;
    jinja_value s;
    switch (id) {
    case T_BOOLEAN: *res = v->kind == JV_BOOL; return 0;
    case T_CALLABLE: *res = v->kind == JV_FUNC || v->kind == JV_MACRO || v->kind == JV_METHOD; return 0;
    case T_DEFINED: *res = v->kind != JV_UNDEF; return 0;
    case T_UNDEFINED: *res = v->kind == JV_UNDEF; return 0;
    case T_DIVISIBLEBY:
        if (want_int(c, line, v, "divisibleby's value", &x) || want_int(c, line, a, "divisibleby's argument", &y))
            return -1;
        if (!y)
            return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "integer division or modulo by zero");
        *res = y == -1 || x % y == 0;
        return 0;
    case T_EQ: *res = jinja_equal(v, a); return 0;
    case T_NE: *res = !jinja_equal(v, a); return 0;
    case T_GE: return jinja_order(c, line, JOP_GE, v, a, res);
    case T_GT: return jinja_order(c, line, '>', v, a, res);
    case T_LE: return jinja_order(c, line, JOP_LE, v, a, res);
    case T_LT: return jinja_order(c, line, '<', v, a, res);
    case T_ESCAPED: *res = v->kind == JV_STR && v->tuple; return 0;
    case T_EVEN:
    case T_ODD:
        if (want_int(c, line, v, "the value", &x))
            return -1;
        *res = (x % 2 != 0) == (id == T_ODD);
        return 0;
    case T_FALSE: *res = v->kind == JV_BOOL && !v->u.b; return 0;
    case T_TRUE: *res = v->kind == JV_BOOL && v->u.b; return 0;
    case T_FILTER: *res = v->kind == JV_STR && filter_index(&v->u.s) >= 0; return 0;
    case T_TEST: *res = v->kind == JV_STR && test_id(&v->u.s); return 0;
    case T_FLOAT: *res = v->kind == JV_FLOAT; return 0;
    case T_INTEGER: *res = v->kind == JV_INT; return 0;
    case T_NUMBER: *res = v->kind == JV_INT || v->kind == JV_FLOAT || v->kind == JV_BOOL; return 0;
    case T_IN: {
        jinja_list *items;
        *res = 0;
        if (a->kind == JV_STR || a->kind == JV_DICT || a->kind == JV_UNDEF) {
            if (a->kind == JV_STR) {
                if (v->kind != JV_STR)
                    return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "'in <string>' requires string as left operand");
                for (size_t i = 0; i + v->u.s.n <= a->u.s.n && !*res; i++)
                    *res = !memcmp(a->u.s.p + i, v->u.s.p, v->u.s.n);
                return 0;
            }
            *res = a->kind == JV_DICT && jinja_dict_find(a->u.d, v);
            return 0;
        }
        if (jinja_iterate(c, line, a, &items))
            return -1;
        for (size_t i = 0; i < items->n && !*res; i++)
            *res = jinja_equal(v, &items->v[i]);
        return 0;
    }
    case T_ITERABLE:
        *res = v->kind == JV_STR || v->kind == JV_LIST || v->kind == JV_DICT || v->kind == JV_UNDEF ||
               v->kind == JV_LOOP;
        return 0;
    case T_SEQUENCE:
        *res = v->kind == JV_STR || v->kind == JV_LIST || v->kind == JV_DICT || v->kind == JV_UNDEF;
        return 0;
    case T_MAPPING: *res = v->kind == JV_DICT; return 0;
    case T_NONE: *res = v->kind == JV_NONE; return 0;
    case T_STRING: *res = v->kind == JV_STR; return 0;
    case T_SAMEAS:
        *res = v->kind == a->kind &&
               (v->kind == JV_NONE || v->kind == JV_UNDEF ? 1
                : v->kind == JV_BOOL                      ? v->u.b == a->u.b
                : v->kind == JV_LIST                      ? v->u.l == a->u.l
                : v->kind == JV_DICT || v->kind == JV_NS  ? v->u.d == a->u.d
                                                          : jinja_equal(v, a));
        return 0;
    case T_LOWER:
    case T_UPPER:
        if (jinja_to_str(c, line, v, &s))
            return -1;
        *res = char_class(&s.u.s, id == T_LOWER ? M_ISLOWER : M_ISUPPER);
        return 0;
    }
    return JFAIL(c, line, MOEC_ERR_INTERNAL, "test %d", id);
}

/* ---- filters ------------------------------------------------------------------------------- */

typedef int (*filter_fn)(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out);

static int f_length(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    if (check_args(c, line, "length", A, 0, NULL))
        return -1;
    switch ((jinja_kind)v->kind) {
    case JV_UNDEF: *out = jinja_int(0); return 0;
    case JV_STR: *out = jinja_int((int64_t)jinja_utf8_count(v->u.s.p, v->u.s.n)); return 0;
    case JV_LIST: *out = jinja_int((int64_t)v->u.l->n); return 0;
    case JV_DICT: *out = jinja_int((int64_t)v->u.d->n); return 0;
    case JV_LOOP: *out = jinja_int((int64_t)v->u.loop->items->n); return 0;
    default: return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "object of type '%s' has no len()", jinja_type_name(v));
    }
}

static int f_trim(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    static const char *const names[] = {"chars", NULL};
    jinja_value s, chars;
    jinja_str set;
    if (check_args(c, line, "trim", A, 1, names) || jinja_to_str(c, line, v, &s))
        return -1;
    s.tuple = v->kind == JV_STR && v->tuple;
    if (get_arg(A, 0, "chars", &chars) && chars.kind != JV_NONE) {
        if (jinja_want_str(c, line, &chars, "trim's chars", &set))
            return -1;
        *out = strip(&s, &set, 1, 1);
    } else {
        *out = strip(&s, NULL, 1, 1);
    }
    return 0;
}

static int f_tojson(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    jinja_value a;
    int64_t indent = -1;
    int ensure_ascii = 0, sort_keys = 0;
    if (check_args(c, line, "tojson", A, 4, names))
        return -1;
    if (get_arg(A, 0, "ensure_ascii", &a))
        ensure_ascii = jinja_truthy(&a);
    if (get_arg(A, 1, "indent", &a) && a.kind != JV_NONE) {
        if (want_int(c, line, &a, "tojson's indent", &indent))
            return -1;
        if (indent < 0)
            indent = 0;
        if (indent > 64)
            return JFAIL(c, line, MOEC_ERR_UNSUPPORTED, "tojson's indent above 64 is not supported");
    }
    if (get_arg(A, 2, "separators", &a) && a.kind != JV_NONE)
        return JFAIL(c, line, MOEC_ERR_UNSUPPORTED, "tojson's separators are not supported");
    if (get_arg(A, 3, "sort_keys", &a))
        sort_keys = jinja_truthy(&a);
    moec_buf b = {0};
    if (jinja_write_json(c, line, &b, v, ensure_ascii, (int)indent, sort_keys, 0)) {
        moec_buf_free(&b);
        return -1;
    }
    return str_result(c, line, &b, out);
}

static int f_items(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    if (check_args(c, line, "items", A, 0, NULL))
        return -1;
    if (v->kind == JV_UNDEF)
        return jinja_new_list(c, 0, out);
    if (v->kind != JV_DICT)
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "Can only get item pairs from a mapping.");
    return items_of(c, v->u.d, out);
}

static int f_string(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    if (check_args(c, line, "string", A, 0, NULL) || jinja_to_str(c, line, v, out))
        return -1;
    out->tuple = v->kind == JV_STR && v->tuple;
    return 0;
}

static int f_safe(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    if (check_args(c, line, "safe", A, 0, NULL) || jinja_to_str(c, line, v, out))
        return -1;
    out->tuple = 1;
    return 0;
}

static int f_default(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    static const char *const names[] = {"default_value", "boolean", NULL};
    jinja_value d = jinja_str_value("", 0), b = jinja_bool(0);
    if (check_args(c, line, "default", A, 2, names))
        return -1;
    get_arg(A, 0, "default_value", &d);
    get_arg(A, 1, "boolean", &b);
    *out = v->kind == JV_UNDEF || (jinja_truthy(&b) && !jinja_truthy(v)) ? d : *v;
    return 0;
}

static int f_case(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, int how, jinja_value *out)
{
    jinja_value s;
    if (check_args(c, line, "this filter", A, 0, NULL) || jinja_to_str(c, line, v, &s))
        return -1;
    return change_case(c, line, &s.u.s, how, out);
}
static int f_lower(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    return f_case(c, line, v, A, CASE_LOWER, out);
}
static int f_upper(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    return f_case(c, line, v, A, CASE_UPPER, out);
}
static int f_capitalize(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    return f_case(c, line, v, A, CASE_CAPITALIZE, out);
}
static int f_title(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    return f_case(c, line, v, A, CASE_JINJA_TITLE, out);
}

static int f_replace(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    static const char *const names[] = {"old", "new", "count", NULL};
    jinja_value s, o, n, k;
    int64_t count = -1;
    if (check_args(c, line, "replace", A, 3, names) || jinja_to_str(c, line, v, &s))
        return -1;
    if (!get_arg(A, 0, "old", &o) || !get_arg(A, 1, "new", &n))
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "replace expects old and new");
    if (jinja_to_str(c, line, &o, &o) || jinja_to_str(c, line, &n, &n) ||
        (get_arg(A, 2, "count", &k) && k.kind != JV_NONE && want_int(c, line, &k, "replace's count", &count)))
        return -1;
    return replace(c, line, &s.u.s, &o.u.s, &n.u.s, count, out);
}

static int f_join(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    static const char *const names[] = {"d", "attribute", NULL};
    jinja_value d = jinja_str_value("", 0), attr;
    jinja_list *items;
    if (check_args(c, line, "join", A, 2, names) || jinja_iterate(c, line, v, &items))
        return -1;
    get_arg(A, 0, "d", &d);
    int has_attr = get_arg(A, 1, "attribute", &attr);
    moec_buf b = {0};
    for (size_t i = 0; i < items->n; i++) {
        jinja_value x = items->v[i];
        if ((i && jinja_write_str(c, line, &b, &d)) || (has_attr && jinja_getitem(c, line, &items->v[i], &attr, &x)) ||
            jinja_write_str(c, line, &b, &x)) {
            moec_buf_free(&b);
            return -1;
        }
    }
    return str_result(c, line, &b, out);
}

static int f_list(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    jinja_list *items;
    if (check_args(c, line, "list", A, 0, NULL) || jinja_iterate(c, line, v, &items) ||
        jinja_new_list(c, items->n, out))
        return -1;
    memcpy(out->u.l->v, items->v, items->n * sizeof *items->v);
    return 0;
}

static int f_first_last(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, int last, jinja_value *out)
{
    jinja_list *items;
    if (check_args(c, line, last ? "last" : "first", A, 0, NULL) || jinja_iterate(c, line, v, &items))
        return -1;
    if (!items->n)
        *out = jinja_undefined(c, "No %s item, sequence was empty.", last ? "last" : "first");
    else
        *out = items->v[last ? items->n - 1 : 0];
    return 0;
}
static int f_first(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    return f_first_last(c, line, v, A, 0, out);
}
static int f_last(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    return f_first_last(c, line, v, A, 1, out);
}

static int f_reverse(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    jinja_list *items;
    if (check_args(c, line, "reverse", A, 0, NULL) || jinja_iterate(c, line, v, &items))
        return -1;
    if (v->kind == JV_STR) {
        moec_buf b = {0};
        for (size_t i = items->n; i-- > 0;)
            moec_buf_put(&b, items->v[i].u.s.p, items->v[i].u.s.n);
        return str_result(c, line, &b, out);
    }
    if (jinja_new_list(c, items->n, out))
        return -1;
    for (size_t i = 0; i < items->n; i++)
        out->u.l->v[i] = items->v[items->n - 1 - i];
    return 0;
}

static int f_abs(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    if (check_args(c, line, "abs", A, 0, NULL))
        return -1;
    if (v->kind == JV_FLOAT)
        *out = jinja_float(fabs(v->u.f));
    else if (v->kind == JV_INT || v->kind == JV_BOOL) {
        int64_t x = v->kind == JV_INT ? v->u.i : v->u.b;
        if (x == INT64_MIN)
            return JFAIL(c, line, MOEC_ERR_UNSUPPORTED, "an integer beyond 64 bits");
        *out = jinja_int(x < 0 ? -x : x);
    } else
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "bad operand type for abs(): '%s'", jinja_type_name(v));
    return 0;
}

/* Python's int(str, base) and float(str) on a string, strict: 0 on success. */
static int parse_int(const jinja_str *s, int base, int64_t *out)
{
    char buf[128];
    size_t k = 0;
    jinja_value t = strip(&(jinja_value){.kind = JV_STR, .u.s = *s}, NULL, 1, 1);
    for (size_t i = 0; i < t.u.s.n && k + 1 < sizeof buf; i++)
        if (t.u.s.p[i] != '_' || (i && i + 1 < t.u.s.n))
            buf[k++] = t.u.s.p[i];
    buf[k] = 0;
    if (!k || k + 1 >= sizeof buf || strchr(buf, ' '))
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, base);
    if (*end || errno)
        return -1;
    *out = v;
    return 0;
}
static int parse_float(const jinja_str *s, double *out)
{
    char buf[128];
    jinja_value t = strip(&(jinja_value){.kind = JV_STR, .u.s = *s}, NULL, 1, 1);
    if (!t.u.s.n || t.u.s.n >= sizeof buf)
        return -1;
    memcpy(buf, t.u.s.p, t.u.s.n);
    buf[t.u.s.n] = 0;
    if (strpbrk(buf, "xXpP"))
        return -1;
    char *end;
    *out = strtod(buf, &end);
    return *end ? -1 : 0;
}

static int f_int(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    static const char *const names[] = {"default", "base", NULL};
    jinja_value d = jinja_int(0), b;
    int64_t base = 10, x;
    double f;
    if (check_args(c, line, "int", A, 2, names))
        return -1;
    get_arg(A, 0, "default", &d);
    if (get_arg(A, 1, "base", &b) && want_int(c, line, &b, "int's base", &base))
        return -1;
    *out = d;
    if (v->kind == JV_INT || v->kind == JV_BOOL) {
        *out = jinja_int(v->kind == JV_INT ? v->u.i : v->u.b);
    } else if (v->kind == JV_FLOAT) {
        if (!isfinite(v->u.f) || fabs(v->u.f) >= 9.2e18)
            return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "cannot convert float %s to integer",
                         isnan(v->u.f) ? "NaN" : "infinity or a huge value");
        *out = jinja_int((int64_t)v->u.f);
    } else if (v->kind == JV_STR) {
        if (!parse_int(&v->u.s, (int)base, &x))
            *out = jinja_int(x);
        else if (!parse_float(&v->u.s, &f) && isfinite(f) && fabs(f) < 9.2e18)
            *out = jinja_int((int64_t)f);
    }
    return 0;
}

static int f_float(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    static const char *const names[] = {"default", NULL};
    jinja_value d = jinja_float(0);
    double f;
    if (check_args(c, line, "float", A, 1, names))
        return -1;
    get_arg(A, 0, "default", &d);
    *out = d;
    if (v->kind == JV_FLOAT)
        *out = *v;
    else if (v->kind == JV_INT || v->kind == JV_BOOL)
        *out = jinja_float(v->kind == JV_INT ? (double)v->u.i : v->u.b);
    else if (v->kind == JV_STR && !parse_float(&v->u.s, &f))
        *out = jinja_float(f);
    return 0;
}

/* jinja2's attr filter: an attribute only (a dict's keys are not). */
static int f_attr(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    jinja_str name;
    if (A->n != 1 || A->nk)
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "attr takes one argument");
    if (jinja_want_str(c, line, &A->a[0], "attr's name", &name))
        return -1;
    if (v->kind == JV_DICT) {
        const method_def *m = find_method(dict_methods, name.p, name.n);
        if (m)
            return bind(c, v, m, out);
        *out = no_attribute(c, v, name.p, name.n);
        return 0;
    }
    if (v->kind == JV_UNDEF)
        return jinja_fail_undefined(c, line, v);
    return jinja_getattr(c, line, v, name.p, name.n, out);
}

/* item.a.b for map / selectattr's attribute (dotted, integers as indices). */
static int attr_path(jinja_ctx *c, int line, const jinja_value *item, const jinja_str *path, jinja_value *out)
{
    *out = *item;
    size_t at = 0;
    while (at <= path->n) {
        size_t end = at;
        while (end < path->n && path->p[end] != '.')
            end++;
        jinja_value key = jinja_str_value(path->p + at, end - at);
        int digits = end > at;
        for (size_t i = at; i < end; i++)
            digits &= path->p[i] >= '0' && path->p[i] <= '9';
        if (digits)
            key = jinja_int(strtoll(path->p + at, NULL, 10));
        if (out->kind == JV_UNDEF)
            return jinja_fail_undefined(c, line, out);
        if (jinja_getitem(c, line, out, &key, out))
            return -1;
        at = end + 1;
    }
    return 0;
}

int jinja_filter(jinja_ctx *c, int line, const jinja_str *name, const jinja_value *v, const jinja_value *args,
                 size_t n_args, const jinja_str *kw_names, const jinja_value *kw_vals, size_t n_kw, jinja_value *out);

/* select / reject (attr NULL) and selectattr / rejectattr: the items a
 * test (or truth, when none is named) keeps (keep 1) or drops. */
static int select_items(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, int by_attr, int keep,
                        jinja_value *out)
{
    jinja_list *items;
    jinja_str attr = {0}, test = {0};
    size_t first_arg = by_attr ? 2 : 1;
    if (A->nk)
        return JFAIL(c, line, MOEC_ERR_UNSUPPORTED, "keyword arguments to select and reject are not supported");
    if (by_attr && (!A->n || jinja_want_str(c, line, &A->a[0], "the attribute", &attr)))
        return c->status ? -1 : JFAIL(c, line, MOEC_ERR_INVALID_ARG, "missing the attribute");
    int has_test = A->n > first_arg - 1;
    if (has_test && jinja_want_str(c, line, &A->a[first_arg - 1], "the test's name", &test))
        return -1;
    if (has_test && jinja_test_known(c, line, &test))
        return -1;
    if (jinja_iterate(c, line, v, &items) || jinja_new_list(c, items->n, out))
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < items->n; i++) {
        jinja_value x = items->v[i];
        int r;
        if (by_attr && attr_path(c, line, &items->v[i], &attr, &x))
            return -1;
        if (has_test) {
            if (jinja_test(c, line, &test, &x, A->a + first_arg, A->n - first_arg, &r))
                return -1;
        } else {
            r = jinja_truthy(&x);
        }
        if (r == keep)
            out->u.l->v[n++] = items->v[i];
    }
    out->u.l->n = n;
    return 0;
}
static int f_select(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    return select_items(c, line, v, A, 0, 1, out);
}
static int f_reject(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    return select_items(c, line, v, A, 0, 0, out);
}
static int f_selectattr(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    return select_items(c, line, v, A, 1, 1, out);
}
static int f_rejectattr(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    return select_items(c, line, v, A, 1, 0, out);
}

static int f_map(jinja_ctx *c, int line, const jinja_value *v, const jargs *A, jinja_value *out)
{
    jinja_list *items;
    jinja_value attr, dflt;
    jinja_str a, fname;
    if (jinja_iterate(c, line, v, &items) || jinja_new_list(c, items->n, out))
        return -1;
    if (!A->n && get_arg(A, (size_t)-1, "attribute", &attr)) {
        static const char *const names[] = {"attribute", "default", NULL};
        int has_default = get_arg(A, (size_t)-1, "default", &dflt);
        if (check_args(c, line, "map", A, 0, names) || jinja_want_str(c, line, &attr, "map's attribute", &a))
            return -1;
        for (size_t i = 0; i < items->n; i++) {
            if (attr_path(c, line, &items->v[i], &a, &out->u.l->v[i]))
                return -1;
            if (has_default && out->u.l->v[i].kind == JV_UNDEF)
                out->u.l->v[i] = dflt;
        }
        return 0;
    }
    if (!A->n || jinja_want_str(c, line, &A->a[0], "map's filter name", &fname))
        return c->status ? -1 : JFAIL(c, line, MOEC_ERR_INVALID_ARG, "map needs a filter name or attribute=");
    if (jinja_filter_known(c, line, &fname))
        return -1;
    for (size_t i = 0; i < items->n; i++)
        if (jinja_filter(c, line, &fname, &items->v[i], A->a + 1, A->n - 1, A->kn, A->kv, A->nk, &out->u.l->v[i]))
            return -1;
    return 0;
}

static const struct {
    const char *name;
    filter_fn fn;
} filters[] = {{"abs", f_abs},         {"attr", f_attr},         {"capitalize", f_capitalize},
               {"count", f_length},    {"d", f_default},         {"default", f_default},
               {"first", f_first},     {"float", f_float},       {"int", f_int},
               {"items", f_items},     {"join", f_join},         {"last", f_last},
               {"length", f_length},   {"list", f_list},         {"lower", f_lower},
               {"map", f_map},         {"reject", f_reject},     {"rejectattr", f_rejectattr},
               {"replace", f_replace}, {"reverse", f_reverse},   {"safe", f_safe},
               {"select", f_select},   {"selectattr", f_selectattr}, {"string", f_string},
               {"title", f_title},     {"tojson", f_tojson},     {"trim", f_trim},
               {"upper", f_upper},     {NULL, NULL}};

/* jinja2's other built-in filters: known, not implemented. */
static const char *const jinja_only_filters[] = {
    "batch", "center", "dictsort", "e", "escape", "filesizeformat", "forceescape", "format", "groupby",
    "indent", "max", "min", "pprint", "random", "round", "slice", "sort", "striptags", "sum", "truncate",
    "unique", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr", NULL};

static int filter_index(const jinja_str *name)
{
    for (int k = 0; filters[k].name; k++)
        if (name_is(name, filters[k].name))
            return k;
    return -1;
}

int jinja_filter_known(jinja_ctx *c, int line, const jinja_str *name)
{
    if (filter_index(name) >= 0)
        return 0;
    for (int k = 0; jinja_only_filters[k]; k++)
        if (name_is(name, jinja_only_filters[k]))
            return JFAIL(c, line, MOEC_ERR_UNSUPPORTED, "the filter '%s' is not supported", jinja_only_filters[k]);
    return JFAIL(c, line, MOEC_ERR_UNSUPPORTED, "unknown filter '%.*s'", (int)(name->n > 40 ? 40 : name->n), name->p);
}

int jinja_filter(jinja_ctx *c, int line, const jinja_str *name, const jinja_value *v, const jinja_value *args,
                 size_t n_args, const jinja_str *kw_names, const jinja_value *kw_vals, size_t n_kw, jinja_value *out)
{
    int k = filter_index(name);
    if (k < 0)
        return jinja_filter_known(c, line, name);
    if (jinja_step(c, line))
        return -1;
    jargs A = {args, n_args, kw_names, kw_vals, n_kw};
    return filters[k].fn(c, line, v, &A, out);
}

void jinja_escape(moec_buf *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        switch (s[i]) {
        case '&': moec_buf_str(b, "&amp;"); break;
        case '<': moec_buf_str(b, "&lt;"); break;
        case '>': moec_buf_str(b, "&gt;"); break;
        case '"': moec_buf_str(b, "&#34;"); break;
        case '\'': moec_buf_str(b, "&#39;"); break;
        default: moec_buf_put(b, s + i, 1);
        }
    }
}
