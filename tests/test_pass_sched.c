/* test_pass_sched.c — absorb_mla, assign_streams and plan_memory.
 *
 * Each pass keeps the model's function (interpreter before vs after, on the
 * pipeline prefix and on the unfused frontend module). absorb_mla leaves no
 * plain attention in DeepSeek modules and records its decision, checked
 * against numbers computed here from the real DeepSeek-V2-Lite and V3
 * configs. assign_streams gives one fork/join pair per MoE layer with a
 * shared expert and, in DeepSeek-V3.2, one per layer for the indexer, and
 * a checker confirms the side stream reads only the fork, weights, its own
 * values and what was defined before the fork. plan_memory is checked by an independent
 * liveness checker, and for real by running the interpreter with every
 * activation in the planned arena — including a sabotaged plan, which must
 * disagree. Every reshape, fork and join result shares its operand's bytes
 * (an alias); an alias broken by an op writing into the shared buffer while
 * it is still to be read is refused by the checker and the verifier, and
 * the planned run disagrees. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "compiler/frontend.h"
#include "compiler/passes.h"
#include "passlib.h"
#include "runtime/interp.h"
#include "runtime/weights.h"
#include "testlib.h"

static const char *const DEEPSEEK[] = {"deepseek_v2", "deepseek_v2_qlora", "deepseek_v3"};
static const char *const ALL[] = {"deepseek_v2", "deepseek_v2_qlora", "deepseek_v3", "qwen2_moe",
                                  "qwen3_moe",   "qwen3_moe_fp8"};
/* MoE layers with a shared expert in each tiny model (ALL's order). */
static const int SHARED_LAYERS[] = {2, 2, 2, 2, 0, 0};

#define N_OF(a) ((int)(sizeof(a) / sizeof *(a)))

static ir_module *frontend_module(const char *model)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/%s", model);
    ir_module *m = NULL;
    T_OK(fe_model_load(t_src(rel), &m));
    return m;
}

/* The pass alone on the unfused frontend module keeps the function too. */
static void check_direct(const char *model, moec_status (*pass)(ir_module *, const pass_options *),
                         const char *what)
{
    ir_module *m = frontend_module(model), *before = NULL;
    if (!m)
        return;
    T_OK(ir_module_clone(m, &before));
    T_OK(pass(m, NULL));
    T_OK(ir_module_verify(m));
    if (before) {
        double err = t_modules_agree(model, before, m, 0xd1ec7);
        printf("%-20s %-18s unfused input: max row error %.3g\n", what, model, err);
        T_CHECK(err >= 0 && err <= 1e-5);
    }
    ir_module_free(before);
    ir_module_free(m);
}

/* ---- absorb_mla --------------------------------------------------------------- */

static void check_absorbed(const char *model, const ir_module *m)
{
    int layers = (int)ir_module_meta_int(m, "num_hidden_layers", -1);
    T_CHECK(t_count_ops(m, IR_OP_ATTENTION) == 0);
    T_CHECK(t_count_ops(m, IR_OP_MLA_ATTENTION) == layers);
    T_CHECK(t_count_ops(m, IR_OP_MLA_QABSORB) == layers);
    T_CHECK(t_count_ops(m, IR_OP_MLA_VABSORB) == layers);
    const ir_attr *a = ir_module_meta(m, "mla_absorb");
    const ir_attr *why = ir_module_meta(m, "mla_absorb_why");
    T_CHECK(a && a->kind == IR_ATTR_STR && !strcmp(a->s, "runtime"));
    T_CHECK(why && why->kind == IR_ATTR_STR && strstr(why->s, "weight elements per decode step"));
    /* The cache the attention keeps: kv_c [T, r] and k_pe [T, 1, dr] only;
     * tiny models: r = 32, dr = 8, H = 4. */
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *op = m->ops[i];
        if (op->kind != IR_OP_MLA_ATTENTION)
            continue;
        T_CHECK(op->in[2]->type.rank == 2 && op->in[2]->type.dims[1] == 32);
        T_CHECK(op->in[3]->type.rank == 3 && op->in[3]->type.dims[1] == 1 &&
                op->in[3]->type.dims[2] == 8);
        T_CHECK(op->out[0]->type.dims[1] == 4 && op->out[0]->type.dims[2] == 32);
    }
    /* Tiny models: H=4, dn=16, dr=8, dv=16, r=32, hidden=64; q_in is 64
     * (q_proj) for deepseek_v2 and q_lora_rank 24 for the others:
     * runtime 4*24*q_in + 128*32 + 64*64, folded 4*40*q_in + 64*4*32. */
    int64_t q_in = !strcmp(model, "deepseek_v2") ? 64 : 24;
    int64_t run = 3 * (4 * 24 * q_in + 128 * 32 + 64 * 64);
    int64_t fold = 3 * (4 * 40 * q_in + 64 * 4 * 32);
    char want[128];
    snprintf(want, sizeof want, "runtime reads %" PRId64 " weight elements per decode step, folded %" PRId64,
             run, fold);
    T_CHECK(why && strstr(why->s, want));
    if (why && !strstr(why->s, want))
        fprintf(stderr, "%s: want \"%s\" in \"%s\"\n", model, want, why->s);
}

