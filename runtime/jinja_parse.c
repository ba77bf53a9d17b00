/* jinja_parse.c — tokens into a tree, following jinja2's parser rule for
 * rule (its operator precedence, its tuples, its assignment targets), so
 * that a template means here what it means to jinja2. Tags moec does not
 * have, and filters and tests it does not know, are errors naming them,
 * found when the template is read (as jinja2 finds unknown filters). */
#include <stdarg.h>
#include <string.h>

#include "runtime/jinja.h"

typedef struct parser {
    jinja_ctx *c;
    const jinja_toks *t;
    size_t i;
    int depth; /* nesting of blocks and expressions */
    int loops; /* for loops around the statement being read */
} parser;

static const jinja_tok *cur(const parser *P) { return &P->t->v[P->i]; }
static const jinja_tok *peek(const parser *P) { return &P->t->v[P->i + (P->i + 1 < P->t->n)]; }
static void next(parser *P)
{
    if (P->i + 1 < P->t->n)
        P->i++;
}

static int tok_is_name(const jinja_tok *t, const char *name)
{
    return t->kind == JT_NAME && t->text.n == strlen(name) && !memcmp(t->text.p, name, t->text.n);
}
static int tok_is_op(const jinja_tok *t, int op) { return t->kind == JT_OP && t->op == op; }

/* What a token is, for messages. */
static const char *describe(const jinja_tok *t, char *buf, size_t cap)
{
    switch (t->kind) {
    case JT_DATA: return "template text";
    case JT_VAR_BEGIN: return "'{{'";
    case JT_VAR_END: return "'}}'";
    case JT_BLOCK_BEGIN: return "'{%'";
    case JT_BLOCK_END: return "'%}'";
    case JT_NAME: snprintf(buf, cap, "'%.*s'", (int)(t->text.n > 40 ? 40 : t->text.n), t->text.p); return buf;
    case JT_STRING: return "a string";
    case JT_INT: return "an integer";
    case JT_FLOAT: return "a number";
    case JT_EOF: return "the end of the template";
    case JT_OP: break;
    }
    static const char *two[] = {"==", "!=", "<=", ">=", "//", "**"};
    if (t->op >= JOP_EQ)
        snprintf(buf, cap, "'%s'", two[t->op - JOP_EQ]);
    else
        snprintf(buf, cap, "'%c'", t->op);
    return buf;
}

static int fail_at(parser *P, const jinja_tok *t, const char *want)
{
    char buf[64];
    return JFAIL(P->c, t->line, MOEC_ERR_FORMAT, "expected %s, got %s", want, describe(t, buf, sizeof buf));
}

static int expect_op(parser *P, int op, const char *want)
{
    if (!tok_is_op(cur(P), op))
        return fail_at(P, cur(P), want);
    next(P);
    return 0;
}

static int expect_end(parser *P)
{
    if (cur(P)->kind != JT_BLOCK_END)
        return fail_at(P, cur(P), "'%}'");
    next(P);
    return 0;
}

static jinja_node *node(parser *P, jinja_node_kind kind, int line)
{
    jinja_node *n = jinja_alloc(P->c, sizeof *n);
    if (n) {
        n->kind = kind;
        n->line = line;
    }
    return n;
}

/* A growing list of nodes in the arena. */
typedef struct nodevec {
    jinja_nodes l;
    size_t cap;
    jinja_str *names; /* parallel names, when the list has them */
} nodevec;

static int vec_push(parser *P, nodevec *v, jinja_node *n, const jinja_str *name)
{
    if (v->l.n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 4;
        if (!(v->l.v = jinja_grow(P->c, v->l.v, v->l.n, v->cap, sizeof *v->l.v)) ||
            (v->names && !(v->names = jinja_grow(P->c, v->names, v->l.n, v->cap, sizeof *v->names))))
            return -1;
    }
    if (name && !v->names && !(v->names = jinja_grow(P->c, NULL, 0, v->cap, sizeof *v->names)))
        return -1;
    if (name)
        v->names[v->l.n] = *name;
    v->l.v[v->l.n++] = n;
    return 0;
}

static int enter(parser *P, int line)
{
    if (++P->depth > JINJA_MAX_NESTING)
        return JFAIL(P->c, line, MOEC_ERR_CAPACITY, "blocks or expressions nested more than %d deep",
                     JINJA_MAX_NESTING);
    return 0;
}

/* ---- expressions ----------------------------------------------------------------------------- */

