/* test_ir_rewrite.c — the rewriting primitives passes are built from: moving
 * ops, redirecting uses, counting uses, single users, dead-code elimination
 * (ops, then weights and inputs, never tokens/positions, ids renumbered),
 * fresh names and cloning through the text form. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "testlib.h"

static const char *const SRC =
    "module rw {\n"
    "  input %tokens : i32[T]\n"
    "  input %positions : i32[T]\n"
    "  input %extra : i32[T]\n"
    "  weight %emb : f32[16, 8] = \"emb\"\n"
    "  weight %w1 : f32[8, 8] = \"w1\"\n"
    "  weight %w2 : f32[8, 8] = \"w2\"\n"
    "  weight %unused : f32[4] = \"unused\"\n"
    "  weight %router : f32[4, 8] = \"router\"\n"
    "  %x : f32[T, 8] = embedding(%tokens, %emb)\n"
    "  %a : f32[T, 8] = linear(%x, %w1)\n"
    "  %dead1 : f32[T, 8] = linear(%x, %w2)\n"
    "  %dead2 : f32[T, 8] = silu(%dead1)\n"
    "  %b : f32[T, 8] = add(%a, %x)\n"
    "  %logits : f32[T, 4] = linear(%b, %router)\n"
    "  %ids : i32[T, 2], %wts : f32[T, 2] = moe_topk(%logits) {scoring = \"softmax\", top_k = 2}\n"
    "  %c : f32[T, 8] = mul(%b, %b)\n"
    "  output %c\n"
    "  output %wts\n"
    "}\n";

static ir_module *parse_or_die(const char *text)
{
    ir_module *m = NULL;
    if (ir_module_parse(text, "rw.mir", &m) != MOEC_OK) {
        fprintf(stderr, "parse failed: %s\n", moec_last_error());
        exit(2);
    }
    return m;
}

static ir_value *val(ir_module *m, const char *name)
{
    ir_value *v = ir_module_find_value(m, name);
    if (!v) {
        fprintf(stderr, "no value %%%s\n", name);
        exit(2);
    }
    return v;
}

static ir_op *def(ir_module *m, const char *name) { return val(m, name)->def; }

/* Ids are indices: what every pass and the verifier rely on. */
static int ids_are_indices(const ir_module *m)
{
    for (int i = 0; i < m->n_values; i++)
        if (m->values[i]->id != i)
            return 0;
    for (int i = 0; i < m->n_ops; i++)
        if (m->ops[i]->id != i)
            return 0;
    return 1;
}

/* The names of m's op results in execution order, first result each, joined by ' '. */
static const char *op_order(const ir_module *m)
{
    static char buf[1024];
    buf[0] = '\0';
    for (int i = 0; i < m->n_ops; i++) {
        if (i)
            strncat(buf, " ", sizeof buf - strlen(buf) - 1);
        strncat(buf, m->ops[i]->out[0]->name, sizeof buf - strlen(buf) - 1);
    }
    return buf;
}