static void test_absorb_tiny(void)
{
    for (int i = 0; i < N_OF(DEEPSEEK); i++) {
        T_CHECK(t_pass_equivalence(DEEPSEEK[i], "absorb_mla", NULL) >= 0);
        check_direct(DEEPSEEK[i], pass_absorb_mla, "absorb_mla");
        ir_module *m = t_pipeline_module(DEEPSEEK[i], "absorb_mla", NULL);
        if (!m)
            continue;
        check_absorbed(DEEPSEEK[i], m);
        /* Nothing is left to absorb the second time. */
        t_pass_idempotent(m, pass_absorb_mla);
        ir_module_free(m);
    }
    /* Qwen has no MLA: the pass changes nothing and records nothing. */
    for (int i = 3; i < N_OF(ALL); i++) {
        ir_module *m = frontend_module(ALL[i]);
        if (!m)
            continue;
        char *before = ir_module_print_str(m);
        T_OK(pass_absorb_mla(m, NULL));
        char *after = ir_module_print_str(m);
        T_CHECK(before && after && !strcmp(before, after));
        T_CHECK(ir_module_meta(m, "mla_absorb") == NULL);
        free(before);
        free(after);
        ir_module_free(m);
    }
}

static int64_t json_int(const cJSON *root, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : 0;
}

/* The real configs: the decision's numbers, computed here from the config,
 * and the choice (runtime: r = 512 is far above dn = 128). */
static void test_absorb_real(const char *config)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/configs/%s", config);
    char *text = t_read_file(t_src(rel), NULL);
    cJSON *c = cJSON_Parse(text);
    T_CHECK(c != NULL);
    if (!c) {
        free(text);
        return;
    }
    int64_t H = json_int(c, "num_attention_heads"), dn = json_int(c, "qk_nope_head_dim");
    int64_t dr = json_int(c, "qk_rope_head_dim"), dv = json_int(c, "v_head_dim");
    int64_t r = json_int(c, "kv_lora_rank"), hidden = json_int(c, "hidden_size");
    int64_t L = json_int(c, "num_hidden_layers");
    int64_t q_in = json_int(c, "q_lora_rank") ? json_int(c, "q_lora_rank") : hidden;
    cJSON_Delete(c);
    int64_t run = L * (H * (dn + dr) * q_in + H * (dn + dv) * r + hidden * H * dv);
    int64_t fold = L * (H * (r + dr) * q_in + hidden * H * r);
    char want[160];
    snprintf(want, sizeof want, "runtime reads %" PRId64 " weight elements per decode step, folded %" PRId64,
             run, fold);
    /* Through the pipeline (fused q/kv_a) and on the unfused module alike. */
    for (int fused = 0; fused < 2; fused++) {
        ir_module *m = NULL;
        T_OK(fe_config_build(text, config, &m));
        if (!m)
            continue;
        if (fused)
            T_OK(pass_run_pipeline(m, NULL, "absorb_mla", NULL, NULL, NULL));
        else
            T_OK(pass_absorb_mla(m, NULL));
        const ir_attr *a = ir_module_meta(m, "mla_absorb");
        const ir_attr *why = ir_module_meta(m, "mla_absorb_why");
        T_CHECK(a && a->kind == IR_ATTR_STR && !strcmp(a->s, "runtime"));
        T_CHECK(why && why->kind == IR_ATTR_STR && strstr(why->s, want));
        T_CHECK(why && !strstr(why->s, "not support"));
        T_CHECK(t_count_ops(m, IR_OP_MLA_ATTENTION) == L && t_count_ops(m, IR_OP_ATTENTION) == 0);
        if (fused)
            printf("absorb_mla %s: mla_absorb = %s\n  mla_absorb_why = %s\n", config,
                   a ? a->s : "?", why ? why->s : "?");
        ir_module_free(m);
    }
    free(text);
}

/* ---- assign_streams ----------------------------------------------------------- */

static int is_stream1_value(const ir_value *v)
{
    return v->kind == IR_VALUE_OP && v->def && v->def->stream == 1;
}

/* Counts breaches of the stream rules into *bad (when not NULL; else each
 * is a failed check); returns the number of fork/join pairs. */
#define S_RULE(cond)          \
    do {                      \
        if (bad)              \
            *bad += !(cond);  \
        else                  \
            T_CHECK(cond);    \
    } while (0)
