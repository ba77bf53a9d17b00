/* jinja_eval.c — runs a parsed chat template: expressions with Python's
 * semantics (jinja2 compiles to Python), statements with jinja2's scoping
 * (a for loop's body starts afresh from the enclosing scope on every
 * iteration, an if has no scope of its own, a macro sees the template's),
 * and the render itself: lex, parse, bind the variables, run, with every
 * bound of jinja_limits checked as it goes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "runtime/jinja.h"

struct jinja_scope {
    jinja_scope *parent;
    jinja_dict vars; /* name (a string) -> value */
};

static jinja_scope *scope_new(jinja_ctx *c, jinja_scope *parent)
{
    jinja_scope *s = jinja_alloc(c, sizeof *s);
    if (s)
        s->parent = parent;
    return s;
}

static int scope_set(jinja_ctx *c, jinja_scope *s, jinja_str name, jinja_value v)
{
    return jinja_dict_set(c, &s->vars, jinja_str_value(name.p, name.n), v);
}

static const jinja_value *scope_get(const jinja_scope *s, const char *p, size_t n)
{
    for (; s; s = s->parent) {
        const jinja_value *v = jinja_dict_get(&s->vars, p, n);
        if (v)
            return v;
    }
    return NULL;
}

int jinja_step(jinja_ctx *c, int line)
{
    if (++c->steps > c->lim.max_steps)
        return JFAIL(c, line, MOEC_ERR_CAPACITY, "rendering takes more than the %lld steps a render may take",
                     c->lim.max_steps);
    return 0;
}

/* Counts nesting: expressions in expressions, blocks in blocks and macro
 * calls all take stack, and a hostile template may chain them deep. */
static int enter(jinja_ctx *c, int line)
{
    if (++c->depth > JINJA_MAX_DEPTH)
        return JFAIL(c, line, MOEC_ERR_CAPACITY, "rendering nests expressions, blocks and calls more than %d deep",
                     JINJA_MAX_DEPTH);
    return jinja_step(c, line);
}

static int emit(jinja_ctx *c, int line, const char *p, size_t n)
{
    moec_buf_put(c->out, p, n);
    if (c->out->oom)
        return JFAIL(c, line, MOEC_ERR_OOM, "out of memory");
    if (c->out->len > c->lim.max_output)
        return JFAIL(c, line, MOEC_ERR_CAPACITY, "the rendered text is longer than the %zu bytes a render may make",
                     c->lim.max_output);
    return 0;
}

int jinja_want_str(jinja_ctx *c, int line, const jinja_value *v, const char *what, jinja_str *out)
{
    if (v->kind == JV_STR) {
        *out = v->u.s;
        return 0;
    }
    if (v->kind == JV_UNDEF)
        return jinja_fail_undefined(c, line, v);
    return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "%s must be a string, not %s", what, jinja_type_name(v));
}

/* ---- operators --------------------------------------------------------------------------- */

static int is_num(const jinja_value *v) { return v->kind == JV_INT || v->kind == JV_BOOL || v->kind == JV_FLOAT; }
static int is_int(const jinja_value *v) { return v->kind == JV_INT || v->kind == JV_BOOL; }
static int64_t ival(const jinja_value *v) { return v->kind == JV_INT ? v->u.i : v->u.b; }
static double fval(const jinja_value *v) { return v->kind == JV_FLOAT ? v->u.f : (double)ival(v); }

static int op_type_error(jinja_ctx *c, int line, const char *sym, const jinja_value *a, const jinja_value *b)
{
    if (a->kind == JV_STR && !strcmp(sym, "+"))
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "can only concatenate str (not \"%s\") to str", jinja_type_name(b));
    return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "unsupported operand type(s) for %s: '%s' and '%s'", sym,
                 jinja_type_name(a), jinja_type_name(b));
}

static int overflow(jinja_ctx *c, int line)
{
    return JFAIL(c, line, MOEC_ERR_UNSUPPORTED, "an integer beyond 64 bits (Python's are unbounded, moec's are not)");
}