static void test_uses(void)
{
    ir_module *m = parse_or_die(SRC);
    T_CHECK(ir_module_use_count(m, val(m, "x")) == 3);
    T_CHECK(ir_module_use_count(m, val(m, "b")) == 3); /* logits once, mul twice */
    T_CHECK(ir_module_use_count(m, val(m, "c")) == 1); /* the output */
    T_CHECK(ir_module_use_count(m, val(m, "wts")) == 1);
    T_CHECK(ir_module_use_count(m, val(m, "ids")) == 0);
    T_CHECK(ir_module_use_count(m, val(m, "dead2")) == 0);
    T_CHECK(ir_module_use_count(m, val(m, "unused")) == 0);
    T_CHECK(ir_module_use_count(m, val(m, "w1")) == 1);
    T_CHECK(ir_module_use_count(NULL, val(m, "w1")) == 0);
    T_CHECK(ir_module_use_count(m, NULL) == 0);

    T_CHECK(ir_module_single_user(m, val(m, "a")) == def(m, "b"));
    T_CHECK(ir_module_single_user(m, val(m, "dead1")) == def(m, "dead2"));
    T_CHECK(ir_module_single_user(m, val(m, "logits")) == def(m, "ids"));
    T_CHECK(ir_module_single_user(m, val(m, "x")) == NULL);     /* three users */
    T_CHECK(ir_module_single_user(m, val(m, "b")) == NULL);     /* two users */
    T_CHECK(ir_module_single_user(m, val(m, "c")) == NULL);     /* an output */
    T_CHECK(ir_module_single_user(m, val(m, "wts")) == NULL);   /* an output */
    T_CHECK(ir_module_single_user(m, val(m, "dead2")) == NULL); /* no user */
    ir_module_free(m);

    /* one op using a value twice is not a single use */
    m = parse_or_die("module t {\n  input %tokens : i32[T]\n  weight %e : f32[4, 2] = \"e\"\n"
                     "  %x : f32[T, 2] = embedding(%tokens, %e)\n  %y : f32[T, 2] = mul(%x, %x)\n"
                     "  output %y\n}\n");
    T_CHECK(ir_module_use_count(m, val(m, "x")) == 2);
    T_CHECK(ir_module_single_user(m, val(m, "x")) == NULL);
    ir_module_free(m);
}

static void test_move(void)
{
    ir_module *m = parse_or_die(SRC);
    ir_op *dead2 = def(m, "dead2");
    /* to the end, then back */
    T_OK(ir_module_move_op_before(m, def(m, "x"), NULL));
    T_CHECK(!strcmp(op_order(m), "a dead1 dead2 b logits ids c x"));
    T_CHECK(ids_are_indices(m));
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG,
          "%a: linear: operand %x is used before its definition");
    T_OK(ir_module_move_op_before(m, def(m, "x"), m->ops[0]));
    T_CHECK(!strcmp(op_order(m), "x a dead1 dead2 b logits ids c"));
    T_CHECK(ids_are_indices(m));
    T_OK(ir_module_verify(m));
    /* forwards (before a later op) and backwards (before an earlier one) */
    T_OK(ir_module_move_op_before(m, def(m, "dead1"), def(m, "c")));
    T_CHECK(!strcmp(op_order(m), "x a dead2 b logits ids dead1 c"));
    T_OK(ir_module_move_op_before(m, def(m, "dead1"), dead2));
    T_CHECK(!strcmp(op_order(m), "x a dead1 dead2 b logits ids c"));
    T_CHECK(dead2->id == 3 && def(m, "dead1")->id == 2);
    /* before the op that already follows it, and before itself: nothing moves */
    T_OK(ir_module_move_op_before(m, def(m, "a"), def(m, "dead1")));
    T_OK(ir_module_move_op_before(m, def(m, "a"), def(m, "a")));
    T_CHECK(!strcmp(op_order(m), "x a dead1 dead2 b logits ids c"));
    T_CHECK(ids_are_indices(m));
    T_OK(ir_module_verify(m));

    /* ops of another module are refused, naming them */
    ir_module *other = parse_or_die(SRC);
    T_ERR(ir_module_move_op_before(m, def(other, "a"), NULL), MOEC_ERR_INVALID_ARG,
          "move_op_before: %a: linear is not an op of module rw");
    T_ERR(ir_module_move_op_before(m, def(m, "a"), def(other, "c")), MOEC_ERR_INVALID_ARG,
          "move_op_before: anchor %c: mul (for %a: linear) is not an op of module rw");
    T_ERR(ir_module_move_op_before(NULL, def(m, "a"), NULL), MOEC_ERR_INVALID_ARG, "null module");
    T_CHECK(!strcmp(op_order(m), "x a dead1 dead2 b logits ids c"));
    ir_module_free(other);
    ir_module_free(m);
}