static int check_streams(const ir_module *m, int *bad)
{
    int forks = 0, joins = 0, fork_at = -1;
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        if (op->kind == IR_OP_FORK) {
            forks++;
            fork_at = k;
            S_RULE(op->stream == 1);
            /* The fork reads an expert op's input (a stream-0 value), or
             * V3.2's q LoRA latent when its pair joins a dsa_topk's ids. */
            int feeds_experts = 0, indexer = 0;
            for (int j = 0; j < m->n_ops; j++)
                feeds_experts |= (m->ops[j]->kind == IR_OP_MOE_EXPERTS ||
                                  m->ops[j]->kind == IR_OP_MOE_ROUTED) &&
                                 m->ops[j]->in[0] == op->in[0];
            for (int j = k + 1; j < m->n_ops; j++)
                if (m->ops[j]->kind == IR_OP_JOIN) {
                    const ir_op *d = m->ops[j]->in[0]->def;
                    indexer = d && d->kind == IR_OP_DSA_TOPK;
                    break;
                }
            S_RULE(feeds_experts || (indexer && op->in[0]->def &&
                                     op->in[0]->def->kind == IR_OP_MLA_PROLOGUE_KV));
            S_RULE(!is_stream1_value(op->in[0]));
        } else if (op->kind == IR_OP_JOIN) {
            joins++;
            S_RULE(op->stream == 0);
            S_RULE(is_stream1_value(op->in[0]) && op->in[0]->def->kind != IR_OP_FORK);
        } else if (op->stream == 1) {
            /* Side-stream ops read the fork, weights, other side values, and
             * step inputs or main-stream values defined before the fork
             * (V3.2's indexer reads qkv_a and the positions). */
            for (int i = 0; i < op->n_in; i++) {
                const ir_value *v = op->in[i];
                S_RULE(v->kind == IR_VALUE_WEIGHT || v->kind == IR_VALUE_INPUT ||
                       is_stream1_value(v) || (v->def && v->def->id < fork_at));
            }
        } else {
            S_RULE(op->stream == 0);
            /* The main stream reads side values only through a join. */
            for (int i = 0; i < op->n_in; i++)
                S_RULE(!is_stream1_value(op->in[i]));
        }
    }
    for (int i = 0; i < m->n_outputs; i++)
        S_RULE(!is_stream1_value(m->outputs[i]));
    S_RULE(forks == joins);
    /* Pairs do not nest: fork, its side ops, join, then the next fork. */
    int open = 0;
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        if (op->kind == IR_OP_FORK) {
            S_RULE(!open);
            open = 1;
        } else if (op->kind == IR_OP_JOIN) {
            S_RULE(open);
            open = 0;
        } else if (op->stream == 1) {
            S_RULE(open);
        }
    }
    return forks;
}
#undef S_RULE

static void test_streams(void)
{
    /* fp16: fold_routed_scale scales the shared output (linear alpha) and
     * the residual add instead; the branch is found all the same. */
    pass_options f16;
    pass_options_default(&f16);
    f16.compute_dtype = IR_DTYPE_F16;
    T_CHECK(t_pass_equivalence("deepseek_v3", "assign_streams", &f16) >= 0);
    T_CHECK(t_pass_equivalence("deepseek_v3", "plan_memory", &f16) >= 0);
    ir_module *h = t_pipeline_module("deepseek_v3", "assign_streams", &f16);
    if (h)
        T_CHECK(check_streams(h, NULL) == 2);
    ir_module_free(h);

    for (int i = 0; i < N_OF(ALL); i++) {
        T_CHECK(t_pass_equivalence(ALL[i], "assign_streams", NULL) >= 0);
        check_direct(ALL[i], pass_assign_streams, "assign_streams");
        ir_module *m = t_pipeline_module(ALL[i], "assign_streams", NULL);
        if (!m)
            continue;
        int pairs = check_streams(m, NULL);
        T_CHECK(pairs == SHARED_LAYERS[i]);
        if (pairs != SHARED_LAYERS[i])
            fprintf(stderr, "%s: %d fork/join pairs, want %d\n", ALL[i], pairs, SHARED_LAYERS[i]);
        /* Each MoE layer with a shared expert: one fork on its input. */
        int side_ops = 0;
        for (int k = 0; k < m->n_ops; k++) {
            const ir_op *e = m->ops[k];
            side_ops += e->stream == 1 && e->kind != IR_OP_FORK;
            if (e->kind != IR_OP_MOE_EXPERTS && e->kind != IR_OP_MOE_ROUTED)
                continue;
            int n = 0;
            for (int j = 0; j < m->n_ops; j++)
                n += m->ops[j]->kind == IR_OP_FORK && m->ops[j]->in[0] == e->in[0];
            T_CHECK(n == (SHARED_LAYERS[i] ? 1 : 0));
        }
        /* The shared MLP is at least 3 ops (gate_up or gate/up, act, down). */
        T_CHECK(side_ops >= 3 * SHARED_LAYERS[i]);
        /* The checker notices a routed op moved to the side stream. */
        for (int k = 0; k < m->n_ops && SHARED_LAYERS[i]; k++) {
            ir_op *e = m->ops[k];
            if (e->kind != IR_OP_MOE_EXPERTS && e->kind != IR_OP_MOE_ROUTED)
                continue;
            int bad = 0;
            e->stream = 1;
            check_streams(m, &bad);
            e->stream = 0;
            T_CHECK(bad > 0);
            break;
        }
        /* A second run finds nothing more to split. */
        t_pass_idempotent(m, pass_assign_streams);
        ir_module_free(m);
    }
}

/* DeepSeek-V3.2: per layer the indexer's branch on stream 1, from a fork of
 * the q LoRA latent right after mla_prologue_kv (the pass runs after the
 * prologue fusions) to a join of the top-k ids right before mla_attention;
 * the q path (q_b, mla_prologue_q, mla_qabsorb) stays on stream 0 in the
 * interval. The shared experts keep their pairs. */