/* s repeated k times (k <= 0: empty). */
static int repeat(jinja_ctx *c, int line, const jinja_value *s, int64_t k, jinja_value *out)
{
    if (k < 0)
        k = 0;
    if (s->kind == JV_STR) {
        if (s->u.s.n && (uint64_t)k > c->lim.max_output / s->u.s.n)
            return JFAIL(c, line, MOEC_ERR_CAPACITY, "a string repeated %lld times is longer than %zu bytes",
                         (long long)k, c->lim.max_output);
        char *p = jinja_alloc(c, s->u.s.n * (size_t)k + 1);
        if (!p)
            return -1;
        for (int64_t i = 0; i < k; i++)
            memcpy(p + (size_t)i * s->u.s.n, s->u.s.p, s->u.s.n);
        *out = jinja_str_value(p, s->u.s.n * (size_t)k);
        return 0;
    }
    size_t n = s->u.l->n;
    if (n && (uint64_t)k > (uint64_t)(c->lim.max_output / n))
        return JFAIL(c, line, MOEC_ERR_CAPACITY, "a list repeated %lld times", (long long)k);
    if (jinja_new_list(c, n * (size_t)k, out))
        return -1;
    out->tuple = s->tuple;
    for (int64_t i = 0; i < k; i++)
        memcpy(out->u.l->v + (size_t)i * n, s->u.l->v, n * sizeof *s->u.l->v);
    return 0;
}

static int binary(jinja_ctx *c, int line, int op, const jinja_value *a, const jinja_value *b, jinja_value *out)
{
    static const char *syms[] = {"==", "!=", "<=", ">=", "//", "**"};
    char one[2] = {(char)op, 0};
    const char *sym = op >= JOP_EQ ? syms[op - JOP_EQ] : one;
    if (op == '~') {
        moec_buf buf = {0};
        if (jinja_write_str(c, line, &buf, a) || jinja_write_str(c, line, &buf, b)) {
            moec_buf_free(&buf);
            return -1;
        }
        return jinja_buf_to_str(c, line, &buf, out);
    }
    if (a->kind == JV_UNDEF)
        return jinja_fail_undefined(c, line, a);
    if (b->kind == JV_UNDEF)
        return jinja_fail_undefined(c, line, b);
    if (is_num(a) && is_num(b)) {
        int ints = is_int(a) && is_int(b);
        int64_t x = ints ? ival(a) : 0, y = ints ? ival(b) : 0, r;
        double f = fval(a), g = fval(b);
        switch (op) {
        case '+':
        case '-':
        case '*':
            if (!ints)
                break;
            if (op == '+' ? __builtin_add_overflow(x, y, &r)
                : op == '-' ? __builtin_sub_overflow(x, y, &r)
                            : __builtin_mul_overflow(x, y, &r))
                return overflow(c, line);
            *out = jinja_int(r);
            return 0;
        case '/':
            if (g == 0)
                return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "division by zero");
            *out = jinja_float(f / g);
            return 0;
        case JOP_FLOORDIV:
        case '%':
            if (ints) {
                if (!y)
                    return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1)
                    return overflow(c, line);
                int64_t q = x / y, m = x % y;
                if (m && ((m < 0) != (y < 0))) { /* Python floors */
                    q--;
                    m += y;
                }
                *out = jinja_int(op == '%' ? m : q);
                return 0;
            }
            if (g == 0)
                return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "float division by zero");
            if (op == '%') {
                double m = fmod(f, g);
                if (m && ((m < 0) != (g < 0)))
                    m += g;
                *out = jinja_float(m);
            } else {
                *out = jinja_float(floor(f / g));
            }
            return 0;
        case JOP_POW:
            if (ints && y >= 0) {
                int64_t p = 1, base = x;
                for (int64_t e = y; e; e >>= 1) {
                    if ((e & 1) && __builtin_mul_overflow(p, base, &p))
                        return overflow(c, line);
                    if (e > 1 && __builtin_mul_overflow(base, base, &base))
                        return overflow(c, line);
                }
                *out = jinja_int(p);
                return 0;
            }
            if (f == 0 && g < 0)
                return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "0.0 cannot be raised to a negative power");
            *out = jinja_float(pow(f, g));
            return 0;
        default: break;
        }
        switch (op) {
        case '+': *out = jinja_float(f + g); return 0;
        case '-': *out = jinja_float(f - g); return 0;
        case '*': *out = jinja_float(f * g); return 0;
        default: break;
        }
    }
    if (op == '+' && a->kind == JV_STR && b->kind == JV_STR && a->tuple != b->tuple) {
        /* Markup + str escapes the str (markupsafe's __add__ / __radd__) */
        moec_buf buf = {0};
        if (a->tuple)
            moec_buf_put(&buf, a->u.s.p, a->u.s.n);
        else
            jinja_escape(&buf, a->u.s.p, a->u.s.n);
        if (b->tuple)
            moec_buf_put(&buf, b->u.s.p, b->u.s.n);
        else
            jinja_escape(&buf, b->u.s.p, b->u.s.n);
        if (jinja_buf_to_str(c, line, &buf, out))
            return -1;
        out->tuple = 1;
        return 0;
    }
    if (op == '+' && a->kind == JV_STR && b->kind == JV_STR) {
        if (a->u.s.n + b->u.s.n > c->lim.max_output)
            return JFAIL(c, line, MOEC_ERR_CAPACITY, "a string longer than the %zu bytes a render may make",
                         c->lim.max_output);
        char *p = jinja_alloc(c, a->u.s.n + b->u.s.n + 1);
        if (!p)
            return -1;
        memcpy(p, a->u.s.p, a->u.s.n);
        memcpy(p + a->u.s.n, b->u.s.p, b->u.s.n);
        *out = jinja_str_value(p, a->u.s.n + b->u.s.n);
        out->tuple = a->tuple;
        return 0;
    }
    if (op == '+' && a->kind == JV_LIST && b->kind == JV_LIST && a->tuple == b->tuple) {
        if (jinja_new_list(c, a->u.l->n + b->u.l->n, out))
            return -1;
        out->tuple = a->tuple;
        memcpy(out->u.l->v, a->u.l->v, a->u.l->n * sizeof *a->u.l->v);
        memcpy(out->u.l->v + a->u.l->n, b->u.l->v, b->u.l->n * sizeof *b->u.l->v);
        return 0;
    }
    if (op == '*' && (a->kind == JV_STR || a->kind == JV_LIST) && is_int(b))
        return repeat(c, line, a, ival(b), out);
    if (op == '*' && (b->kind == JV_STR || b->kind == JV_LIST) && is_int(a))
        return repeat(c, line, b, ival(a), out);
    if (op == '%' && a->kind == JV_STR)
        return JFAIL(c, line, MOEC_ERR_UNSUPPORTED, "printf-style formatting with '%%' is not supported");
    return op_type_error(c, line, sym, a, b);
}