static void test_replace(void)
{
    ir_module *m = parse_or_die(SRC);
    /* a new op goes to the end; move it where it belongs, then redirect a's uses */
    ir_value *a = val(m, "a");
    ir_value *in[1] = {a};
    ir_value *s = ir_build(m, IR_OP_SILU, "a_act", in, 1);
    T_CHECK(s != NULL);
    T_CHECK(m->ops[m->n_ops - 1] == s->def);
    T_OK(ir_module_move_op_before(m, s->def, def(m, "b")));
    ir_module_replace_uses(m, a, s);
    /* a_act itself still reads a: an op never gets its own result */
    T_CHECK(s->def->in[0] == a);
    T_CHECK(def(m, "b")->in[0] == s);
    T_CHECK(ir_module_use_count(m, a) == 1);
    T_CHECK(ir_module_single_user(m, a) == s->def);
    T_OK(ir_module_verify(m));
    char *text = ir_module_print_str(m);
    T_CHECK(text && strstr(text, "  %a : f32[T, 8] = linear(%x, %w1)\n"
                                 "  %dead1 : f32[T, 8] = linear(%x, %w2)\n"
                                 "  %dead2 : f32[T, 8] = silu(%dead1)\n"
                                 "  %a_act : f32[T, 8] = silu(%a)\n"
                                 "  %b : f32[T, 8] = add(%a_act, %x)\n"));
    free(text);

    /* every slot, outputs included */
    ir_value *b = val(m, "b"), *x = val(m, "x");
    ir_module_replace_uses(m, b, x);
    T_CHECK(ir_module_use_count(m, b) == 0);
    T_CHECK(ir_module_use_count(m, x) == 6);
    T_CHECK(def(m, "c")->in[0] == x && def(m, "c")->in[1] == x);
    ir_module_replace_uses(m, val(m, "c"), x);
    T_CHECK(m->outputs[0] == x && m->outputs[1] == val(m, "wts"));
    T_OK(ir_module_verify(m));
    /* from == to, NULLs: nothing happens */
    ir_module_replace_uses(m, x, x);
    ir_module_replace_uses(m, NULL, x);
    ir_module_replace_uses(m, x, NULL);
    ir_module_replace_uses(NULL, x, b);
    T_CHECK(ir_module_use_count(m, x) == 7);
    T_OK(ir_module_verify(m));
    ir_module_free(m);
}

static const char *const AFTER_DCE =
    "module rw {\n"
    "  input %tokens : i32[T]\n"
    "  input %positions : i32[T]\n"
    "  weight %emb : f32[16, 8] = \"emb\"\n"
    "  weight %w1 : f32[8, 8] = \"w1\"\n"
    "  weight %router : f32[4, 8] = \"router\"\n"
    "  %x : f32[T, 8] = embedding(%tokens, %emb)\n"
    "  %a : f32[T, 8] = linear(%x, %w1)\n"
    "  %b : f32[T, 8] = add(%a, %x)\n"
    "  %logits : f32[T, 4] = linear(%b, %router)\n"
    "  %ids : i32[T, 2], %wts : f32[T, 2] = moe_topk(%logits) {scoring = \"softmax\", top_k = 2}\n"
    "  %c : f32[T, 8] = mul(%b, %b)\n"
    "  output %c\n"
    "  output %wts\n"
    "}\n";