static void test_streams_indexer(void)
{
    const char *model = "deepseek_v32";
    T_CHECK(t_pass_equivalence(model, "assign_streams", NULL) >= 0);
    check_direct(model, pass_assign_streams, "assign_streams");
    ir_module *m = t_pipeline_module(model, "assign_streams", NULL);
    if (!m)
        return;
    int layers = (int)ir_module_meta_int(m, "num_hidden_layers", 0);
    int pairs = check_streams(m, NULL);
    T_CHECK(layers == 3 && pairs == layers + 2); /* l0 and l2 are MoE with a shared expert */
    int found = 0;
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *d = m->ops[k];
        if (d->kind != IR_OP_DSA_TOPK)
            continue;
        found++;
        T_CHECK(d->stream == 1);
        const ir_op *j = ir_module_single_user(m, d->out[0]);
        T_CHECK(j && j->kind == IR_OP_JOIN && j->stream == 0);
        if (!j || j->kind != IR_OP_JOIN)
            continue;
        const ir_op *attn = j->id + 1 < m->n_ops ? m->ops[j->id + 1] : NULL;
        T_CHECK(attn && attn->kind == IR_OP_MLA_ATTENTION && attn->n_in == 6 &&
                attn->in[5] == j->out[0] && ir_module_single_user(m, j->out[0]) == attn);
        /* the fork: the last fork before d, right after mla_prologue_kv */
        const ir_op *f = NULL;
        for (int i = d->id - 1; i >= 0 && !f; i--)
            if (m->ops[i]->kind == IR_OP_FORK)
                f = m->ops[i];
        T_CHECK(f && f->in[0]->def && f->in[0]->def->kind == IR_OP_MLA_PROLOGUE_KV &&
                f->in[0] == f->in[0]->def->out[0] && m->ops[f->id - 1] == f->in[0]->def);
        if (!f)
            continue;
        /* stream 1 in (f, j): wq_b's linear of the fork, dsa_prologue_k, d,
           in that order; stream 0: q_b's linear of the latent, the prologue
           of q, mla_qabsorb */
        int n1 = 0, q_b = 0, pro_q = 0, qabsorb = 0;
        for (int i = f->id + 1; i < j->id; i++) {
            const ir_op *op = m->ops[i];
            if (op->stream == 1) {
                if (n1 == 0)
                    T_CHECK(op->kind == IR_OP_LINEAR && op->in[0] == f->out[0] &&
                            d->in[0] == op->out[0] && strstr(op->in[1]->name, "indexer.wq_b"));
                else if (n1 == 1)
                    T_CHECK(op->kind == IR_OP_DSA_PROLOGUE_K && d->in[1] == op->out[0] &&
                            op->in[0] == d->in[2] && op->in[0]->def->id < f->id);
                else
                    T_CHECK(n1 == 2 && op == d);
                n1++;
                continue;
            }
            q_b += op->kind == IR_OP_LINEAR && op->in[0] == f->in[0];
            pro_q += op->kind == IR_OP_MLA_PROLOGUE_Q;
            qabsorb += op->kind == IR_OP_MLA_QABSORB;
        }
        T_CHECK(n1 == 3 && q_b == 1 && pro_q == 1 && qabsorb == 1);
    }
    T_CHECK(found == layers);
    /* The checker notices the attention reading the ids past the join. */
    for (int k = 0; k < m->n_ops; k++) {
        ir_op *a = m->ops[k];
        if (a->kind != IR_OP_MLA_ATTENTION)
            continue;
        ir_value *was = a->in[5];
        int bad = 0;
        a->in[5] = was->def->in[0];
        check_streams(m, &bad);
        a->in[5] = was;
        T_CHECK(bad > 0);
        break;
    }
    printf("assign_streams %-18s %d indexer branches on stream 1, %d fork/join pairs\n", model,
           found, pairs);
    t_pass_idempotent(m, pass_assign_streams);
    ir_module_free(m);
}

/* ---- plan_memory: an independent checker -------------------------------------- */

typedef struct plan_report {
    int64_t sum, peak, arena;
    int violations;
} plan_report;

static void violation(plan_report *r, int verbose, const char *fmt, const char *a, const char *b)
{
    if (verbose && r->violations < 5) {
        fprintf(stderr, fmt, a, b);
        fputc('\n', stderr);
    }
    r->violations++;
}

/* Whether op makes y an alias of its operand x: a reshape, fork or join at
 * exactly x's offset, x an op result (step inputs are not in the GPU arena). */
static int is_alias(const ir_op *op)
{
    return (op->kind == IR_OP_RESHAPE || op->kind == IR_OP_FORK || op->kind == IR_OP_JOIN) &&
           op->in[0]->kind == IR_VALUE_OP && op->in[0]->mem_offset == op->out[0]->mem_offset;
}

/* Recomputes sizes and live ranges (fork..join stretching included), joins
 * each alias with its operand (one buffer, live while any of them is), and
 * counts values of different buffers whose bytes overlap while both are
 * live. */