/* Python's `needle in hay`. */
static int contains(jinja_ctx *c, int line, const jinja_value *needle, const jinja_value *hay, int *res)
{
    *res = 0;
    switch ((jinja_kind)hay->kind) {
    case JV_UNDEF: return 0; /* iterates as nothing */
    case JV_STR: {
        if (needle->kind != JV_STR)
            return needle->kind == JV_UNDEF ? jinja_fail_undefined(c, line, needle)
                                            : JFAIL(c, line, MOEC_ERR_INVALID_ARG,
                                                    "'in <string>' requires string as left operand, not %s",
                                                    jinja_type_name(needle));
        const jinja_str *h = &hay->u.s, *s = &needle->u.s;
        if (!s->n) {
            *res = 1;
            return 0;
        }
        for (size_t i = 0; i + s->n <= h->n; i++)
            if (h->p[i] == s->p[0] && !memcmp(h->p + i, s->p, s->n)) {
                *res = 1;
                break;
            }
        return 0;
    }
    case JV_LIST:
        for (size_t i = 0; i < hay->u.l->n; i++)
            if (jinja_equal(needle, &hay->u.l->v[i])) {
                *res = 1;
                break;
            }
        return 0;
    case JV_DICT: *res = jinja_dict_find(hay->u.d, needle) != NULL; return 0;
    default:
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "argument of type '%s' is not iterable", jinja_type_name(hay));
    }
}

static int compare(jinja_ctx *c, int line, int op, const jinja_value *a, const jinja_value *b, jinja_value *out)
{
    int r;
    switch (op) {
    case JOP_EQ: r = jinja_equal(a, b); break;
    case JOP_NE: r = !jinja_equal(a, b); break;
    case 'i':
    case 'n':
        if (contains(c, line, a, b, &r))
            return -1;
        if (op == 'n')
            r = !r;
        break;
    default:
        if (jinja_order(c, line, op, a, b, &r))
            return -1;
    }
    *out = jinja_bool(r);
    return 0;
}

