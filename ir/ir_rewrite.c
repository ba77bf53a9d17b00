/* ir_rewrite.c — the few primitives passes rewrite a module with: move an op,
 * redirect the uses of a value, count uses, drop what became dead, make a
 * fresh name, copy a module. Plain linear scans: modules have thousands of
 * ops, passes call these a few times per layer, and simple is what keeps
 * them obviously correct. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "ir/ir_internal.h"

static int op_in_module(const ir_module *m, const ir_op *op)
{
    return op && op->id >= 0 && op->id < m->n_ops && m->ops[op->id] == op;
}

static void renumber_ops(ir_module *m)
{
    for (int i = 0; i < m->n_ops; i++)
        m->ops[i]->id = i;
}

moec_status ir_module_move_op_before(ir_module *m, ir_op *op, const ir_op *anchor)
{
    if (!m)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "move_op_before: null module");
    char label[256];
    ir_op_label(op, label, sizeof label);
    if (!op_in_module(m, op))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "move_op_before: %s is not an op of module %s",
                        label, m->name);
    if (anchor && !op_in_module(m, anchor)) {
        char alabel[256];
        ir_op_label(anchor, alabel, sizeof alabel);
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "move_op_before: anchor %s (for %s) is not an op of module %s", alabel,
                        label, m->name);
    }
    if (anchor == op)
        return MOEC_OK;
    int from = op->id;
    memmove(&m->ops[from], &m->ops[from + 1], sizeof m->ops[0] * (size_t)(m->n_ops - from - 1));
    int to = m->n_ops - 1;
    if (anchor)
        to = anchor->id > from ? anchor->id - 1 : anchor->id;
    memmove(&m->ops[to + 1], &m->ops[to], sizeof m->ops[0] * (size_t)(m->n_ops - 1 - to));
    m->ops[to] = op;
    renumber_ops(m);
    return MOEC_OK;
}

/* The op that defines `to` is left alone: an op cannot use its own result,
 * and skipping it lets a pass write `y = fork(x)` then send x's other uses
 * to y. */
void ir_module_replace_uses(ir_module *m, const ir_value *from, ir_value *to)
{
    if (!m || !from || !to || from == to)
        return;
    const ir_op *skip = to->kind == IR_VALUE_OP ? to->def : NULL;
    for (int i = 0; i < m->n_ops; i++) {
        ir_op *op = m->ops[i];
        if (op == skip)
            continue;
        for (int j = 0; j < op->n_in; j++)
            if (op->in[j] == from)
                op->in[j] = to;
    }
    for (int i = 0; i < m->n_outputs; i++)
        if (m->outputs[i] == from)
            m->outputs[i] = to;
}

static int output_uses(const ir_module *m, const ir_value *v)
{
    int n = 0;
    for (int i = 0; i < m->n_outputs; i++)
        n += m->outputs[i] == v;
    return n;
}

int ir_module_use_count(const ir_module *m, const ir_value *v)
{
    if (!m || !v)
        return 0;
    int n = output_uses(m, v);
    for (int i = 0; i < m->n_ops; i++)
        for (int j = 0; j < m->ops[i]->n_in; j++)
            n += m->ops[i]->in[j] == v;
    return n;
}

ir_op *ir_module_single_user(const ir_module *m, const ir_value *v)
{
    if (!m || !v || output_uses(m, v))
        return NULL;
    ir_op *user = NULL;
    for (int i = 0; i < m->n_ops; i++) {
        for (int j = 0; j < m->ops[i]->n_in; j++) {
            if (m->ops[i]->in[j] != v)
                continue;
            if (user)
                return NULL;
            user = m->ops[i];
        }
    }
    return user;
}

static int keeps_input(const ir_value *v)
{
    return !strcmp(v->name, "tokens") || !strcmp(v->name, "positions");
}

static int value_in_module(const ir_module *m, const ir_value *v)
{
    return v && v->id >= 0 && v->id < m->n_values && m->values[v->id] == v;
}

/* What dce relies on before it indexes by id: every reference is into m. */
static moec_status dce_check(const ir_module *m)
{
    for (int i = 0; i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        if (!v || v->id != i)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "dce: value #%d has id %d", i, v ? v->id : -1);
        if (v->kind == IR_VALUE_OP && !op_in_module(m, v->def))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "dce: %%%s: its defining op is not in module %s",
                            v->name, m->name);
    }
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *op = m->ops[i];
        char label[256];
        ir_op_label(op, label, sizeof label);
        if (!op || op->id != i)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "dce: %s has id %d at index %d", label,
                            op ? op->id : -1, i);
        if (op->n_in < 0 || op->n_in > IR_MAX_OPERANDS || op->n_out < 0 ||
            op->n_out > IR_MAX_RESULTS)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "dce: %s has %d operands and %d results",
                            label, op->n_in, op->n_out);
        for (int j = 0; j < op->n_in; j++)
            if (!value_in_module(m, op->in[j]))
                return MOEC_ERR(MOEC_ERR_INVALID_ARG, "dce: %s: operand %d is not a value of "
                                "module %s", label, j, m->name);
        for (int k = 0; k < op->n_out; k++)
            if (!value_in_module(m, op->out[k]))
                return MOEC_ERR(MOEC_ERR_INVALID_ARG, "dce: %s: result %d is not a value of "
                                "module %s", label, k, m->name);
    }
    for (int i = 0; i < m->n_outputs; i++)
        if (!value_in_module(m, m->outputs[i]))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "dce: output #%d is not a value of module %s",
                            i, m->name);
    for (int i = 0; i < m->n_inputs; i++)
        if (!value_in_module(m, m->inputs[i]))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "dce: input #%d is not a value of module %s",
                            i, m->name);
    return MOEC_OK;
}