static void test_dce(void)
{
    ir_module *m = parse_or_die(SRC);
    int n_values = m->n_values;
    T_OK(ir_module_dce(m));
    /* the dead chain, the weights only it used, the unused weight and input;
     * positions stays though nothing uses it; moe_topk stays for wts */
    T_CHECK(m->n_ops == 6);
    T_CHECK(m->n_values == n_values - 5);
    T_CHECK(m->n_inputs == 2 && !strcmp(m->inputs[0]->name, "tokens") &&
            !strcmp(m->inputs[1]->name, "positions"));
    T_CHECK(ids_are_indices(m));
    T_CHECK(ir_module_find_value(m, "dead1") == NULL && ir_module_find_value(m, "dead2") == NULL);
    T_CHECK(ir_module_find_value(m, "w2") == NULL && ir_module_find_value(m, "unused") == NULL);
    T_CHECK(ir_module_find_value(m, "extra") == NULL);
    T_CHECK(ir_module_find_value(m, "ids") != NULL);
    T_OK(ir_module_verify(m));
    char *text = ir_module_print_str(m);
    T_CHECK(text && !strcmp(text, AFTER_DCE));
    if (text && strcmp(text, AFTER_DCE))
        fprintf(stderr, "after dce:\n%s", text);
    free(text);
    /* nothing left to remove: a second run changes nothing */
    T_OK(ir_module_dce(m));
    text = ir_module_print_str(m);
    T_CHECK(text && !strcmp(text, AFTER_DCE));
    free(text);
    ir_module_free(m);

    /* ops left out of order mid-rewrite (the user of dead1 before it) */
    m = parse_or_die(SRC);
    T_OK(ir_module_move_op_before(m, def(m, "dead1"), NULL));
    T_OK(ir_module_dce(m));
    text = ir_module_print_str(m);
    T_CHECK(text && !strcmp(text, AFTER_DCE));
    free(text);
    T_CHECK(ids_are_indices(m));
    ir_module_free(m);

    /* an output replaced: what only fed the old output dies with it */
    m = parse_or_die(SRC);
    ir_module_replace_uses(m, val(m, "c"), val(m, "a"));
    T_OK(ir_module_dce(m));
    T_OK(ir_module_verify(m));
    T_CHECK(!strcmp(op_order(m), "x a b logits ids"));
    T_CHECK(ir_module_find_value(m, "c") == NULL);
    T_CHECK(ids_are_indices(m));
    ir_module_free(m);

    /* a value of another module is refused before anything changes */
    m = parse_or_die(SRC);
    ir_module *other = parse_or_die(SRC);
    def(m, "c")->in[1] = val(other, "b");
    T_ERR(ir_module_dce(m), MOEC_ERR_INVALID_ARG, "dce: %c: mul: operand 1 is not a value of module rw");
    T_CHECK(m->n_ops == 8);
    ir_module_free(other);
    ir_module_free(m);
    T_ERR(ir_module_dce(NULL), MOEC_ERR_INVALID_ARG, "dce: null module");
}

static void test_unique_name(void)
{
    ir_module *m = parse_or_die(SRC);
    const char *n = ir_module_unique_name(m, "fresh");
    T_CHECK(n && !strcmp(n, "fresh"));
    n = ir_module_unique_name(m, "x");
    T_CHECK(n && !strcmp(n, "x.1"));
    ir_value *in[1] = {val(m, "x")};
    T_CHECK(ir_build(m, IR_OP_SILU, n, in, 1) != NULL);
    n = ir_module_unique_name(m, "x");
    T_CHECK(n && !strcmp(n, "x.2"));
    n = ir_module_unique_name(m, "x.1");
    T_CHECK(n && !strcmp(n, "x.1.1"));
    T_CHECK(ir_module_unique_name(m, "a b") == NULL);
    T_CHECK(strstr(moec_last_error(), "unique_name: base 'a b' must match [A-Za-z0-9_.]+") != NULL);
    T_CHECK(ir_module_unique_name(m, NULL) == NULL);
    ir_module_free(m);
}

/* The name index behind ir_module_find_value: it follows appended values
 * (past several regrowths), renames and removals. */