/* Python's seq[start:stop:step] on a string (by code point) or list. */
static int slice(jinja_ctx *c, int line, const jinja_value *obj, const jinja_value *bounds, jinja_value *out)
{
    int64_t v[3];
    int given[3];
    for (int k = 0; k < 3; k++) {
        given[k] = bounds[k].kind != JV_NONE;
        if (given[k] && !is_int(&bounds[k]))
            return JFAIL(c, line, MOEC_ERR_INVALID_ARG,
                         "slice indices must be integers or None, not %s", jinja_type_name(&bounds[k]));
        v[k] = given[k] ? ival(&bounds[k]) : 0;
    }
    int64_t step = given[2] ? v[2] : 1;
    if (!step)
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "slice step cannot be zero");
    if (obj->kind == JV_UNDEF)
        return jinja_fail_undefined(c, line, obj);
    if (obj->kind != JV_STR && obj->kind != JV_LIST)
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "'%s' object is not subscriptable", jinja_type_name(obj));
    /* the code points' offsets of a string */
    size_t n;
    size_t *offs = NULL;
    if (obj->kind == JV_STR) {
        n = jinja_utf8_count(obj->u.s.p, obj->u.s.n);
        if (!(offs = jinja_alloc(c, (n + 1) * sizeof *offs)))
            return -1;
        size_t i = 0, k = 0;
        while (i < obj->u.s.n) {
            uint32_t cp;
            offs[k++] = i;
            i += (size_t)jinja_utf8_next(obj->u.s.p + i, obj->u.s.n - i, &cp);
        }
        offs[k] = obj->u.s.n;
    } else {
        n = obj->u.l->n;
    }
    int64_t len = (int64_t)n, start, stop;
    for (int k = 0; k < 2; k++) { /* Python's PySlice_AdjustIndices */
        int64_t *dst = k ? &stop : &start;
        if (!given[k]) {
            *dst = step < 0 ? (k ? -1 : len - 1) : (k ? len : 0);
            continue;
        }
        int64_t x = v[k];
        if (x < 0) {
            x += len;
            if (x < 0)
                x = step < 0 ? -1 : 0;
        } else if (x >= len) {
            x = step < 0 ? len - 1 : len;
        }
        *dst = x;
    }
    size_t count = 0;
    if (step > 0 && start < stop)
        count = (size_t)((stop - start - 1) / step + 1);
    else if (step < 0 && stop < start)
        count = (size_t)((start - stop - 1) / (-step) + 1);
    if (obj->kind == JV_LIST) {
        if (jinja_new_list(c, count, out))
            return -1;
        out->tuple = obj->tuple;
        for (size_t i = 0; i < count; i++)
            out->u.l->v[i] = obj->u.l->v[start + (int64_t)i * step];
        return 0;
    }
    moec_buf b = {0};
    for (size_t i = 0; i < count; i++) {
        int64_t k = start + (int64_t)i * step;
        moec_buf_put(&b, obj->u.s.p + offs[k], offs[k + 1] - offs[k]);
    }
    return jinja_buf_to_str(c, line, &b, out);
}

/* ---- expressions -------------------------------------------------------------------------- */

static int eval_args(jinja_ctx *c, const jinja_node *n, jinja_value **args, jinja_value **kw)
{
    size_t na = n->args.n, nk = n->kwargs.n;
    *args = jinja_alloc(c, (na + 1) * sizeof **args);
    *kw = jinja_alloc(c, (nk + 1) * sizeof **kw);
    if (!*args || !*kw)
        return -1;
    for (size_t i = 0; i < na; i++)
        if (jinja_eval(c, n->args.v[i], &(*args)[i]))
            return -1;
    for (size_t i = 0; i < nk; i++)
        if (jinja_eval(c, n->kwargs.v[i], &(*kw)[i]))
            return -1;
    return 0;
}

/* A filter node applied to its operand (base when its operand is the
 * body of a filter block or set block). */
static int eval_filter(jinja_ctx *c, const jinja_node *n, const jinja_value *base, jinja_value *out)
{
    jinja_value v, *args, *kw;
    int rc = enter(c, n->line);
    if (!rc && !n->a)
        v = *base;
    else if (!rc)
        rc = n->a->kind == JN_FILTER ? eval_filter(c, n->a, base, &v) : jinja_eval(c, n->a, &v);
    rc = rc || eval_args(c, n, &args, &kw) ||
         jinja_filter(c, n->line, &n->name, &v, args, n->args.n, n->names, kw, n->kwargs.n, out);
    c->depth--;
    return rc;
}

