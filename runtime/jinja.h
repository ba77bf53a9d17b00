/* jinja.h — internals shared by runtime/jinja*.c: an interpreter of the
 * Jinja2 subset that chat templates use (the DeepSeek and Qwen ones that
 * tokenizer_config.json files publish), rendering as jinja2 does in the
 * environment transformers' apply_chat_template builds: a sandbox with
 * trim_blocks and lstrip_blocks, loop controls, raise_exception,
 * strftime_now and transformers' tojson. A template is lexed into tokens,
 * parsed into a tree of nodes, then evaluated over values that all live in
 * one arena, freed at once. docs/TOKENIZER.md ("Chat templates") lists what
 * is supported; anything else is an error naming it and its line. */
#ifndef MOEC_RT_JINJA_H
#define MOEC_RT_JINJA_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "moec_rt.h"
#include "strbuf.h"

/* What one render may take (docs/TOKENIZER.md, "Limits"). */
typedef struct jinja_limits {
    size_t max_output;  /* bytes of text (the result, a captured block, one string) */
    size_t max_memory;  /* bytes of the arena: the tree, every value, every scope */
    long long max_steps; /* nodes evaluated and loop iterations */
} jinja_limits;
#define JINJA_MAX_OUTPUT ((size_t)32 << 20)
#define JINJA_MAX_MEMORY ((size_t)512 << 20)
#define JINJA_MAX_STEPS 50000000ll
#define JINJA_MAX_NESTING 200 /* blocks, brackets and operators nested in the source */
#define JINJA_MAX_CALLS 64     /* macro calls in progress */
#define JINJA_MAX_DEPTH 3000   /* expressions and statements evaluated inside each other (stack) */
#define JINJA_MAX_RANGE 100000 /* range()'s items, as jinja2's sandbox allows */

/* Renders the template src[0..len) with the members of the JSON object vars
 * as its variables (JSON null is None; numbers without a fraction are
 * integers). *out is malloc'd and NUL-terminated, *out_len its length.
 * lim NULL: the JINJA_MAX_* bounds. Errors name the template line:
 * MOEC_ERR_FORMAT a syntax error, MOEC_ERR_UNSUPPORTED a construct, filter,
 * test, method or function moec does not have, MOEC_ERR_INVALID_ARG a
 * failure while rendering (raise_exception, an undefined value used, a
 * type error), MOEC_ERR_CAPACITY a bound passed. */
moec_status jinja_render(const char *src, size_t len, const cJSON *vars, const jinja_limits *lim,
                         char **out, size_t *out_len);

/* ---- the arena and errors --------------------------------------------------------- */

typedef struct jinja_ctx jinja_ctx;
typedef struct jinja_chunk jinja_chunk;
typedef struct jinja_scope jinja_scope;

/* One render: its bounds, arena, error, output and scopes. */
struct jinja_ctx {
    jinja_limits lim;
    jinja_chunk *chunks;
    size_t used;        /* arena bytes taken */
    moec_status status; /* of the first error */
    long long steps;
    int calls;          /* macro calls in progress */
    int depth;          /* expressions and statements being evaluated, nested */
    int loop_ctl;       /* a break (1) or continue (2) on its way to its loop */
    moec_buf *out;      /* where text goes now (the result, or a captured block) */
    jinja_scope *scope; /* the innermost scope */
    jinja_scope *root;  /* the template's */
};

/* n bytes (16-aligned, zeroed) from the render's arena; NULL (the error
 * recorded) when memory or the bound runs out. */
void *jinja_alloc(jinja_ctx *c, size_t n);
/* A copy of arena array p's first n items of elem bytes in a new arena
 * array of cap items (growing arrays double it); NULL when it cannot be
 * allocated (the error recorded). */
void *jinja_grow(jinja_ctx *c, const void *p, size_t n, size_t cap, size_t elem);
/* Frees every chunk of the arena. */
void jinja_arena_free(jinja_ctx *c);
/* Records "chat template line L: message" as the error, status st; -1. */
int jinja_fail(jinja_ctx *c, const char *file, int cline, int line, moec_status st,
               const char *fmt, ...) __attribute__((format(printf, 6, 7)));
#define JFAIL(c, line, st, ...) jinja_fail((c), __FILE__, __LINE__, (line), (st), __VA_ARGS__)

/* ---- values ----------------------------------------------------------------------- */