static plan_report check_plan(const ir_module *m, int verbose)
{
    plan_report r = {0, 0, ir_module_meta_int(m, "arena_bytes_per_token", -1), 0};
    int n = m->n_values;
    int64_t *lo = calloc((size_t)n, sizeof *lo), *hi = calloc((size_t)n, sizeof *hi);
    int64_t *size = calloc((size_t)n, sizeof *size);
    if (!lo || !hi || !size) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    for (int i = 0; i < n; i++)
        lo[i] = hi[i] = -1;
    for (int k = 0; k < m->n_ops; k++)
        for (int j = 0; j < m->ops[k]->n_out; j++)
            lo[m->ops[k]->out[j]->id] = hi[m->ops[k]->out[j]->id] = k;
    for (int k = 0; k < m->n_ops; k++)
        for (int j = 0; j < m->ops[k]->n_in; j++)
            if (hi[m->ops[k]->in[j]->id] < k)
                hi[m->ops[k]->in[j]->id] = k;
    for (int i = 0; i < m->n_outputs; i++)
        hi[m->outputs[i]->id] = m->n_ops;
    /* fork..join intervals, paired in order */
    int fork_at = -1;
    for (int k = 0; k < m->n_ops; k++) {
        if (m->ops[k]->kind == IR_OP_FORK)
            fork_at = k;
        if (m->ops[k]->kind != IR_OP_JOIN || fork_at < 0)
            continue;
        for (int q = fork_at; q <= k; q++) {
            const ir_op *op = m->ops[q];
            for (int j = 0; j < op->n_in + op->n_out; j++) {
                int id = (j < op->n_in ? op->in[j] : op->out[j - op->n_in])->id;
                lo[id] = lo[id] < fork_at ? lo[id] : fork_at;
                hi[id] = hi[id] > k ? hi[id] : k;
            }
        }
        fork_at = -1;
    }
    /* buffers: buf[v] the first value of v's alias chain, its range the union */
    int *buf = calloc((size_t)n, sizeof *buf);
    if (!buf) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    for (int i = 0; i < n; i++)
        buf[i] = i;
    for (int k = 0; k < m->n_ops; k++)
        if (is_alias(m->ops[k]))
            buf[m->ops[k]->out[0]->id] = buf[m->ops[k]->in[0]->id];
    for (int i = 0; i < n; i++) {
        int b = buf[i];
        lo[b] = lo[i] < lo[b] ? lo[i] : lo[b];
        hi[b] = hi[i] > hi[b] ? hi[i] : hi[b];
    }
    for (int i = 0; i < n; i++) {
        const ir_value *v = m->values[i];
        if (v->kind == IR_VALUE_WEIGHT) {
            if (v->mem_offset != -1)
                violation(&r, verbose, "weight %%%s has an arena offset%s", v->name, "");
            continue;
        }
        int64_t bytes = 1;
        for (int d = 1; d < v->type.rank; d++)
            bytes *= v->type.dims[d];
        size[i] = (bytes * 4 + 15) / 16 * 16;
        r.sum += size[i];
        if (v->mem_offset < 0 || v->mem_offset % 16 != 0)
            violation(&r, verbose, "%%%s: offset not 16-aligned or unset%s", v->name, "");
        if (v->mem_offset + size[i] > r.peak)
            r.peak = v->mem_offset + size[i];
    }
    if (r.peak > r.arena)
        violation(&r, verbose, "arena_bytes_per_token too small%s%s", "", "");
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            const ir_value *a = m->values[i], *b = m->values[j];
            int bi = buf[i], bj = buf[j];
            if (a->kind == IR_VALUE_WEIGHT || b->kind == IR_VALUE_WEIGHT || bi == bj)
                continue;
            if (lo[bi] > hi[bj] || lo[bj] > hi[bi])
                continue;
            if (a->mem_offset < b->mem_offset + size[j] && b->mem_offset < a->mem_offset + size[i])
                violation(&r, verbose, "%%%s and %%%s overlap while both live", a->name, b->name);
        }
    free(buf);
    free(lo);
    free(hi);
    free(size);
    return r;
}

/* A module of eight [T, 8] values live across one fork..join: the side
 * stream's s1 may not share bytes with the main stream's r2 even though in
 * program order s1 is dead before r2 is born. The fork's f is e's bytes and
 * the join's j is s2's (aliases); o = add(r3, j) is the only value that
 * reuses bytes, and not those it reads. */
static const char *const STREAM_IR =
    "module t {\n"
    "  input %tokens : i32[T]\n"
    "  input %positions : i32[T]\n"
    "  weight %emb : f32[16, 8] = \"emb\"\n"
    "  weight %w : f32[8, 8] = \"w\"\n"
    "  %e : f32[T, 8] = embedding(%tokens, %emb)\n"
    "  %f : f32[T, 8] = fork(%e) stream 1\n"
    "  %s1 : f32[T, 8] = linear(%f, %w) stream 1\n"
    "  %s2 : f32[T, 8] = linear(%s1, %w) stream 1\n"
    "  %r1 : f32[T, 8] = linear(%e, %w)\n"
    "  %r2 : f32[T, 8] = linear(%r1, %w)\n"
    "  %r3 : f32[T, 8] = linear(%r2, %w)\n"
    "  %j : f32[T, 8] = join(%s2)\n"
    "  %o : f32[T, 8] = add(%r3, %j)\n"
    "  output %o\n"
    "}\n";