static int eval_node(jinja_ctx *c, const jinja_node *n, jinja_value *out)
{
    jinja_value a, b, *args, *kw;
    switch (n->kind) {
    case JN_CONST: *out = n->value; return 0;
    case JN_NAME: {
        const jinja_value *v = scope_get(c->scope, n->name.p, n->name.n);
        if (v)
            *out = *v;
        else if (!jinja_global(c, &n->name, out))
            *out = jinja_undefined(c, "'%.*s' is undefined", (int)n->name.n, n->name.p);
        return 0;
    }
    case JN_LIST:
    case JN_TUPLE:
        if (jinja_new_list(c, n->args.n, out))
            return -1;
        out->tuple = n->kind == JN_TUPLE;
        for (size_t i = 0; i < n->args.n; i++)
            if (jinja_eval(c, n->args.v[i], &out->u.l->v[i]))
                return -1;
        return 0;
    case JN_DICT:
        if (jinja_new_dict(c, n->args.n, JV_DICT, out))
            return -1;
        for (size_t i = 0; i < n->args.n; i++)
            if (jinja_eval(c, n->args.v[i], &a) || jinja_eval(c, n->kwargs.v[i], &b) ||
                jinja_dict_set(c, out->u.d, a, b))
                return -1;
        return 0;
    case JN_ATTR:
        if (jinja_eval(c, n->a, &a))
            return -1;
        if (a.kind == JV_UNDEF)
            return jinja_fail_undefined(c, n->line, &a);
        return jinja_getattr(c, n->line, &a, n->name.p, n->name.n, out);
    case JN_ITEM:
        if (jinja_eval(c, n->a, &a) || jinja_eval(c, n->b, &b))
            return -1;
        if (a.kind == JV_UNDEF)
            return jinja_fail_undefined(c, n->line, &a);
        return jinja_getitem(c, n->line, &a, &b, out);
    case JN_SLICE: {
        jinja_value bounds[3] = {jinja_none(), jinja_none(), jinja_none()};
        const jinja_node *parts[3] = {n->b, n->c, n->d};
        if (jinja_eval(c, n->a, &a))
            return -1;
        for (int k = 0; k < 3; k++)
            if (parts[k] && jinja_eval(c, parts[k], &bounds[k]))
                return -1;
        return slice(c, n->line, &a, bounds, out);
    }
    case JN_CALL:
        if (jinja_eval(c, n->a, &a) || eval_args(c, n, &args, &kw))
            return -1;
        return jinja_call(c, n->line, &a, args, n->args.n, n->names, kw, n->kwargs.n, out);
    case JN_FILTER: return eval_filter(c, n, NULL, out);
    case JN_TEST: {
        int r;
        if (jinja_eval(c, n->a, &a) || eval_args(c, n, &args, &kw))
            return -1;
        if (n->kwargs.n)
            return JFAIL(c, n->line, MOEC_ERR_UNSUPPORTED, "keyword arguments to tests are not supported");
        if (jinja_test(c, n->line, &n->name, &a, args, n->args.n, &r))
            return -1;
        *out = jinja_bool(n->op ? !r : r);
        return 0;
    }
    case JN_UNARY:
        if (jinja_eval(c, n->a, &a))
            return -1;
        if (n->op == '!') {
            *out = jinja_bool(!jinja_truthy(&a));
            return 0;
        }
        if (a.kind == JV_UNDEF)
            return jinja_fail_undefined(c, n->line, &a);
        if (!is_num(&a))
            return JFAIL(c, n->line, MOEC_ERR_INVALID_ARG, "bad operand type for unary %c: '%s'", n->op,
                         jinja_type_name(&a));
        if (n->op == '+')
            *out = a.kind == JV_BOOL ? jinja_int(a.u.b) : a;
        else if (a.kind == JV_FLOAT)
            *out = jinja_float(-a.u.f);
        else if (ival(&a) == INT64_MIN)
            return overflow(c, n->line);
        else
            *out = jinja_int(-ival(&a));
        return 0;
    case JN_BINARY:
        if (jinja_eval(c, n->a, &a) || jinja_eval(c, n->b, &b))
            return -1;
        return binary(c, n->line, n->op, &a, &b, out);
    case JN_AND:
    case JN_OR:
        if (jinja_eval(c, n->a, &a))
            return -1;
        if (jinja_truthy(&a) == (n->kind == JN_OR)) {
            *out = a;
            return 0;
        }
        return jinja_eval(c, n->b, out);
    case JN_COMPARE:
        if (jinja_eval(c, n->a, &a) || jinja_eval(c, n->b, &b))
            return -1;
        return compare(c, n->line, n->op, &a, &b, out);
    case JN_COND:
        if (jinja_eval(c, n->a, &a))
            return -1;
        if (jinja_truthy(&a))
            return jinja_eval(c, n->b, out);
        if (n->c)
            return jinja_eval(c, n->c, out);
        *out = jinja_undefined(c, "the inline if expression evaluated to false and no else section was defined");
        return 0;
    default: return JFAIL(c, n->line, MOEC_ERR_INTERNAL, "a statement where an expression belongs");
    }
}