static jinja_node *parse_expression(parser *P, int with_condexpr);
static jinja_node *parse_tuple(parser *P, int with_condexpr, const char *extra_end, int explicit_parens);
static jinja_node *parse_unary(parser *P, int with_filter);

/* (args, name=value, ...) after a callee, a filter or a test. */
static int parse_call_args(parser *P, jinja_node *n)
{
    nodevec args = {0}, kw = {0};
    int line = cur(P)->line;
    if (expect_op(P, '(', "'('"))
        return -1;
    int need_comma = 0;
    while (!tok_is_op(cur(P), ')')) {
        if (need_comma) {
            if (expect_op(P, ',', "',' or ')'"))
                return -1;
            if (tok_is_op(cur(P), ')'))
                break;
        }
        if (tok_is_op(cur(P), '*') || tok_is_op(cur(P), JOP_POW))
            return JFAIL(P->c, cur(P)->line, MOEC_ERR_UNSUPPORTED, "*args and **kwargs in calls are not supported");
        if (cur(P)->kind == JT_NAME && tok_is_op(peek(P), '=')) {
            jinja_str name = cur(P)->text;
            next(P);
            next(P);
            jinja_node *v = parse_expression(P, 1);
            if (!v || vec_push(P, &kw, v, &name))
                return -1;
        } else {
            if (kw.l.n)
                return JFAIL(P->c, line, MOEC_ERR_FORMAT, "a positional argument follows a keyword argument");
            jinja_node *v = parse_expression(P, 1);
            if (!v || vec_push(P, &args, v, NULL))
                return -1;
        }
        need_comma = 1;
    }
    next(P);
    n->args = args.l;
    n->kwargs = kw.l;
    n->names = kw.names;
    return 0;
}

/* A dotted name after '|' or 'is'. */
static int parse_dotted(parser *P, jinja_str *name)
{
    if (cur(P)->kind != JT_NAME)
        return fail_at(P, cur(P), "a name");
    *name = cur(P)->text;
    next(P);
    if (tok_is_op(cur(P), '.'))
        return JFAIL(P->c, cur(P)->line, MOEC_ERR_UNSUPPORTED, "dotted filter and test names are not supported");
    return 0;
}

/* Filters after '|' applied to n (n NULL: a filter block's body). */
static jinja_node *parse_filter(parser *P, jinja_node *n, int start_inline)
{
    while (tok_is_op(cur(P), '|') || start_inline) {
        if (!start_inline)
            next(P);
        start_inline = 0;
        jinja_node *f = node(P, JN_FILTER, cur(P)->line);
        if (!f || parse_dotted(P, &f->name) || jinja_filter_known(P->c, f->line, &f->name))
            return NULL;
        f->a = n;
        if (tok_is_op(cur(P), '(') && parse_call_args(P, f))
            return NULL;
        n = f;
    }
    return n;
}

static jinja_node *parse_primary(parser *P);
static jinja_node *parse_postfix(parser *P, jinja_node *n);

static jinja_node *parse_test(parser *P, jinja_node *n)
{
    jinja_node *t = node(P, JN_TEST, cur(P)->line);
    if (!t)
        return NULL;
    next(P); /* is */
    if (tok_is_name(cur(P), "not")) {
        t->op = 1;
        next(P);
    }
    if (parse_dotted(P, &t->name) || jinja_test_known(P->c, t->line, &t->name))
        return NULL;
    t->a = n;
    const jinja_tok *k = cur(P);
    if (tok_is_op(k, '(')) {
        if (parse_call_args(P, t))
            return NULL;
    } else if ((k->kind == JT_NAME || k->kind == JT_STRING || k->kind == JT_INT || k->kind == JT_FLOAT ||
                tok_is_op(k, '[') || tok_is_op(k, '{')) &&
               !tok_is_name(k, "else") && !tok_is_name(k, "or") && !tok_is_name(k, "and")) {
        if (tok_is_name(k, "is"))
            return JFAIL(P->c, k->line, MOEC_ERR_FORMAT, "tests cannot be chained with 'is'"), NULL;
        jinja_node *arg = parse_primary(P);
        if (!arg || !(arg = parse_postfix(P, arg)))
            return NULL;
        nodevec args = {0};
        if (vec_push(P, &args, arg, NULL))
            return NULL;
        t->args = args.l;
    }
    return t;
}