typedef struct jinja_str {
    const char *p;
    size_t n;
} jinja_str;

typedef enum jinja_kind {
    JV_UNDEF,  /* jinja2's Undefined: u.s says why ("'x' is undefined") */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,   /* also a tuple (tuple set) */
    JV_DICT,   /* insertion-ordered, as Python's */
    JV_NS,     /* namespace(): a dict whose attributes `set` may assign */
    JV_LOOP,   /* a for loop's `loop` */
    JV_FUNC,   /* a global function (id) */
    JV_MACRO,  /* u.macro */
    JV_METHOD, /* a method (id) bound to u.self */
} jinja_kind;

typedef struct jinja_value {
    uint8_t kind;
    uint8_t tuple; /* JV_LIST: a tuple; JV_STR: a Markup (what |safe makes) */
    uint16_t id;
    union {
        int b;
        int64_t i;
        double f;
        jinja_str s;
        struct jinja_list *l;
        struct jinja_dict *d;
        struct jinja_loop *loop;
        const struct jinja_node *macro;
        struct jinja_value *self;
    } u;
} jinja_value;

typedef struct jinja_list {
    size_t n;
    jinja_value *v;
} jinja_list;

typedef struct jinja_dict {
    size_t n, cap;
    jinja_value *k, *v;
} jinja_dict;

typedef struct jinja_loop {
    const jinja_list *items;
    size_t i;
} jinja_loop;

static inline jinja_value jinja_none(void) { return (jinja_value){.kind = JV_NONE}; }
static inline jinja_value jinja_bool(int b) { return (jinja_value){.kind = JV_BOOL, .u.b = !!b}; }
static inline jinja_value jinja_int(int64_t i) { return (jinja_value){.kind = JV_INT, .u.i = i}; }
static inline jinja_value jinja_float(double f) { return (jinja_value){.kind = JV_FLOAT, .u.f = f}; }
static inline jinja_value jinja_str_value(const char *p, size_t n)
{
    return (jinja_value){.kind = JV_STR, .u.s = {p, n}};
}

/* An Undefined that says why (printf-style, into the arena); its kind
 * is JV_UNDEF even when the message cannot be allocated. */