int jinja_eval(jinja_ctx *c, const jinja_node *n, jinja_value *out)
{
    int rc = enter(c, n->line) || eval_node(c, n, out);
    c->depth--;
    return rc;
}

/* ---- statements --------------------------------------------------------------------------- */

static int exec_body(jinja_ctx *c, const jinja_nodes *body);

/* The text the statements of body write, as a string. */
static int capture(jinja_ctx *c, int line, const jinja_nodes *body, jinja_value *out)
{
    moec_buf buf = {0}, *saved = c->out;
    c->out = &buf;
    int rc = exec_body(c, body);
    c->out = saved;
    if (rc) {
        moec_buf_free(&buf);
        return -1;
    }
    return jinja_buf_to_str(c, line, &buf, out);
}

/* Assigns v to a target in scope s: a name, names (v unpacked), or a
 * namespace's attribute. */
static int assign(jinja_ctx *c, jinja_scope *s, const jinja_node *t, const jinja_value *v)
{
    if (t->kind == JN_NAME)
        return scope_set(c, s, t->name, *v);
    if (t->kind == JN_NSREF) {
        const jinja_value *ns = scope_get(c->scope, t->a->name.p, t->a->name.n);
        if (!ns || ns->kind != JV_NS)
            return JFAIL(c, t->line, MOEC_ERR_INVALID_ARG, "cannot assign attribute on non-namespace object");
        jinja_value key;
        return jinja_new_str(c, t->line, t->name.p, t->name.n, &key) || jinja_dict_set(c, ns->u.d, key, *v);
    }
    jinja_list *items;
    if (v->kind == JV_UNDEF)
        return jinja_fail_undefined(c, t->line, v);
    if (jinja_iterate(c, t->line, v, &items))
        return -1;
    if (items->n != t->args.n)
        return JFAIL(c, t->line, MOEC_ERR_INVALID_ARG, "%s values to unpack (expected %zu, got %zu)",
                     items->n > t->args.n ? "too many" : "not enough", t->args.n, items->n);
    for (size_t i = 0; i < items->n; i++)
        if (assign(c, s, t->args.v[i], &items->v[i]))
            return -1;
    return 0;
}

static int exec_for(jinja_ctx *c, const jinja_node *n)
{
    jinja_value it;
    jinja_list *items;
    jinja_scope *outer = c->scope;
    if (jinja_eval(c, n->b, &it) || jinja_iterate(c, n->line, &it, &items))
        return -1;
    if (n->c) { /* for x in xs if cond: the items cond keeps */
        jinja_list *kept = jinja_alloc(c, sizeof *kept);
        if (!kept || (items->n && !(kept->v = jinja_alloc(c, items->n * sizeof *kept->v))))
            return -1;
        for (size_t i = 0; i < items->n; i++) {
            jinja_value keep;
            if (!(c->scope = scope_new(c, outer)) || assign(c, c->scope, n->a, &items->v[i]) ||
                jinja_eval(c, n->c, &keep)) {
                c->scope = outer;
                return -1;
            }
            if (jinja_truthy(&keep))
                kept->v[kept->n++] = items->v[i];
        }
        c->scope = outer;
        items = kept;
    }
    jinja_loop *loop = jinja_alloc(c, sizeof *loop);
    if (!loop)
        return -1;
    loop->items = items;
    int rc = 0;
    for (size_t i = 0; i < items->n && !rc; i++) {
        jinja_value lv = {.kind = JV_LOOP, .u.loop = loop};
        jinja_str name = {"loop", 4};
        loop->i = i;
        if (jinja_step(c, n->line) || !(c->scope = scope_new(c, outer)) || scope_set(c, c->scope, name, lv) ||
            assign(c, c->scope, n->a, &items->v[i]) || exec_body(c, &n->body))
            rc = -1;
        c->scope = outer;
        if (c->loop_ctl == 1) {
            c->loop_ctl = 0;
            break;
        }
        c->loop_ctl = 0;
    }
    if (!rc && !items->n && n->orelse.n) {
        if (!(c->scope = scope_new(c, outer)))
            return -1;
        rc = exec_body(c, &n->orelse);
        c->scope = outer;
    }
    return rc;
}