static void test_plan_small(void)
{
    ir_module *m = NULL;
    T_OK(ir_module_parse(STREAM_IR, "stream_ir", &m));
    if (!m)
        return;
    T_OK(pass_plan_memory(m, NULL));
    plan_report r = check_plan(m, 1);
    T_CHECK(r.violations == 0);
    /* e (= f), s1, s2 (= j), r1, r2, r3 all live over fork..join: 6 * 32
     * bytes; o reuses; tokens (16) sits beside e; positions reuses. The
     * sum without reuse still counts every value. */
    T_CHECK(r.arena == 192);
    T_CHECK(ir_module_meta_int(m, "activation_bytes_per_token", -1) == 9 * 32 + 2 * 16);
    const ir_value *s1 = ir_module_find_value(m, "s1"), *r2 = ir_module_find_value(m, "r2");
    T_CHECK(s1 && r2 && s1->mem_offset != r2->mem_offset);
    const ir_value *e = ir_module_find_value(m, "e"), *f = ir_module_find_value(m, "f");
    const ir_value *s2 = ir_module_find_value(m, "s2"), *j = ir_module_find_value(m, "j");
    const ir_value *o = ir_module_find_value(m, "o"), *r3 = ir_module_find_value(m, "r3");
    T_CHECK(e && f && e->mem_offset == f->mem_offset);
    T_CHECK(s2 && j && s2->mem_offset == j->mem_offset);
    T_CHECK(o && r3 && o->mem_offset != r3->mem_offset && o->mem_offset != j->mem_offset);
    /* the verifier holds the plan to the same rule: s1 into r2's bytes, or
     * r1 into e's while the side stream reads f, is refused */
    T_OK(ir_module_verify(m));
    ir_value *s1w = ir_module_find_value(m, "s1"), *r1w = ir_module_find_value(m, "r1");
    int64_t keep = s1w->mem_offset;
    s1w->mem_offset = r2->mem_offset;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "share arena bytes while both are live");
    T_CHECK(check_plan(m, 0).violations > 0);
    s1w->mem_offset = keep;
    keep = r1w->mem_offset;
    r1w->mem_offset = f->mem_offset;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "share arena bytes while both are live");
    T_CHECK(check_plan(m, 0).violations > 0);
    r1w->mem_offset = keep;
    T_OK(ir_module_verify(m));
    /* Printed as @N*T and read back the same. */
    char *text = ir_module_print_str(m);
    T_CHECK(text && strstr(text, "*T"));
    ir_module *back = NULL;
    T_OK(ir_module_parse(text, "planned", &back));
    char *again = back ? ir_module_print_str(back) : NULL;
    T_CHECK(text && again && !strcmp(text, again));
    free(text);
    free(again);
    ir_module_free(back);
    ir_module_free(m);
}

/* ---- plan_memory: for real, in the planned arena ------------------------------ */

enum { MAX_SEQ = 16 };
static const int STEPS[] = {5, 3, 1, 1}; /* prefill, a chunk, two decode steps */
#define N_TOKENS 10

/* Runs m over tokens in STEPS (one sequence) into rows; with planned set the
 * interpreter keeps every activation in the planned arena. */
static int run_steps(const char *model, const ir_module *m, int planned, const int32_t *tokens,
                     int vocab, float *rows)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/%s", model);
    rt_weights *w = NULL;
    rt_interp *in = NULL;
    int ok = 0;
    if (rt_weights_open(m, t_src(rel), &w) != MOEC_OK ||
        rt_interp_init(m, w, MAX_SEQ, &in) != MOEC_OK)
        goto out;
    if (planned && rt_interp_use_plan(in, 1) != MOEC_OK)
        goto out;
    int at = 0;
    for (int s = 0; s < N_OF(STEPS); s++) {
        int32_t pos[MAX_SEQ];
        for (int t = 0; t < STEPS[s]; t++)
            pos[t] = at + t;
        if (rt_interp_forward(in, tokens + at, pos, STEPS[s], rows + (size_t)at * vocab) != MOEC_OK)
            goto out;
        at += STEPS[s];
    }
    ok = 1;
out:
    if (!ok)
        fprintf(stderr, "%s: run failed: %s\n", model, moec_last_error());
    rt_interp_free(in);
    rt_weights_free(w);
    return ok;
}

static double worst_row_error(const float *a, const float *b, int rows, int vocab)
{
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        double ref = 0, diff = 0;
        for (int v = 0; v < vocab; v++) {
            size_t i = (size_t)r * vocab + v;
            ref = fmax(ref, fabs(a[i]));
            diff = fmax(diff, fabs((double)a[i] - b[i]));
        }
        worst = fmax(worst, diff / (ref > 0 ? ref : 1));
    }
    return worst;
}

/* The residual stream value of the first layer (an add's result read
 * twice, or the sum of an add_rms_norm, whose norm is inside it), and a
 * value of the same size born (by an op that does not read it) while it is
 * still needed: forcing them together must corrupt. */