/* [b], [b:c:d] or .name after n. */
static jinja_node *parse_subscript(parser *P, jinja_node *n)
{
    const jinja_tok *t = cur(P);
    int line = t->line;
    next(P);
    if (t->op == '.') {
        const jinja_tok *a = cur(P);
        next(P);
        if (a->kind == JT_NAME) {
            jinja_node *g = node(P, JN_ATTR, line);
            if (g) {
                g->a = n;
                g->name = a->text;
            }
            return g;
        }
        if (a->kind != JT_INT)
            return fail_at(P, a, "a name or a number after '.'"), NULL;
        jinja_node *g = node(P, JN_ITEM, line), *k = node(P, JN_CONST, line);
        if (!g || !k)
            return NULL;
        k->value = jinja_int(a->i);
        g->a = n;
        g->b = k;
        return g;
    }
    /* '[': items (a tuple when several) or one slice */
    nodevec items = {0};
    jinja_node *slice = NULL;
    while (!tok_is_op(cur(P), ']')) {
        if (items.l.n && expect_op(P, ',', "',' or ']'"))
            return NULL;
        jinja_node *parts[3] = {0};
        int is_slice = 0;
        if (!tok_is_op(cur(P), ':') && !(parts[0] = parse_expression(P, 1)))
            return NULL;
        for (int k = 1; k < 3 && tok_is_op(cur(P), ':'); k++) {
            is_slice = 1;
            next(P);
            if (!tok_is_op(cur(P), ':') && !tok_is_op(cur(P), ']') && !tok_is_op(cur(P), ',') &&
                !(parts[k] = parse_expression(P, 1)))
                return NULL;
        }
        if (is_slice) {
            if (!(slice = node(P, JN_SLICE, line)))
                return NULL;
            slice->b = parts[0];
            slice->c = parts[1];
            slice->d = parts[2];
            if (vec_push(P, &items, slice, NULL))
                return NULL;
        } else if (vec_push(P, &items, parts[0], NULL)) {
            return NULL;
        }
    }
    next(P);
    if (items.l.n == 1 && items.l.v[0]->kind == JN_SLICE) {
        items.l.v[0]->a = n;
        return items.l.v[0];
    }
    for (size_t k = 0; k < items.l.n; k++)
        if (items.l.v[k]->kind == JN_SLICE)
            return JFAIL(P->c, line, MOEC_ERR_UNSUPPORTED, "slices inside a tuple subscript are not supported"), NULL;
    jinja_node *g = node(P, JN_ITEM, line);
    if (!g)
        return NULL;
    g->a = n;
    if (items.l.n == 1) {
        g->b = items.l.v[0];
    } else {
        if (!(g->b = node(P, JN_TUPLE, line)))
            return NULL;
        g->b->args = items.l;
    }
    return g;
}

static jinja_node *parse_call(parser *P, jinja_node *n)
{
    jinja_node *call = node(P, JN_CALL, cur(P)->line);
    if (!call || parse_call_args(P, call))
        return NULL;
    call->a = n;
    return call;
}

static jinja_node *parse_postfix(parser *P, jinja_node *n)
{
    while (n) {
        if (tok_is_op(cur(P), '.') || tok_is_op(cur(P), '['))
            n = parse_subscript(P, n);
        else if (tok_is_op(cur(P), '('))
            n = parse_call(P, n);
        else
            break;
    }
    return n;
}

static jinja_node *parse_filter_expr(parser *P, jinja_node *n)
{
    while (n) {
        if (tok_is_op(cur(P), '|'))
            n = parse_filter(P, n, 0);
        else if (tok_is_name(cur(P), "is"))
            n = parse_test(P, n);
        else if (tok_is_op(cur(P), '('))
            n = parse_call(P, n);
        else
            break;
    }
    return n;
}

/* [a, b, ...] or {k: v, ...} (a trailing comma allowed). */
static jinja_node *parse_collection(parser *P, int is_dict)
{
    jinja_node *n = node(P, is_dict ? JN_DICT : JN_LIST, cur(P)->line);
    int close = is_dict ? '}' : ']';
    nodevec keys = {0}, vals = {0};
    if (!n)
        return NULL;
    next(P);
    while (!tok_is_op(cur(P), close)) {
        if (keys.l.n && expect_op(P, ',', is_dict ? "',' or '}'" : "',' or ']'"))
            return NULL;
        if (tok_is_op(cur(P), close))
            break;
        jinja_node *k = parse_expression(P, 1);
        if (!k || vec_push(P, &keys, k, NULL))
            return NULL;
        if (is_dict) {
            if (expect_op(P, ':', "':'"))
                return NULL;
            jinja_node *v = parse_expression(P, 1);
            if (!v || vec_push(P, &vals, v, NULL))
                return NULL;
        }
    }
    next(P);
    n->args = keys.l;
    n->kwargs = vals.l;
    return n;
}