moec_status ir_module_dce(ir_module *m)
{
    if (!m)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "dce: null module");
    MOEC_TRY(dce_check(m));
    int *uses = calloc((size_t)m->n_values + 1, sizeof *uses);
    unsigned char *dead = calloc((size_t)m->n_ops + 1, 1);
    unsigned char *keep = calloc((size_t)m->n_values + 1, 1);
    if (!uses || !dead || !keep) {
        free(uses);
        free(dead);
        free(keep);
        return MOEC_ERR(MOEC_ERR_OOM, "dce of module %s: out of memory", m->name);
    }
    for (int i = 0; i < m->n_outputs; i++)
        uses[m->outputs[i]->id]++;
    for (int i = 0; i < m->n_ops; i++)
        for (int j = 0; j < m->ops[i]->n_in; j++)
            uses[m->ops[i]->in[j]->id]++;
    /* Backwards, and again until nothing changes, so that ops left out of
     * order mid-rewrite still come out right. */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = m->n_ops - 1; i >= 0; i--) {
            const ir_op *op = m->ops[i];
            int used = 0;
            for (int k = 0; k < op->n_out; k++)
                used |= uses[op->out[k]->id] > 0;
            if (dead[i] || used)
                continue;
            dead[i] = 1;
            changed = 1;
            for (int j = 0; j < op->n_in; j++)
                uses[op->in[j]->id]--;
        }
    }
    for (int i = 0; i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        if (v->kind == IR_VALUE_OP)
            keep[i] = !dead[v->def->id];
        else
            keep[i] = uses[i] > 0 || (v->kind == IR_VALUE_INPUT && keeps_input(v));
    }
    int n_inputs = 0;
    for (int i = 0; i < m->n_inputs; i++)
        if (keep[m->inputs[i]->id])
            m->inputs[n_inputs++] = m->inputs[i];
    m->n_inputs = n_inputs;
    int n = 0;
    for (int i = 0; i < m->n_ops; i++)
        if (!dead[i])
            m->ops[n++] = m->ops[i];
    m->n_ops = n;
    renumber_ops(m);
    n = 0;
    for (int i = 0; i < m->n_values; i++)
        if (keep[i])
            m->values[n++] = m->values[i];
    m->n_values = n;
    ir_module_values_changed(m);
    for (int i = 0; i < m->n_values; i++)
        m->values[i]->id = i;
    free(uses);
    free(dead);
    free(keep);
    return MOEC_OK;
}

const char *ir_module_unique_name(ir_module *m, const char *base)
{
    if (!m || !ir_value_name_valid(base)) {
        MOEC_ERR(MOEC_ERR_INVALID_ARG, "unique_name: base '%s' must match [A-Za-z0-9_.]+",
                 base ? base : "(null)");
        return NULL;
    }
    if (!ir_module_find_value(m, base)) {
        char *s = ir_arena_strdup(m->arena, base);
        if (!s)
            MOEC_ERR(MOEC_ERR_OOM, "unique_name %%%s: out of memory", base);
        return s;
    }
    size_t cap = strlen(base) + 24;
    char *buf = ir_arena_alloc(m->arena, cap);
    if (!buf) {
        MOEC_ERR(MOEC_ERR_OOM, "unique_name %%%s: out of memory", base);
        return NULL;
    }
    for (long n = 1;; n++) {
        snprintf(buf, cap, "%s.%ld", base, n);
        if (!ir_module_find_value(m, buf))
            return buf;
    }
}

moec_status ir_module_clone(const ir_module *m, ir_module **out)
{
    if (!out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "clone: null output");
    *out = NULL;
    if (!m)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "clone: null module");
    char *text = ir_module_print_str(m);
    if (!text)
        return MOEC_ERR_OOM;
    char file[160];
    snprintf(file, sizeof file, "<clone of module %s>", m->name ? m->name : "?");
    moec_status st = ir_module_parse(text, file, out);
    free(text);
    return st;
}

int ir_side_stream_fp8(const ir_module *m)
{
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        if (op->stream != 1)
            continue;
        for (int i = 0; i < op->n_in; i++)
            if (op->in[i]->kind == IR_VALUE_WEIGHT && op->in[i]->type.dtype == IR_DTYPE_F8E4M3)
                return 1;
    }
    return 0;
}

int ir_dual_stream_from_t(const ir_module *m)
{
    for (int k = 0; k < m->n_ops; k++)
        if (m->ops[k]->stream == 1)
            return IR_DUAL_STREAM_FROM_T;
    return 0;
}