static void sabotage(ir_module *m)
{
    for (int k = 0; k < m->n_ops; k++) {
        ir_value *u = m->ops[k]->out[0];
        ir_op_kind kind = m->ops[k]->kind;
        int uses = ir_module_use_count(m, u);
        if (!(kind == IR_OP_ADD && uses >= 2) && !(kind == IR_OP_ADD_RMS_NORM && uses >= 1))
            continue;
        int last = k;
        for (int q = k + 1; q < m->n_ops; q++)
            for (int i = 0; i < m->ops[q]->n_in; i++)
                if (m->ops[q]->in[i] == u)
                    last = q;
        for (int q = k + 1; q < last; q++) {
            ir_value *v = m->ops[q]->out[0];
            int reads_u = 0; /* an op's result may not overlap its operands */
            for (int i = 0; i < m->ops[q]->n_in; i++)
                reads_u |= m->ops[q]->in[i] == u;
            if (!reads_u && v->type.dtype == IR_DTYPE_F32 &&
                ir_type_numel(&v->type, 1) == ir_type_numel(&u->type, 1)) {
                v->mem_offset = u->mem_offset;
                return;
            }
        }
    }
    T_CHECK(!"no value to sabotage");
}

/* Every reshape, fork and join after plan_memory is an alias (the tiny
 * models have no storage-changing one); their number. */
static int check_aliases(const ir_module *m)
{
    int n = 0;
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        if (op->kind != IR_OP_RESHAPE && op->kind != IR_OP_FORK && op->kind != IR_OP_JOIN)
            continue;
        n++;
        T_CHECK(is_alias(op));
        if (!is_alias(op))
            fprintf(stderr, "%s %%%s @%" PRId64 " is not at %%%s's offset %" PRId64 "\n",
                    ir_op_name(op->kind), op->out[0]->name, op->out[0]->mem_offset,
                    op->in[0]->name, op->in[0]->mem_offset);
    }
    return n;
}

static int reads(const ir_op *op, const ir_value *v)
{
    for (int i = 0; i < op->n_in; i++)
        if (op->in[i] == v)
            return 1;
    return 0;
}

/* Breaks the first alias made by an op of `kind`: an op that runs while the
 * shared buffer is still to be read, and reads neither name of it, gets its
 * result put into it. For a reshape or fork, an op after the alias and before
 * the buffer's last read (so the program-order interpreter reads the
 * damage); for a join, an op of the main stream between the fork and the
 * join (on the GPU it writes while the side stream computes the joined
 * value). The name of the value moved, or NULL when there is none. */
static const char *sabotage_alias(ir_module *m, ir_op_kind kind)
{
    int64_t arena = ir_module_meta_int(m, "arena_bytes_per_token", 0);
    int fork_at = -1;
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        if (op->kind == IR_OP_FORK)
            fork_at = k;
        if (op->kind != kind || !is_alias(op))
            continue;
        const ir_value *x = op->in[0], *y = op->out[0];
        int from = k + 1, to = k;
        if (kind == IR_OP_JOIN) {
            from = fork_at + 1;
            to = k;
        } else {
            for (int q = k + 1; q < m->n_ops; q++)
                if (reads(m->ops[q], x) || reads(m->ops[q], y))
                    to = q;
        }
        for (int q = from; q < to; q++) {
            const ir_op *w = m->ops[q];
            ir_value *r = w->out[0];
            if (w == op || w->stream != 0 || reads(w, x) || reads(w, y) || r == x ||
                y->mem_offset + ir_type_numel(&r->type, 1) * 4 > arena)
                continue;
            r->mem_offset = y->mem_offset;
            return r->name;
        }
    }
    return NULL;
}

/* Aliases of each kind sabotaged, over all models: every kind in some
 * model (after fuse_mla_prologue and fuse_attn_prologue a module's only
 * reshapes are read right away, leaving no op between to break them, so
 * test_plan also plans qwen3_moe_fp8 without fuse_attn_prologue, whose
 * reshapes then have ops between). */
static int n_sabotaged[3];

/* The sabotaged aliases of each kind: the independent checker and the
 * verifier refuse them, and (reshape, fork) the planned run disagrees. */
static void test_alias_sabotage(const char *model, const ir_module *planned, const int32_t *tokens,
                                const float *ref, int vocab)
{
    static const ir_op_kind kinds[] = {IR_OP_RESHAPE, IR_OP_FORK, IR_OP_JOIN};
    size_t n = (size_t)N_TOKENS * vocab;
    float *rows = malloc(n * sizeof *rows);
    if (!rows) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    for (int i = 0; i < N_OF(kinds); i++) {
        ir_module *m = NULL;
        T_OK(ir_module_clone(planned, &m));
        if (!m)
            continue;
        const char *moved = sabotage_alias(m, kinds[i]);
        if (!moved) {
            printf("plan_memory %-18s no %s alias to sabotage\n", model, ir_op_name(kinds[i]));
            ir_module_free(m);
            continue;
        }
        n_sabotaged[i]++;
        T_CHECK(check_plan(m, 0).violations > 0);
        T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "share arena bytes while both are live");
        if (kinds[i] != IR_OP_JOIN) {
            memset(rows, 0, n * sizeof *rows);
            int ran = run_steps(model, m, 1, tokens, vocab, rows);
            T_CHECK(ran);
            if (ran) {
                double err = worst_row_error(ref, rows, N_TOKENS, vocab);
                printf("plan_memory %-18s %s alias overwritten by %%%s: max row error %.3g "
                       "(must be large)\n",
                       model, ir_op_name(kinds[i]), moved, err);
                T_CHECK(err > 1e-3);
            }
        } else {
            printf("plan_memory %-18s join alias overwritten by %%%s: refused\n", model, moved);
        }
        ir_module_free(m);
    }
    free(rows);
}

