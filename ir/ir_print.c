/* ir_print.c — the IR's text form (docs/IR.md, "Text form"): one
 * declaration or op per line, floats in the shortest form that reads back
 * to the same double, so that print(parse(print(m))) == print(m). Printing
 * never needs a valid module: dumps of a broken pass must still come out. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/strbuf.h"
#include "ir/ir_internal.h"

/* Shortest %.Ng that reads back bit for bit; ".0" appended when the text
 * would otherwise read as an int. An integral value prints as "40.0" rather
 * than "4e+01" where that is no longer. */
static void format_double(double v, char *buf, size_t cap)
{
    if (isnan(v)) {
        snprintf(buf, cap, "%s", signbit(v) ? "-nan" : "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, cap, "%s", v < 0 ? "-inf" : "inf");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        double back = strtod(buf, NULL);
        if (!memcmp(&back, &v, sizeof v))
            break;
    }
    if (!strpbrk(buf, ".eni")) {
        size_t n = strlen(buf);
        if (n + 3 <= cap)
            memcpy(buf + n, ".0", 3);
    }
    if (strchr(buf, 'e') && fabs(v) < 1e15 && v == floor(v)) {
        char plain[32];
        snprintf(plain, sizeof plain, "%.0f.0", v);
        if (strlen(plain) <= strlen(buf) && strlen(plain) < cap)
            memcpy(buf, plain, strlen(plain) + 1);
    }
}

static void sb_quoted(moec_buf *b, const char *s)
{
    moec_buf_put(b, "\"", 1);
    if (!s)
        s = "";
    const char *run = s;
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') {
            moec_buf_put(b, run, (size_t)(s - run));
            moec_buf_put(b, "\\", 1);
            run = s;
        }
    }
    moec_buf_put(b, run, (size_t)(s - run));
    moec_buf_put(b, "\"", 1);
}

static void sb_attr_value(moec_buf *b, const ir_attr *a)
{
    char num[64];
    switch (a->kind) {
    case IR_ATTR_INT: moec_buf_printf(b, "%" PRId64, a->i); return;
    case IR_ATTR_FLOAT:
        format_double(a->f, num, sizeof num);
        moec_buf_str(b, num);
        return;
    case IR_ATTR_STR: sb_quoted(b, a->s); return;
    case IR_ATTR_INTS:
        moec_buf_put(b, "[", 1);
        for (int i = 0; i < a->n && a->ints; i++)
            moec_buf_printf(b, "%s%" PRId64, i ? ", " : "", a->ints[i]);
        moec_buf_put(b, "]", 1);
        return;
    }
    moec_buf_str(b, "?");
}

static const char *vn(const ir_value *v) { return v && v->name ? v->name : "?"; }

static void sb_type(moec_buf *b, const ir_type *t)
{
    char ts[96];
    ir_type_format(t, ts, sizeof ts);
    moec_buf_str(b, ts);
}

/* " @256*T": an activation's planned arena offset per token, when it has one. */
static void sb_offset(moec_buf *b, const ir_value *v)
{
    if (v->mem_offset >= 0)
        moec_buf_printf(b, " @%" PRId64 "*T", v->mem_offset);
}

static void sb_binding_leaf(moec_buf *b, const ir_binding *bind)
{
    if (bind->kind == IR_BIND_STACK) {
        moec_buf_str(b, "stack(");
        sb_quoted(b, bind->name);
        moec_buf_printf(b, ", %d)", bind->count);
    } else {
        sb_quoted(b, bind->name);
    }
    if (bind->box_rank) {
        char box[IR_MAX_RANK * 48]; /* the box: [4:8, :, 0:16] */
        ir_binding_box_format(bind, 0, box, sizeof box);
        moec_buf_str(b, box);
    }
}

static void sb_binding(moec_buf *b, const ir_binding *bind)
{
    if (bind->kind != IR_BIND_CONCAT) {
        sb_binding_leaf(b, bind);
        return;
    }
    moec_buf_printf(b, "concat(%d", bind->axis);
    for (int i = 0; i < bind->n_parts && bind->parts; i++) {
        moec_buf_str(b, ", ");
        sb_binding_leaf(b, &bind->parts[i]);
    }
    moec_buf_str(b, ")");
}

/* ", block_scale[128, 128] = <binding>" after a block-scaled weight's binding
 * (", block_scale[64, 128] from [128, 128] = ..." where refined). */
static void sb_block_scale(moec_buf *b, const ir_block_scale *s)
{
    if (s->block[0] == 0 && s->block[1] == 0)
        return;
    moec_buf_printf(b, ", block_scale[%" PRId64 ", %" PRId64 "]", s->block[0], s->block[1]);
    if (s->stored[0] || s->stored[1])
        moec_buf_printf(b, " from [%" PRId64 ", %" PRId64 "]", ir_block_scale_stored(s, 0),
                        ir_block_scale_stored(s, 1));
    moec_buf_str(b, " = ");
    sb_binding(b, &s->bind);
}