static jinja_node *parse_primary(parser *P)
{
    const jinja_tok *t = cur(P);
    jinja_node *n;
    if (t->kind == JT_NAME) {
        n = node(P, JN_CONST, t->line);
        if (!n)
            return NULL;
        if (tok_is_name(t, "true") || tok_is_name(t, "True"))
            n->value = jinja_bool(1);
        else if (tok_is_name(t, "false") || tok_is_name(t, "False"))
            n->value = jinja_bool(0);
        else if (tok_is_name(t, "none") || tok_is_name(t, "None"))
            n->value = jinja_none();
        else {
            n->kind = JN_NAME;
            n->name = t->text;
        }
        next(P);
        return n;
    }
    if (t->kind == JT_STRING) { /* adjacent literals are one */
        if (!(n = node(P, JN_CONST, t->line)))
            return NULL;
        moec_buf b = {0};
        while (cur(P)->kind == JT_STRING) {
            moec_buf_put(&b, cur(P)->text.p, cur(P)->text.n);
            next(P);
        }
        return jinja_buf_to_str(P->c, t->line, &b, &n->value) ? NULL : n;
    }
    if (t->kind == JT_INT || t->kind == JT_FLOAT) {
        if (!(n = node(P, JN_CONST, t->line)))
            return NULL;
        n->value = t->kind == JT_INT ? jinja_int(t->i) : jinja_float(t->f);
        next(P);
        return n;
    }
    if (tok_is_op(t, '(')) {
        next(P);
        n = parse_tuple(P, 1, NULL, 1);
        return n && !expect_op(P, ')', "')'") ? n : NULL;
    }
    if (tok_is_op(t, '[') || tok_is_op(t, '{'))
        return parse_collection(P, t->op == '{');
    fail_at(P, t, "an expression");
    return NULL;
}

static jinja_node *parse_unary(parser *P, int with_filter)
{
    const jinja_tok *t = cur(P);
    jinja_node *n;
    if (enter(P, t->line))
        return NULL;
    if (tok_is_op(t, '-') || tok_is_op(t, '+')) {
        next(P);
        if (!(n = node(P, JN_UNARY, t->line)) || !(n->a = parse_unary(P, 0)))
            return NULL;
        n->op = t->op;
    } else {
        n = parse_primary(P);
    }
    n = parse_postfix(P, n);
    if (with_filter)
        n = parse_filter_expr(P, n);
    P->depth--;
    return n;
}

static jinja_node *binary(parser *P, jinja_node_kind kind, int op, int line, jinja_node *a, jinja_node *b)
{
    jinja_node *n = a && b ? node(P, kind, line) : NULL;
    if (n) {
        n->op = op;
        n->a = a;
        n->b = b;
    }
    return n;
}

/* operand (op operand)*, left-associative: ops lists the level's
 * operators (0-terminated). */
static jinja_node *parse_level(parser *P, jinja_node *(*operand)(parser *), const int *ops)
{
    jinja_node *l = operand(P);
    for (;;) {
        const int *op = ops;
        while (l && *op && !tok_is_op(cur(P), *op))
            op++;
        if (!l || !*op)
            return l;
        int line = cur(P)->line;
        next(P);
        l = binary(P, JN_BINARY, *op, line, l, operand(P));
    }
}

static jinja_node *parse_unary_filtered(parser *P) { return parse_unary(P, 1); }
static jinja_node *parse_pow(parser *P)
{
    static const int ops[] = {JOP_POW, 0};
    return parse_level(P, parse_unary_filtered, ops);
}
static jinja_node *parse_math2(parser *P)
{
    static const int ops[] = {'*', '/', JOP_FLOORDIV, '%', 0};
    return parse_level(P, parse_pow, ops);
}
static jinja_node *parse_concat(parser *P)
{
    static const int ops[] = {'~', 0};
    return parse_level(P, parse_math2, ops);
}
static jinja_node *parse_math1(parser *P)
{
    static const int ops[] = {'+', '-', 0};
    return parse_level(P, parse_concat, ops);
}