static void test_name_index(void)
{
    ir_module *m = parse_or_die(SRC);
    ir_value *b = val(m, "b");
    ir_value_rename(m, b, "b_renamed");
    T_CHECK(ir_module_find_value(m, "b") == NULL);
    T_CHECK(ir_module_find_value(m, "b_renamed") == b);
    T_CHECK(ir_module_find_value(m, "%b_renamed") == b);
    T_OK(ir_module_verify(m));
    /* a chain of 3000 fresh values, each found at once and at the end */
    ir_value *prev = val(m, "x");
    char name[32];
    for (int i = 0; i < 3000; i++) {
        snprintf(name, sizeof name, "chain%d", i);
        ir_value *in[1] = {prev};
        ir_value *v = ir_build(m, IR_OP_SILU, name, in, 1);
        T_CHECK(v != NULL);
        if (!v)
            break;
        T_CHECK(ir_module_find_value(m, name) == v);
        prev = v;
    }
    int found = 0;
    for (int i = 0; i < 3000; i++) {
        snprintf(name, sizeof name, "chain%d", i);
        ir_value *v = ir_module_find_value(m, name);
        found += v && !strcmp(v->name, name);
    }
    T_CHECK(found == 3000);
    /* a duplicate is refused through the index */
    ir_value *in[1] = {prev};
    T_CHECK(ir_build(m, IR_OP_SILU, "chain17", in, 1) == NULL);
    T_CHECK(strstr(moec_last_error(), "duplicate value %chain17") != NULL);
    /* nothing uses the chain: dce drops it, and the index with it */
    T_OK(ir_module_dce(m));
    T_CHECK(ir_module_find_value(m, "chain0") == NULL);
    T_CHECK(ir_module_find_value(m, "chain2999") == NULL);
    T_CHECK(ir_module_find_value(m, "dead1") == NULL);
    T_CHECK(ir_module_find_value(m, "b_renamed") == b);
    T_CHECK(ir_module_find_value(m, "c") != NULL);
    /* a name freed by dce can be taken again */
    in[0] = val(m, "x");
    T_CHECK(ir_build(m, IR_OP_SILU, "dead1", in, 1) != NULL);
    T_CHECK(ir_module_find_value(m, "dead1") != NULL);
    ir_module_free(m);
}

static void test_clone(void)
{
    ir_module *m = parse_or_die(SRC);
    val(m, "b")->mem_offset = 32;
    val(m, "tokens")->mem_offset = 0;
    def(m, "dead1")->stream = 1;
    ir_module *c = NULL;
    T_OK(ir_module_clone(m, &c));
    T_CHECK(c != NULL && c != m);
    if (!c) {
        ir_module_free(m);
        return;
    }
    char *a = ir_module_print_str(m), *b = ir_module_print_str(c);
    T_CHECK(a && b && !strcmp(a, b));
    T_CHECK(a && strstr(a, "  %b : f32[T, 8] @32*T = add(%a, %x)\n"));
    T_CHECK(a && strstr(a, "  %dead1 : f32[T, 8] = linear(%x, %w2) stream 1\n"));
    T_CHECK(val(c, "b")->mem_offset == 32 && def(c, "dead1")->stream == 1);
    /* deep: changing the copy leaves the original alone */
    T_CHECK(val(c, "b") != val(m, "b"));
    T_OK(ir_module_dce(c));
    T_CHECK(c->n_ops == 6 && m->n_ops == 8);
    char *a2 = ir_module_print_str(m);
    T_CHECK(a && a2 && !strcmp(a, a2));
    free(a);
    free(b);
    free(a2);
    ir_module_free(c);

    /* an invalid module does not clone */
    T_OK(ir_module_move_op_before(m, def(m, "x"), NULL));
    c = (ir_module *)m;
    T_ERR(ir_module_clone(m, &c), MOEC_ERR_FORMAT, "<clone of module rw>");
    T_CHECK(c == NULL);
    T_ERR(ir_module_clone(NULL, &c), MOEC_ERR_INVALID_ARG, "clone: null module");
    T_ERR(ir_module_clone(m, NULL), MOEC_ERR_INVALID_ARG, "clone: null output");
    ir_module_free(m);
}

int main(void)
{
    test_uses();
    test_move();
    test_replace();
    test_dce();
    test_unique_name();
    test_name_index();
    test_clone();
    return t_finish("test_ir_rewrite");
}