static void sb_op(moec_buf *b, const ir_op *op)
{
    moec_buf_str(b, "  ");
    if (!op) {
        moec_buf_str(b, "# null op\n");
        return;
    }
    int n_out = op->n_out < 0 ? 0 : op->n_out > IR_MAX_RESULTS ? IR_MAX_RESULTS : op->n_out;
    for (int i = 0; i < n_out; i++) {
        moec_buf_printf(b, "%s%%", i ? ", " : "");
        moec_buf_str(b, vn(op->out[i]));
        moec_buf_str(b, " : ");
        if (op->out[i]) {
            sb_type(b, &op->out[i]->type);
            sb_offset(b, op->out[i]);
        }
    }
    moec_buf_printf(b, " = %s(", ir_op_name(op->kind));
    int n_in = op->n_in < 0 ? 0 : op->n_in > IR_MAX_OPERANDS ? IR_MAX_OPERANDS : op->n_in;
    for (int i = 0; i < n_in; i++) {
        moec_buf_str(b, i ? ", %" : "%");
        moec_buf_str(b, vn(op->in[i]));
    }
    moec_buf_str(b, ")");
    int n_attr = op->n_attr < 0 ? 0 : op->n_attr > IR_MAX_ATTRS ? IR_MAX_ATTRS : op->n_attr;
    for (int i = 0; i < n_attr; i++) {
        moec_buf_str(b, i ? ", " : " {");
        moec_buf_str(b, op->attrs[i].key ? op->attrs[i].key : "?");
        moec_buf_str(b, " = ");
        sb_attr_value(b, &op->attrs[i]);
    }
    if (n_attr)
        moec_buf_str(b, "}");
    if (op->stream != 0)
        moec_buf_printf(b, " stream %d", op->stream);
    moec_buf_str(b, "\n");
}

static void print_module(moec_buf *b, const ir_module *m)
{
    moec_buf_printf(b, "module ");
    moec_buf_str(b, m->name ? m->name : "?");
    moec_buf_str(b, " {\n");
    for (int i = 0; i < m->n_meta && m->meta; i++) {
        moec_buf_str(b, "  meta ");
        moec_buf_str(b, m->meta[i].key ? m->meta[i].key : "?");
        moec_buf_str(b, " = ");
        sb_attr_value(b, &m->meta[i]);
        moec_buf_str(b, "\n");
    }
    int n_inputs = m->n_inputs < 0 ? 0 : m->n_inputs > 8 ? 8 : m->n_inputs;
    for (int i = 0; i < n_inputs; i++) {
        moec_buf_str(b, "  input %");
        moec_buf_str(b, vn(m->inputs[i]));
        moec_buf_str(b, " : ");
        if (m->inputs[i]) {
            sb_type(b, &m->inputs[i]->type);
            sb_offset(b, m->inputs[i]);
        }
        moec_buf_str(b, "\n");
    }
    for (int i = 0; i < m->n_values && m->values; i++) {
        const ir_value *v = m->values[i];
        if (!v || v->kind != IR_VALUE_WEIGHT)
            continue;
        moec_buf_str(b, "  weight %");
        moec_buf_str(b, vn(v));
        moec_buf_str(b, " : ");
        sb_type(b, &v->type);
        moec_buf_str(b, " = ");
        sb_binding(b, &v->bind);
        sb_block_scale(b, &v->scale);
        moec_buf_str(b, "\n");
    }
    for (int i = 0; i < m->n_ops && m->ops; i++)
        sb_op(b, m->ops[i]);
    int n_outputs = m->n_outputs < 0 ? 0 : m->n_outputs > 8 ? 8 : m->n_outputs;
    for (int i = 0; i < n_outputs; i++) {
        moec_buf_str(b, "  output %");
        moec_buf_str(b, vn(m->outputs[i]));
        moec_buf_str(b, "\n");
    }
    moec_buf_str(b, "}\n");
}

char *ir_module_print_str(const ir_module *m)
{
    if (!m) {
        MOEC_ERR(MOEC_ERR_INVALID_ARG, "print: null module");
        return NULL;
    }
    moec_buf b = {0};
    print_module(&b, m);
    if (b.oom) {
        free(b.data);
        MOEC_ERR(MOEC_ERR_OOM, "print: out of memory");
        return NULL;
    }
    return b.data;
}

moec_status ir_module_print(const ir_module *m, FILE *out)
{
    if (!out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "print: null stream");
    char *s = ir_module_print_str(m);
    if (!s)
        return m ? MOEC_ERR_OOM : MOEC_ERR_INVALID_ARG;
    size_t n = strlen(s);
    size_t w = fwrite(s, 1, n, out);
    free(s);
    if (w != n || fflush(out) != 0)
        return MOEC_ERR(MOEC_ERR_IO, "print: writing the IR failed");
    return MOEC_OK;
}