static int exec_node(jinja_ctx *c, const jinja_node *n)
{
    jinja_value v;
    switch (n->kind) {
    case JN_TEXT: return emit(c, n->line, n->value.u.s.p, n->value.u.s.n);
    case JN_OUTPUT:
        if (jinja_eval(c, n->a, &v))
            return -1;
        if (v.kind == JV_STR)
            return emit(c, n->line, v.u.s.p, v.u.s.n);
        if (jinja_write_str(c, n->line, c->out, &v))
            return -1;
        return emit(c, n->line, "", 0);
    case JN_IF:
        if (jinja_eval(c, n->a, &v))
            return -1;
        return exec_body(c, jinja_truthy(&v) ? &n->body : &n->orelse);
    case JN_FOR: return exec_for(c, n);
    case JN_SET: return jinja_eval(c, n->b, &v) || assign(c, c->scope, n->a, &v);
    case JN_SET_BLOCK:
        if (capture(c, n->line, &n->body, &v) || (n->b && eval_filter(c, n->b, &v, &v)))
            return -1;
        return assign(c, c->scope, n->a, &v);
    case JN_FILTER_BLOCK:
        if (capture(c, n->line, &n->body, &v) || eval_filter(c, n->b, &v, &v))
            return -1;
        if (v.kind != JV_STR && jinja_to_str(c, n->line, &v, &v))
            return -1;
        return emit(c, n->line, v.u.s.p, v.u.s.n);
    case JN_MACRO: {
        jinja_value m = {.kind = JV_MACRO, .u.macro = n};
        return scope_set(c, c->scope, n->name, m);
    }
    case JN_WITH: {
        jinja_scope *outer = c->scope, *s = scope_new(c, outer);
        if (!s)
            return -1;
        for (size_t i = 0; i < n->kwargs.n; i++)
            if (jinja_eval(c, n->kwargs.v[i], &v) || scope_set(c, s, n->names[i], v))
                return -1;
        c->scope = s;
        int rc = exec_body(c, &n->body);
        c->scope = outer;
        return rc;
    }
    case JN_BREAK: c->loop_ctl = 1; return 0;
    case JN_CONTINUE: c->loop_ctl = 2; return 0;
    default: return JFAIL(c, n->line, MOEC_ERR_INTERNAL, "an expression where a statement belongs");
    }
}

static int exec_stmt(jinja_ctx *c, const jinja_node *n)
{
    int rc = enter(c, n->line) || exec_node(c, n);
    c->depth--;
    return rc;
}

static int exec_body(jinja_ctx *c, const jinja_nodes *body)
{
    for (size_t i = 0; i < body->n; i++) {
        if (exec_stmt(c, body->v[i]))
            return -1;
        if (c->loop_ctl)
            return 0;
    }
    return 0;
}

/* ---- calls -------------------------------------------------------------------------------- */