jinja_value jinja_undefined(jinja_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Fails with an Undefined's message (used where jinja2 raises). */
int jinja_fail_undefined(jinja_ctx *c, int line, const jinja_value *v);

/* A copy of p[0..n) in the arena (n bytes may exceed no bound: checked). */
int jinja_new_str(jinja_ctx *c, int line, const char *p, size_t n, jinja_value *out);
/* A list of n items (zeroed: Undefined) in the arena. */
int jinja_new_list(jinja_ctx *c, size_t n, jinja_value *out);
int jinja_new_dict(jinja_ctx *c, size_t cap, jinja_kind kind, jinja_value *out);
/* Sets key to val (replacing a present key, keeping its place); a zeroed
 * jinja_dict is an empty one. */
int jinja_dict_set(jinja_ctx *c, jinja_dict *d, jinja_value key, jinja_value val);
/* The value of a string key; NULL when absent. */
const jinja_value *jinja_dict_get(const jinja_dict *d, const char *key, size_t n);
/* The value of any key (Python ==); NULL when absent. */
const jinja_value *jinja_dict_find(const jinja_dict *d, const jinja_value *key);

/* Python's "int", "str", "dict", ... for messages ("'dict object' has ..."). */
const char *jinja_type_name(const jinja_value *v);
int jinja_truthy(const jinja_value *v);
/* Python ==: numbers by value, strings by bytes, lists item by item
 * (a list is never a tuple), dicts by keys and values. */
int jinja_equal(const jinja_value *a, const jinja_value *b);
/* Python <, <=, >, >= (op '<', JOP_LE, '>', JOP_GE) into *res; -1
 * (a type error, recorded) when the values do not order. */
int jinja_order(jinja_ctx *c, int line, int op, const jinja_value *a, const jinja_value *b, int *res);

/* Appends Python's str(v) (repr for the items of lists and dicts, floats
 * in their shortest round-trip form) to b; -1 (recorded) for a value
 * Python would print as an object address. */
int jinja_write_str(jinja_ctx *c, int line, moec_buf *b, const jinja_value *v);
int jinja_write_repr(jinja_ctx *c, int line, moec_buf *b, const jinja_value *v);
/* Python's json.dumps(v, ensure_ascii, indent (< 0: none), sort_keys),
 * what transformers' tojson filter is. */
int jinja_write_json(jinja_ctx *c, int line, moec_buf *b, const jinja_value *v, int ensure_ascii,
                     int indent, int sort_keys, int level);
/* str(v) as an arena string (strings themselves, no copy). */
int jinja_to_str(jinja_ctx *c, int line, const jinja_value *v, jinja_value *out);
/* Moves a buffer's text into an arena string and frees the buffer. */
int jinja_buf_to_str(jinja_ctx *c, int line, moec_buf *b, jinja_value *out);
/* Python's float repr ("0.1", "1e+16", "1.0", "inf") into buf (32 bytes). */
void jinja_float_repr(double f, char *buf);

/* The values a JSON tree stands for (objects become dicts, arrays lists). */
int jinja_from_json(jinja_ctx *c, const cJSON *j, jinja_value *out);

/* ---- UTF-8 text ---------------------------------------------------------------------- */

/* The code point at s[0..n) (n >= 1) and its length; an invalid byte is
 * one code point of its own (U+FFFD). */
int jinja_utf8_next(const char *s, size_t n, uint32_t *cp);
/* Appends code point cp as UTF-8. */
void jinja_utf8_put(moec_buf *b, uint32_t cp);
/* Code points in s[0..n). */
size_t jinja_utf8_count(const char *s, size_t n);
/* Python's str.isspace() for one code point. */
int jinja_is_space(uint32_t cp);

/* ---- the tree -------------------------------------------------------------------------- */

typedef enum jinja_node_kind {
    /* statements */
    JN_TEXT,         /* value: the text */
    JN_OUTPUT,       /* {{ a }} */
    JN_IF,           /* a: condition, body, orelse (an elif is an if in orelse) */
    JN_FOR,          /* a: target, b: iterable, c: filter or NULL, body, orelse */
    JN_SET,          /* a: target (NAME, TUPLE of NAMEs, NSREF), b: value */
    JN_SET_BLOCK,    /* a: target, b: filter chain or NULL, body */
    JN_FILTER_BLOCK, /* b: filter chain (its innermost a is NULL: the body), body */
    JN_MACRO,        /* name, names: parameters, args: their defaults (NULL none), body */
    JN_WITH,         /* names = args, body */
    JN_BREAK,
    JN_CONTINUE,
    /* expressions */
    JN_CONST,   /* value */
    JN_NAME,    /* name */
    JN_NSREF,   /* a.name as a set target: a is a NAME */
    JN_LIST,    /* args: items */
    JN_TUPLE,   /* args: items */
    JN_DICT,    /* args: keys, kwargs: values */
    JN_ATTR,    /* a.name */
    JN_ITEM,    /* a[b] */
    JN_SLICE,   /* a[b:c:d], each of b, c, d may be NULL */
    JN_CALL,    /* a(args, names = kwargs) */
    JN_FILTER,  /* a | name(args, names = kwargs) */
    JN_TEST,    /* a is [not] name(args): op 1 when negated */
    JN_UNARY,   /* op '-', '+' or '!' (not), a */
    JN_BINARY,  /* a op b: op '+', '-', '*', '/', '%', '~', JOP_FLOORDIV, JOP_POW */
    JN_AND,
    JN_OR,
    JN_COMPARE, /* a op b: JOP_EQ, JOP_NE, '<', JOP_LE, '>', JOP_GE, 'i' (in), 'n' (not in) */
    JN_COND,    /* b if a else c (c NULL: Undefined) */
} jinja_node_kind;

typedef struct jinja_nodes {
    struct jinja_node **v;
    size_t n;
} jinja_nodes;

typedef struct jinja_node {
    jinja_node_kind kind;
    int line;
    int op;
    jinja_str name;
    jinja_value value;
    struct jinja_node *a, *b, *c, *d;
    jinja_nodes args, kwargs; /* positional arguments / items; keyword values */
    jinja_str *names;         /* keyword names, macro parameters, with targets */
    jinja_nodes body, orelse;
} jinja_node;

/* ---- lexer (jinja_lex.c) ---------------------------------------------------------------- */

typedef enum jinja_tok_kind {
    JT_DATA,        /* text between tags, whitespace control applied */
    JT_VAR_BEGIN,   /* {{ */
    JT_VAR_END,     /* }} */
    JT_BLOCK_BEGIN, /* {% */
    JT_BLOCK_END,   /* %} */
    JT_NAME,
    JT_STRING, /* text: the literal's value, escapes decoded */
    JT_INT,
    JT_FLOAT,
    JT_OP,     /* op: the character of + - * / % ~ [ ] ( ) { } > < = . : | , ; or a JOP_ code */
    JT_EOF,
} jinja_tok_kind;

typedef struct jinja_tok {
    jinja_tok_kind kind;
    int line;
    int op; /* JT_OP: the operator's code (see jinja_lex.c) */
    jinja_str text;
    int64_t i;
    double f;
} jinja_tok;

typedef struct jinja_toks {
    jinja_tok *v;
    size_t n, cap;
} jinja_toks;

/* Operator codes of the two-character operators. */
enum { JOP_EQ = 256, JOP_NE, JOP_LE, JOP_GE, JOP_FLOORDIV, JOP_POW };

/* Tokenizes src as jinja2's lexer does with trim_blocks, lstrip_blocks
 * and keep_trailing_newline=False; comments are dropped, raw blocks
 * become data. The tokens end with JT_EOF. */
int jinja_lex(jinja_ctx *c, const char *src, size_t len, jinja_toks *out);

/* ---- parser (jinja_parse.c) --------------------------------------------------------------- */

/* The template's statements. */
int jinja_parse(jinja_ctx *c, const jinja_toks *toks, jinja_nodes *out);
/* 0 when moec has filter (test) `name`; else -1, the error recorded:
 * a Jinja built-in moec does not have, or no such filter (test). */
int jinja_filter_known(jinja_ctx *c, int line, const jinja_str *name);
int jinja_test_known(jinja_ctx *c, int line, const jinja_str *name);

/* ---- evaluation (jinja_eval.c) and built-ins (jinja_builtins.c) ---------------------------- */

/* Evaluates an expression node. */
int jinja_eval(jinja_ctx *c, const jinja_node *n, jinja_value *out);
/* Calls a callable value (a function, macro or bound method). */
int jinja_call(jinja_ctx *c, int line, const jinja_value *fn, const jinja_value *args, size_t n_args,
               const jinja_str *kw_names, const jinja_value *kw_vals, size_t n_kw, jinja_value *out);
/* The global function a name stands for (range, namespace, ...): 1 and
 * *out when there is one. */
int jinja_global(jinja_ctx *c, const jinja_str *name, jinja_value *out);
/* obj.name as jinja2's sandbox resolves it: a method, a dict's key, a
 * loop's attribute, or an Undefined saying why. */
int jinja_getattr(jinja_ctx *c, int line, const jinja_value *obj, const char *name, size_t n,
                  jinja_value *out);
/* obj[key]: an item (negative indices count from the end), or an attribute
 * when key is a string and there is no such item, or an Undefined. */
int jinja_getitem(jinja_ctx *c, int line, const jinja_value *obj, const jinja_value *key,
                  jinja_value *out);
/* Applies filter `name` to v. */
int jinja_filter(jinja_ctx *c, int line, const jinja_str *name, const jinja_value *v,
                 const jinja_value *args, size_t n_args, const jinja_str *kw_names,
                 const jinja_value *kw_vals, size_t n_kw, jinja_value *out);
/* Runs test `name` on v into *res. */
int jinja_test(jinja_ctx *c, int line, const jinja_str *name, const jinja_value *v,
               const jinja_value *args, size_t n_args, int *res);
/* The items a for loop (or a filter) iterates over v: a list's or
 * tuple's, a string's characters, a dict's keys; nothing for Undefined. */
int jinja_iterate(jinja_ctx *c, int line, const jinja_value *v, jinja_list **out);
/* Calls a global function or a bound method (jinja_builtins.c). */
int jinja_call_native(jinja_ctx *c, int line, const jinja_value *fn, const jinja_value *args, size_t n_args,
                      const jinja_str *kw_names, const jinja_value *kw_vals, size_t n_kw, jinja_value *out);
/* Markup's escape: & < > " ' as HTML entities, appended to b. */
void jinja_escape(moec_buf *b, const char *s, size_t n);
/* Counts one step against the bound. */
int jinja_step(jinja_ctx *c, int line);
/* The string a value is, or a type error naming what wants one. */
int jinja_want_str(jinja_ctx *c, int line, const jinja_value *v, const char *what, jinja_str *out);

#endif