/* pairs: the fork/join pairs of the module (printed). */
/* model through the pipeline up to stop_after, without pass `drop`
 * (NULL: none). */
static ir_module *pipeline_without(const char *model, const char *stop_after, const char *drop)
{
    if (!drop)
        return t_pipeline_module(model, stop_after, NULL);
    int n;
    const pass_info *pipe = pass_pipeline(&n);
    pass_info keep[64];
    int k = 0;
    for (int i = 0; i < n && k < N_OF(keep); i++)
        if (strcmp(pipe[i].name, drop))
            keep[k++] = pipe[i];
    ir_module *m = frontend_module(model);
    if (m)
        T_OK(pass_run_passes(m, keep, k, NULL, stop_after, NULL, NULL, NULL));
    return m;
}

static void test_plan_real(const char *model, int idx, int pairs, const char *drop)
{
    ir_module *plain = pipeline_without(model, "assign_streams", drop);
    ir_module *planned = pipeline_without(model, "plan_memory", drop);
    if (!plain || !planned) {
        ir_module_free(plain);
        ir_module_free(planned);
        return;
    }
    plan_report r = check_plan(planned, 1);
    T_CHECK(r.violations == 0);
    T_CHECK(r.peak <= r.arena && r.arena <= r.sum && r.arena < r.sum);
    int aliases = check_aliases(planned);
    T_CHECK(aliases > 0);
    printf("plan_memory %-18s %d reshape/fork/join results share their operand's bytes\n", model,
           aliases);
    T_CHECK(ir_module_meta_int(planned, "activation_bytes_per_token", -1) == r.sum);
    printf("plan_memory %-18s arena %" PRId64 " bytes/token of %" PRId64 " (%.0f%%), %d fork/join pairs\n",
           model, r.arena, r.sum, 100.0 * (double)r.arena / (double)r.sum, pairs);

    int vocab = (int)ir_module_meta_int(plain, "vocab_size", 0);
    uint64_t seed = 0x91a7 + (uint64_t)idx;
    int32_t tokens[N_TOKENS];
    for (int i = 0; i < N_TOKENS; i++)
        tokens[i] = (int32_t)(t_rand_u64(&seed) % (uint64_t)vocab);
    size_t n = (size_t)N_TOKENS * vocab;
    float *ra = malloc(n * sizeof *ra), *rb = malloc(n * sizeof *rb);
    if (!ra || !rb) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    int ok_a = run_steps(model, plain, 0, tokens, vocab, ra);
    int ok_b = run_steps(model, planned, 1, tokens, vocab, rb);
    T_CHECK(ok_a && ok_b);
    if (ok_a && ok_b) {
        double err = worst_row_error(ra, rb, N_TOKENS, vocab);
        printf("plan_memory %-18s planned arena vs unplanned: max row error %.3g\n", model, err);
        T_CHECK(err <= 1e-5);
        test_alias_sabotage(model, planned, tokens, ra, vocab);
    }
    /* The same checks on a broken plan: the checker and the run both notice. */
    sabotage(planned);
    T_CHECK(check_plan(planned, 0).violations > 0);
    memset(rb, 0, n * sizeof *rb);
    int ran = run_steps(model, planned, 1, tokens, vocab, rb);
    T_CHECK(ran);
    if (ran && ok_a) {
        double err = worst_row_error(ra, rb, N_TOKENS, vocab);
        printf("plan_memory %-18s sabotaged plan: max row error %.3g (must be large)\n", model, err);
        T_CHECK(err > 1e-3);
    }
    free(ra);
    free(rb);
    ir_module_free(plain);
    ir_module_free(planned);
}

static void test_plan(void)
{
    test_plan_small();
    for (int i = 0; i < N_OF(ALL); i++) {
        T_CHECK(t_pass_equivalence(ALL[i], "plan_memory", NULL) >= 0);
        test_plan_real(ALL[i], i, SHARED_LAYERS[i], NULL);
    }
    /* V3.2: the indexer's pairs too (3 layers, 2 with a shared expert) */
    T_CHECK(t_pass_equivalence("deepseek_v32", "plan_memory", NULL) >= 0);
    test_plan_real("deepseek_v32", N_OF(ALL), 3 + 2, NULL);
    test_plan_real("qwen3_moe_fp8", N_OF(ALL) + 1, 0, "fuse_attn_prologue");
    for (int i = 0; i < 3; i++)
        T_CHECK(n_sabotaged[i] > 0);
}

int main(void)
{
    test_absorb_tiny();
    test_absorb_real("deepseek_v2_lite.json");
    test_absorb_real("deepseek_v3.json");
    test_streams();
    test_streams_indexer();
    test_plan();
    return t_finish("test_pass_sched");
}