/* a < b < c is (a < b) and (b < c), b read twice (Jinja has no side effects). */
static jinja_node *parse_compare(parser *P)
{
    jinja_node *l = parse_math1(P), *result = l, *prev = NULL;
    while (l) {
        const jinja_tok *t = cur(P);
        int op, line = t->line;
        if (t->kind == JT_OP && (t->op == JOP_EQ || t->op == JOP_NE || t->op == '<' || t->op == '>' ||
                                 t->op == JOP_LE || t->op == JOP_GE)) {
            op = t->op;
            next(P);
        } else if (tok_is_name(t, "in")) {
            op = 'i';
            next(P);
        } else if (tok_is_name(t, "not") && tok_is_name(peek(P), "in")) {
            op = 'n';
            next(P);
            next(P);
        } else {
            break;
        }
        jinja_node *r = parse_math1(P);
        jinja_node *cmp = binary(P, JN_COMPARE, op, line, l, r);
        if (!cmp)
            return NULL;
        result = prev ? binary(P, JN_AND, 0, line, result, cmp) : cmp;
        prev = cmp;
        l = r;
    }
    return l ? result : NULL;
}

static jinja_node *parse_not(parser *P)
{
    if (!tok_is_name(cur(P), "not"))
        return parse_compare(P);
    int line = cur(P)->line;
    next(P);
    if (enter(P, line))
        return NULL;
    jinja_node *n = node(P, JN_UNARY, line);
    if (!n || !(n->a = parse_not(P)))
        return NULL;
    n->op = '!';
    P->depth--;
    return n;
}

/* operand (word operand)*: `and` and `or`. */
static jinja_node *parse_logic(parser *P, jinja_node *(*operand)(parser *), const char *word, jinja_node_kind kind)
{
    jinja_node *l = operand(P);
    while (l && tok_is_name(cur(P), word)) {
        int line = cur(P)->line;
        next(P);
        l = binary(P, kind, 0, line, l, operand(P));
    }
    return l;
}
static jinja_node *parse_and(parser *P) { return parse_logic(P, parse_not, "and", JN_AND); }
static jinja_node *parse_or(parser *P) { return parse_logic(P, parse_and, "or", JN_OR); }

static jinja_node *parse_condexpr(parser *P)
{
    int line = cur(P)->line;
    if (enter(P, line))
        return NULL;
    jinja_node *e = parse_or(P);
    while (e && tok_is_name(cur(P), "if")) {
        jinja_node *n = node(P, JN_COND, cur(P)->line);
        next(P);
        if (!n || !(n->a = parse_or(P)))
            return NULL;
        n->b = e;
        if (tok_is_name(cur(P), "else")) {
            next(P);
            if (!(n->c = parse_condexpr(P)))
                return NULL;
        }
        e = n;
    }
    P->depth--;
    return e;
}

static jinja_node *parse_expression(parser *P, int with_condexpr)
{
    return with_condexpr ? parse_condexpr(P) : parse_or(P);
}

static int tuple_end(const parser *P, const char *extra_end)
{
    const jinja_tok *t = cur(P);
    return t->kind == JT_VAR_END || t->kind == JT_BLOCK_END || tok_is_op(t, ')') ||
           (extra_end && tok_is_name(t, extra_end));
}

/* Expressions separated by commas: one, or a tuple when there is a comma. */
static jinja_node *parse_tuple(parser *P, int with_condexpr, const char *extra_end, int explicit_parens)
{
    int line = cur(P)->line, is_tuple = 0;
    nodevec items = {0};
    for (;;) {
        if (items.l.n && expect_op(P, ',', "','"))
            return NULL;
        if (tuple_end(P, extra_end))
            break;
        jinja_node *e = parse_expression(P, with_condexpr);
        if (!e || vec_push(P, &items, e, NULL))
            return NULL;
        if (!tok_is_op(cur(P), ','))
            break;
        is_tuple = 1;
    }
    if (!is_tuple && items.l.n)
        return items.l.v[0];
    if (!is_tuple && !explicit_parens)
        return fail_at(P, cur(P), "an expression"), NULL;
    jinja_node *n = node(P, JN_TUPLE, line);
    if (n)
        n->args = items.l;
    return n;
}

/* ---- statements ------------------------------------------------------------------------------ */

static int parse_body(parser *P, const char *const *ends, const char *block, int open_line, jinja_nodes *out);

/* A name, or names separated by commas (a tuple), to assign to; with
 * ns_ok, also name.attr (a namespace's attribute). */