static int call_macro(jinja_ctx *c, int line, const jinja_node *m, const jinja_value *args, size_t n_args,
                      const jinja_str *kw_names, const jinja_value *kw_vals, size_t n_kw, jinja_value *out)
{
    size_t np = m->args.n;
    if (n_args > np)
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "macro '%.*s' takes not more than %zu argument(s)",
                     (int)m->name.n, m->name.p, np);
    if (c->calls >= JINJA_MAX_CALLS)
        return JFAIL(c, line, MOEC_ERR_CAPACITY, "macros call each other more than %d deep", JINJA_MAX_CALLS);
    jinja_scope *saved = c->scope, *s = scope_new(c, c->root);
    if (!s)
        return -1;
    for (size_t k = 0; k < n_kw; k++) {
        size_t i = 0;
        while (i < np && !(m->names[i].n == kw_names[k].n && !memcmp(m->names[i].p, kw_names[k].p, kw_names[k].n)))
            i++;
        if (i == np)
            return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "macro '%.*s' takes no keyword argument '%.*s'",
                         (int)m->name.n, m->name.p, (int)kw_names[k].n, kw_names[k].p);
        if (i < n_args)
            return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "macro '%.*s' got multiple values for argument '%.*s'",
                         (int)m->name.n, m->name.p, (int)kw_names[k].n, kw_names[k].p);
    }
    c->calls++;
    c->scope = s;
    int rc = 0;
    for (size_t i = 0; i < np && !rc; i++) {
        jinja_value v;
        size_t k = 0;
        while (k < n_kw && !(m->names[i].n == kw_names[k].n && !memcmp(m->names[i].p, kw_names[k].p, kw_names[k].n)))
            k++;
        if (i < n_args)
            v = args[i];
        else if (k < n_kw)
            v = kw_vals[k];
        else if (m->args.v[i])
            rc = jinja_eval(c, m->args.v[i], &v);
        else
            v = jinja_undefined(c, "parameter '%.*s' was not provided", (int)m->names[i].n, m->names[i].p);
        if (!rc)
            rc = scope_set(c, s, m->names[i], v);
    }
    if (!rc)
        rc = capture(c, line, &m->body, out);
    c->scope = saved;
    c->calls--;
    return rc;
}

int jinja_call(jinja_ctx *c, int line, const jinja_value *fn, const jinja_value *args, size_t n_args,
               const jinja_str *kw_names, const jinja_value *kw_vals, size_t n_kw, jinja_value *out)
{
    switch ((jinja_kind)fn->kind) {
    case JV_MACRO: return call_macro(c, line, fn->u.macro, args, n_args, kw_names, kw_vals, n_kw, out);
    case JV_FUNC:
    case JV_METHOD: return jinja_call_native(c, line, fn, args, n_args, kw_names, kw_vals, n_kw, out);
    case JV_UNDEF: return jinja_fail_undefined(c, line, fn);
    default:
        return JFAIL(c, line, MOEC_ERR_INVALID_ARG, "'%s' object is not callable", jinja_type_name(fn));
    }
}

/* ---- the render ---------------------------------------------------------------------------- */

moec_status jinja_render(const char *src, size_t len, const cJSON *vars, const jinja_limits *lim, char **out,
                         size_t *out_len)
{
    static const jinja_limits defaults = {JINJA_MAX_OUTPUT, JINJA_MAX_MEMORY, JINJA_MAX_STEPS};
    if (!out || !out_len || (!src && len))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "jinja_render: NULL argument");
    *out = NULL;
    *out_len = 0;
    jinja_ctx c = {.lim = lim ? *lim : defaults};
    moec_buf result = {0};
    jinja_toks toks = {0};
    jinja_nodes prog;
    c.out = &result;
    int rc = !(c.root = c.scope = scope_new(&c, NULL)) || jinja_lex(&c, src ? src : "", len, &toks) ||
             jinja_parse(&c, &toks, &prog);
    for (const cJSON *v = vars ? vars->child : NULL; v && !rc; v = v->next) {
        jinja_value val;
        jinja_str name = {v->string, strlen(v->string)};
        rc = jinja_from_json(&c, v, &val) || scope_set(&c, c.root, name, val);
    }
    if (!rc)
        rc = exec_body(&c, &prog);
    jinja_arena_free(&c);
    if (rc || (result.oom && JFAIL(&c, 0, MOEC_ERR_OOM, "out of memory"))) {
        moec_buf_free(&result);
        return c.status != MOEC_OK ? c.status : MOEC_ERR(MOEC_ERR_INTERNAL, "chat template: an error went unrecorded");
    }
    if (!result.data && !(result.data = calloc(1, 1)))
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory rendering the chat template");
    *out = result.data;
    *out_len = result.len;
    return MOEC_OK;
}