static jinja_node *parse_target(parser *P, int ns_ok, const char *extra_end)
{
    const jinja_tok *t = cur(P);
    if (ns_ok && t->kind == JT_NAME && tok_is_op(peek(P), '.')) {
        jinja_node *n = node(P, JN_NSREF, t->line), *ns = node(P, JN_NAME, t->line);
        if (!n || !ns)
            return NULL;
        ns->name = t->text;
        n->a = ns;
        next(P);
        next(P);
        if (cur(P)->kind != JT_NAME)
            return fail_at(P, cur(P), "an attribute name"), NULL;
        n->name = cur(P)->text;
        next(P);
        return n;
    }
    int parens = tok_is_op(t, '(');
    if (parens)
        next(P);
    nodevec names = {0};
    int is_tuple = parens;
    for (;;) {
        const jinja_tok *k = cur(P);
        if (k->kind != JT_NAME || tok_is_name(k, "true") || tok_is_name(k, "false") || tok_is_name(k, "none") ||
            tok_is_name(k, "True") || tok_is_name(k, "False") || tok_is_name(k, "None"))
            return fail_at(P, k, "a variable name to assign to"), NULL;
        jinja_node *n = node(P, JN_NAME, k->line);
        if (!n || vec_push(P, &names, n, NULL))
            return NULL;
        n->name = k->text;
        next(P);
        if (!tok_is_op(cur(P), ','))
            break;
        is_tuple = 1;
        next(P);
        if ((parens && tok_is_op(cur(P), ')')) || tuple_end(P, extra_end) || tok_is_op(cur(P), '='))
            break;
    }
    if (parens && expect_op(P, ')', "')'"))
        return NULL;
    if (!is_tuple)
        return names.l.v[0];
    jinja_node *tup = node(P, JN_TUPLE, t->line);
    if (tup)
        tup->args = names.l;
    return tup;
}

static int expect_name(parser *P, const char *name)
{
    if (!tok_is_name(cur(P), name)) {
        char want[32];
        snprintf(want, sizeof want, "'%s'", name);
        return fail_at(P, cur(P), want);
    }
    next(P);
    return 0;
}

static jinja_node *parse_if(parser *P, int line)
{
    jinja_node *top = node(P, JN_IF, line), *n = top;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const endif[] = {"endif", NULL};
    if (!n)
        return NULL;
    for (;;) {
        if (!(n->a = parse_tuple(P, 0, NULL, 0)) || expect_end(P) || parse_body(P, ends, "if", line, &n->body))
            return NULL;
        if (tok_is_name(cur(P), "elif")) {
            jinja_node *e = node(P, JN_IF, cur(P)->line);
            nodevec orelse = {0};
            if (!e || vec_push(P, &orelse, e, NULL))
                return NULL;
            n->orelse = orelse.l;
            n = e;
            next(P);
            continue;
        }
        if (tok_is_name(cur(P), "else")) {
            next(P);
            if (expect_end(P) || parse_body(P, endif, "if", line, &n->orelse))
                return NULL;
        }
        next(P); /* endif */
        return expect_end(P) ? NULL : top;
    }
}

static jinja_node *parse_for(parser *P, int line)
{
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const endfor[] = {"endfor", NULL};
    jinja_node *n = node(P, JN_FOR, line);
    if (!n || !(n->a = parse_target(P, 0, "in")) || expect_name(P, "in") ||
        !(n->b = parse_tuple(P, 0, "recursive", 0)))
        return NULL;
    if (tok_is_name(cur(P), "if")) {
        next(P);
        if (!(n->c = parse_expression(P, 1)))
            return NULL;
    }
    if (tok_is_name(cur(P), "recursive"))
        return JFAIL(P->c, cur(P)->line, MOEC_ERR_UNSUPPORTED, "recursive for loops are not supported"), NULL;
    if (expect_end(P))
        return NULL;
    P->loops++;
    int rc = parse_body(P, ends, "for", line, &n->body);
    P->loops--;
    if (rc)
        return NULL;
    if (tok_is_name(cur(P), "else")) {
        next(P);
        if (expect_end(P) || parse_body(P, endfor, "for", line, &n->orelse))
            return NULL;
    }
    next(P); /* endfor */
    return expect_end(P) ? NULL : n;
}

static jinja_node *parse_set(parser *P, int line)
{
    static const char *const ends[] = {"endset", NULL};
    jinja_node *n = node(P, JN_SET, line);
    if (!n || !(n->a = parse_target(P, 1, NULL)))
        return NULL;
    if (tok_is_op(cur(P), '=')) {
        next(P);
        if (!(n->b = parse_tuple(P, 1, NULL, 0)))
            return NULL;
        return expect_end(P) ? NULL : n;
    }
    if (n->a->kind == JN_TUPLE)
        return fail_at(P, cur(P), "'='"), NULL;
    n->kind = JN_SET_BLOCK;
    if (tok_is_op(cur(P), '|') && !(n->b = parse_filter(P, NULL, 0)))
        return NULL;
    if (expect_end(P) || parse_body(P, ends, "set", line, &n->body))
        return NULL;
    next(P);
    return expect_end(P) ? NULL : n;
}

static jinja_node *parse_macro(parser *P, int line)
{
    static const char *const ends[] = {"endmacro", NULL};
    jinja_node *n = node(P, JN_MACRO, line);
    nodevec params = {0};
    if (!n)
        return NULL;
    if (cur(P)->kind != JT_NAME)
        return fail_at(P, cur(P), "the macro's name"), NULL;
    n->name = cur(P)->text;
    next(P);
    if (expect_op(P, '(', "'('"))
        return NULL;
    int defaults = 0;
    while (!tok_is_op(cur(P), ')')) {
        if (params.l.n && expect_op(P, ',', "',' or ')'"))
            return NULL;
        if (cur(P)->kind != JT_NAME)
            return fail_at(P, cur(P), "a parameter name"), NULL;
        jinja_str name = cur(P)->text;
        jinja_node *def = NULL;
        next(P);
        if (tok_is_op(cur(P), '=')) {
            next(P);
            if (!(def = parse_expression(P, 1)))
                return NULL;
            defaults = 1;
        } else if (defaults) {
            return JFAIL(P->c, cur(P)->line, MOEC_ERR_FORMAT, "a parameter without a default follows one with a default"),
                   NULL;
        }
        if (vec_push(P, &params, def, &name))
            return NULL;
    }
    next(P);
    n->args = params.l;
    n->names = params.names;
    int loops = P->loops;
    P->loops = 0;
    int rc = expect_end(P) || parse_body(P, ends, "macro", line, &n->body);
    P->loops = loops;
    if (rc)
        return NULL;
    next(P);
    return expect_end(P) ? NULL : n;
}

static jinja_node *parse_with(parser *P, int line)
{
    static const char *const ends[] = {"endwith", NULL};
    jinja_node *n = node(P, JN_WITH, line);
    nodevec vals = {0};
    if (!n)
        return NULL;
    while (cur(P)->kind != JT_BLOCK_END) {
        if (vals.l.n && expect_op(P, ',', "','"))
            return NULL;
        if (cur(P)->kind != JT_NAME)
            return fail_at(P, cur(P), "a variable name"), NULL;
        jinja_str name = cur(P)->text;
        next(P);
        jinja_node *v;
        if (expect_op(P, '=', "'='") || !(v = parse_expression(P, 1)) || vec_push(P, &vals, v, &name))
            return NULL;
    }
    n->kwargs = vals.l;
    n->names = vals.names;
    if (expect_end(P) || parse_body(P, ends, "with", line, &n->body))
        return NULL;
    next(P);
    return expect_end(P) ? NULL : n;
}

/* A statement after {%, its name the current token; appended to out
 * (a {% generation %} block appends its body). */
static int parse_statement(parser *P, nodevec *out)
{
    const jinja_tok *t = cur(P);
    int line = t->line;
    jinja_node *n = NULL;
    if (t->kind != JT_NAME)
        return fail_at(P, t, "a tag name");
    if (enter(P, line))
        return -1;
    next(P);
    if (tok_is_name(t, "if")) {
        n = parse_if(P, line);
    } else if (tok_is_name(t, "for")) {
        n = parse_for(P, line);
    } else if (tok_is_name(t, "set")) {
        n = parse_set(P, line);
    } else if (tok_is_name(t, "macro")) {
        n = parse_macro(P, line);
    } else if (tok_is_name(t, "with")) {
        n = parse_with(P, line);
    } else if (tok_is_name(t, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        if ((n = node(P, JN_FILTER_BLOCK, line)) &&
            (!(n->b = parse_filter(P, NULL, 1)) || expect_end(P) || parse_body(P, ends, "filter", line, &n->body) ||
             (next(P), expect_end(P))))
            n = NULL;
    } else if (tok_is_name(t, "break") || tok_is_name(t, "continue")) {
        if (!P->loops)
            return JFAIL(P->c, line, MOEC_ERR_FORMAT, "'%.*s' outside a for loop", (int)t->text.n, t->text.p);
        if ((n = node(P, t->text.n == 5 ? JN_BREAK : JN_CONTINUE, line)) && expect_end(P))
            n = NULL;
    } else if (tok_is_name(t, "generation")) { /* transformers' AssistantTracker: its body, as is */
        static const char *const ends[] = {"endgeneration", NULL};
        jinja_nodes body;
        if (expect_end(P) || parse_body(P, ends, "generation", line, &body))
            return -1;
        next(P);
        if (expect_end(P))
            return -1;
        for (size_t k = 0; k < body.n; k++)
            if (vec_push(P, out, body.v[k], NULL))
                return -1;
        P->depth--;
        return 0;
    } else {
        static const char *const jinja_tags[] = {"block", "extends", "include", "import", "from",
                                                 "call",  "autoescape", "do", "trans", "print", NULL};
        for (int k = 0; jinja_tags[k]; k++)
            if (tok_is_name(t, jinja_tags[k]))
                return JFAIL(P->c, line, MOEC_ERR_UNSUPPORTED, "the {%% %s %%} tag is not supported",
                             jinja_tags[k]);
        return JFAIL(P->c, line, MOEC_ERR_UNSUPPORTED, "unknown tag '%.*s'", (int)(t->text.n > 40 ? 40 : t->text.n),
                     t->text.p);
    }
    P->depth--;
    return n ? vec_push(P, out, n, NULL) : -1;
}

/* Statements and text up to {% X %} with X one of ends (NULL: up to the
 * end of the template); the current token is then X. */
static int parse_body(parser *P, const char *const *ends, const char *block, int open_line, jinja_nodes *out)
{
    nodevec body = {0};
    for (;;) {
        const jinja_tok *t = cur(P);
        if (t->kind == JT_DATA) {
            jinja_node *n = node(P, JN_TEXT, t->line);
            if (!n || vec_push(P, &body, n, NULL))
                return -1;
            n->value = jinja_str_value(t->text.p, t->text.n);
            next(P);
        } else if (t->kind == JT_VAR_BEGIN) {
            next(P);
            jinja_node *n = node(P, JN_OUTPUT, t->line);
            if (!n || !(n->a = parse_tuple(P, 1, NULL, 0)) || vec_push(P, &body, n, NULL))
                return -1;
            if (cur(P)->kind != JT_VAR_END)
                return fail_at(P, cur(P), "'}}'");
            next(P);
        } else if (t->kind == JT_BLOCK_BEGIN) {
            next(P);
            const jinja_tok *name = cur(P);
            for (int k = 0; ends && ends[k]; k++)
                if (tok_is_name(name, ends[k])) {
                    *out = body.l;
                    return 0;
                }
            static const char *const enders[] = {"endif", "endfor", "endset", "endmacro", "endwith",
                                                 "endfilter", "endgeneration", "elif", "else", "endraw", NULL};
            for (int k = 0; enders[k]; k++)
                if (tok_is_name(name, enders[k])) {
                    if (!block)
                        return JFAIL(P->c, name->line, MOEC_ERR_FORMAT, "unexpected '%s': no block is open",
                                     enders[k]);
                    return JFAIL(P->c, name->line, MOEC_ERR_FORMAT,
                                 "unexpected '%s': the innermost open block is '%s' (line %d)", enders[k],
                                 block, open_line);
                }
            if (parse_statement(P, &body))
                return -1;
        } else if (t->kind == JT_EOF) {
            if (ends) {
                int k = 0;
                while (ends[k + 1] && strncmp(ends[k], "end", 3))
                    k++;
                return JFAIL(P->c, open_line, MOEC_ERR_FORMAT,
                             "unclosed '%s' block: the template ends before its '%s'", block, ends[k]);
            }
            *out = body.l;
            return 0;
        } else {
            char buf[64];
            return JFAIL(P->c, t->line, MOEC_ERR_INTERNAL, "unexpected %s", describe(t, buf, sizeof buf));
        }
    }
}

int jinja_parse(jinja_ctx *c, const jinja_toks *toks, jinja_nodes *out)
{
    parser P = {.c = c, .t = toks};
    return parse_body(&P, NULL, NULL, 0, out);
}
