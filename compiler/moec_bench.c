/* moec_bench.c — the decode benchmark behind `moec bench` (moec.h): time
 * per step next to its memory floor, the bytes the step cannot avoid
 * reading over the bandwidth the device shows for a plain copy. */
#include <stdlib.h>
#include <string.h>

#include "compiler/api_internal.h"
#include "err.h"
#include "timer.h"

/* A weight's bytes on the device: an fp8 weight's codes and its block scales. */
static double storage_bytes(const ir_module *m, const ir_value *v, ir_dtype compute)
{
    return (double)ir_weight_storage_bytes(m, v, compute);
}

/* 1 when the weight's only readers are embedding lookups (rows, not the table). */
static int embedding_only(const ir_module *m, const ir_value *w)
{
    int uses = 0;
    for (int i = 0; i < m->n_ops; i++)
        for (int k = 0; k < m->ops[i]->n_in; k++)
            if (m->ops[i]->in[k] == w) {
                if (m->ops[i]->kind != IR_OP_EMBEDDING)
                    return 0;
                uses++;
            }
    return uses > 0;
}

/* 1 when w is an expert weight of a moe_routed op (operand 3 and after). */
static int expert_weight(const ir_module *m, const ir_value *w)
{
    for (int i = 0; i < m->n_ops; i++)
        if (m->ops[i]->kind == IR_OP_MOE_ROUTED)
            for (int k = 3; k < m->ops[i]->n_in; k++)
                if (m->ops[i]->in[k] == w)
                    return 1;
    return 0;
}

/* The bytes one decode step of B sequences at `context` reads: the
 * experts each MoE layer selects are read back from a step run as far as
 * that layer's expert op (later in the step the plan reuses their memory). */
static moec_status step_bytes(const moec_cuda_model *g, int B, int context, const int32_t *tok,
                              const int32_t *pos, const int32_t *slot, moec_bench_row *row)
{
    const ir_module *m = g->fused;
    ir_dtype dt = g->plan->compute_dtype;
    double bytes = 0;
    for (int i = 0; i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        if (v->kind != IR_VALUE_WEIGHT || expert_weight(m, v))
            continue;
        bytes += embedding_only(m, v) ? storage_bytes(m, v, dt) / (double)v->type.dims[0] * B
                                      : storage_bytes(m, v, dt);
    }
    row->experts_hit = row->experts_total = 0;
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *op = m->ops[i];
        if (op->kind == IR_OP_ATTENTION || op->kind == IR_OP_MLA_ATTENTION) {
            int first = op->kind == IR_OP_ATTENTION ? 1 : 2;
            double per_token = (double)(ir_type_numel(&op->in[first]->type, 1) +
                                        ir_type_numel(&op->in[first + 1]->type, 1)) *
                               (double)ir_dtype_size(dt);
            /* DSA's sparse attention reads only the rows its selection holds */
            int sel_at = op->kind == IR_OP_ATTENTION ? 4 : 5;
            double rows = context + 1;
            if (op->n_in > sel_at && op->in[sel_at]->type.dims[1] < rows)
                rows = (double)op->in[sel_at]->type.dims[1];
            bytes += per_token * (double)B * rows;
        }
        if (op->kind == IR_OP_DSA_TOPK) /* the indexer reads every cached key */
            bytes += (double)ir_type_numel(&op->in[1]->type, 1) * (double)ir_dtype_size(dt) *
                     (double)B * (double)(context + 1);
        if (op->kind != IR_OP_MOE_ROUTED)
            continue;
        const ir_value *ids = op->in[1];
        int E = (int)op->in[op->n_in - 1]->type.dims[0], K = (int)ids->type.dims[1];
        int32_t *buf = malloc((size_t)B * (size_t)K * sizeof *buf);
        char *hit = calloc((size_t)E, 1);
        moec_status st = buf && hit ? rt_cuda_run_until(g->cuda, B, tok, pos, slot, op->id)
                                    : MOEC_ERR(MOEC_ERR_OOM, "out of memory");
        if (st == MOEC_OK)
            st = rt_cuda_read_value(g->cuda, B, ids, buf, (size_t)B * (size_t)K * sizeof *buf);
        int n_hit = 0;
        for (int k = 0; st == MOEC_OK && k < B * K; k++)
            if (buf[k] >= 0 && buf[k] < E && !hit[buf[k]]) {
                hit[buf[k]] = 1;
                n_hit++;
            }
        free(buf);
        free(hit);
        MOEC_TRY(st);
        double per_expert = 0;
        for (int k = 3; k < op->n_in; k++)
            per_expert += storage_bytes(m, op->in[k], dt) / E;
        bytes += per_expert * n_hit;
        row->experts_hit += n_hit;
        row->experts_total += E;
    }
    row->bytes = bytes;
    return MOEC_OK;
}

const char *moec_bench_mode_name(int mode)
{
    static const char *names[MOEC_BENCH_MODES] = {"graph", "graph_single", "eager", "eager_single"};
    return mode >= 0 && mode < MOEC_BENCH_MODES ? names[mode] : "?";
}

/* The plan's bucket that runs B tokens. */
static int launches(const ir_bucket *b)
{
    int n = 0;
    for (int i = 0; i < b->n_steps; i++)
        n += b->steps[i].kind == IR_STEP_KERNEL || b->steps[i].kind == IR_STEP_GEMM;
    return n;
}

typedef struct prof_entry {
    char name[160];
    int count;
    double ms;
} prof_entry;

static int cmp_prof(const void *a, const void *b)
{
    double x = ((const prof_entry *)a)->ms, y = ((const prof_entry *)b)->ms;
    return (x < y) - (x > y);
}

/* Times every launch of B tokens' step and writes them summed by kernel
 * (GEMMs by the op they implement), the largest first. */
static moec_status profile(const moec_cuda_model *g, int B, const int32_t *tok, const int32_t *pos,
                           const int32_t *slot, int iters, FILE *out)
{
    const ir_bucket *b = ir_plan_bucket_for(g->plan, B);
    double *ms = calloc((size_t)b->n_steps, sizeof *ms);
    prof_entry *e = calloc((size_t)b->n_steps, sizeof *e);
    moec_status st = ms && e ? MOEC_OK : MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    if (st == MOEC_OK)
        st = rt_cuda_profile_steps(g->cuda, B, tok, pos, slot, iters, ms);
    int n = 0;
    double total = 0;
    for (int i = 0; st == MOEC_OK && i < b->n_steps; i++) {
        const ir_step *s = &b->steps[i];
        char name[160];
        if (s->kind == IR_STEP_KERNEL)
            snprintf(name, sizeof name, "%s", b->kernel_names[s->kernel]);
        else if (s->kind == IR_STEP_GEMM)
            snprintf(name, sizeof name, "cublasLt (%s)",
                     ir_op_name(g->fused->ops[s->op_id]->kind));
        else
            continue;
        int k = 0;
        while (k < n && strcmp(e[k].name, name))
            k++;
        if (k == n)
            snprintf(e[n++].name, sizeof e->name, "%s", name);
        e[k].count++;
        e[k].ms += ms[i];
        total += ms[i];
    }
    if (st == MOEC_OK) {
        qsort(e, (size_t)n, sizeof *e, cmp_prof);
        fprintf(out, "profile: batch %d (bucket T=%d), %d launches, %.3f ms summed over launches\n",
                B, b->T, launches(b), total);
        fprintf(out, "%10s %6s %8s %10s  %s\n", "ms", "%", "count", "us/launch", "kernel");
        for (int k = 0; k < n; k++)
            fprintf(out, "%10.4f %6.1f %8d %10.2f  %s\n", e[k].ms, 100 * e[k].ms / total, e[k].count,
                    1e3 * e[k].ms / e[k].count, e[k].name);
    }
    free(ms);
    free(e);
    return st;
}

/* Times B tokens' step in every mode into row->mode_ms. */
static moec_status time_modes(const moec_cuda_model *g, int B, const int32_t *tok,
                              const int32_t *pos, const int32_t *slot, const moec_bench_options *o,
                              moec_bench_row *row)
{
    for (int mode = 0; mode < MOEC_BENCH_MODES; mode++) {
        int graph = mode == MOEC_BENCH_GRAPH_DUAL || mode == MOEC_BENCH_GRAPH_SINGLE;
        int single = mode == MOEC_BENCH_GRAPH_SINGLE || mode == MOEC_BENCH_EAGER_SINGLE;
        rt_cuda_set_single_stream(g->cuda, single);
        graph_set_enabled(g->graphs, graph);
        float ms = 0;
        MOEC_TRY(graph_time_steps(g->graphs, g->cuda, B, tok, pos, slot, o->warmup, o->steps,
                                  &ms));
        row->mode_ms[mode] = graph && !graph_captured(g->graphs) ? -1 : ms;
    }
    rt_cuda_set_single_stream(g->cuda, 0);
    graph_set_enabled(g->graphs, 1);
    row->step_ms = row->mode_ms[MOEC_BENCH_GRAPH_DUAL] > 0 ? row->mode_ms[MOEC_BENCH_GRAPH_DUAL]
                                                            : row->mode_ms[MOEC_BENCH_EAGER_DUAL];
    return MOEC_OK;
}

/* Binds the model (or the plan already read into g, which took read_s) for
 * B up to max_b and captures both stream modes' graphs (unless
 * MOEC_DISABLE_GRAPHS=1), timing each part. */
static moec_status bench_bind(const moec_model_t *model, const char *weights_dir,
                              const moec_bench_options *o, const ir_plan_meta *meta, int max_b,
                              double read_s, moec_cuda_model *g, int *vocab, moec_bench_result *out)
{
    moec_cuda_opts co = {.max_seqs = max_b, .max_seq_len = out->context + 1, .eager = 1};
    double t0 = moec_now_s();
    if (o->plan_path) {
        MOEC_TRY(moec_cuda_plan_bind(g, meta, o->plan_path, weights_dir, &co, vocab));
    } else {
        ir_dtype dt = IR_DTYPE_BF16;
        MOEC_TRY(moec_cuda_dtype(&dt));
        MOEC_TRY(moec_cuda_model_init(model, weights_dir, dt, &co, g));
        *vocab = moec_model_vocab_size(model);
    }
    out->setup_s = read_s + moec_now_s() - t0;
    if (graph_disabled_by_env())
        return MOEC_OK;
    for (int single = 1; single >= 0; single--) {
        rt_cuda_set_single_stream(g->cuda, single);
        t0 = moec_now_s();
        MOEC_TRY(graph_capture(g->graphs));
        *(single ? &out->capture_single_s : &out->capture_s) = moec_now_s() - t0;
    }
    return MOEC_OK;
}

/* out->context from the options (negative: the default) and out->max_context
 * from the model's max_position_embeddings (0: unknown): each step decodes
 * one token at position `context`, so context + 1 positions must fit. */
static moec_status bench_context(const moec_bench_options *o, int max_pos, moec_bench_result *out)
{
    out->max_context = max_pos > 0 ? max_pos - 1 : 0;
    out->context = o->context;
    if (out->context < 0)
        out->context = max_pos > 0 && max_pos - 1 < MOEC_BENCH_DEFAULT_CONTEXT
                           ? max_pos - 1
                           : MOEC_BENCH_DEFAULT_CONTEXT;
    if (max_pos > 0 && out->context > out->max_context)
        return MOEC_ERR(MOEC_ERR_CAPACITY,
                        "context %d is too long: each step decodes the token after it, and the "
                        "model's max_position_embeddings %d allows a context of at most %d",
                        out->context, max_pos, out->max_context);
    return MOEC_OK;
}

/* Everything before the device is looked for: the plan read (g->fused), the
 * context checked against the model. */
static moec_status bench_prepare(const moec_model_t *model, const moec_bench_options *o,
                                 moec_cuda_model *g, ir_plan_meta *meta, moec_bench_result *out)
{
    int max_pos = 0;
    if (o->plan_path) {
        MOEC_TRY(moec_cuda_plan_read(o->plan_path, g, meta));
        if (meta->tp)
            return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                            "plan %s is split over %d ranks (tp %d): benchmarking a group of "
                            "ranks is not supported yet",
                            o->plan_path, ir_plan_meta_ranks(meta), meta->tp);
        max_pos = (int)ir_module_meta_int(g->fused, "max_position_embeddings", 0);
    } else {
        max_pos = moec_model_max_positions(model);
    }
    return bench_context(o, max_pos, out);
}

moec_status moec_bench(const moec_model_t *model, const char *weights_dir,
                       const moec_bench_options *o, moec_bench_result *out)
{
    if ((!model && !(o && o->plan_path)) || !weights_dir || !o || !out || o->n_batch < 1 ||
        o->n_batch > 16 || o->steps < 1 || o->warmup < 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_bench: bad options");
    memset(out, 0, sizeof *out);
    int max_b = 0;
    for (int i = 0; i < o->n_batch; i++)
        max_b = o->batch[i] > max_b ? o->batch[i] : max_b;
    moec_cuda_model g;
    memset(&g, 0, sizeof g);
    ir_plan_meta meta;
    double t0 = moec_now_s();
    moec_status st = bench_prepare(model, o, &g, &meta, out);
    double read_s = moec_now_s() - t0;
    int n_dev = 0;
    if (st == MOEC_OK)
        st = moec_cuda_device_count(&n_dev);
    double bw = 0;
    if (st == MOEC_OK)
        st = rt_cuda_copy_bandwidth((size_t)1 << 30, 20, &bw);
    out->copy_bytes_per_s = bw;
    int vocab = 0;
    if (st == MOEC_OK)
        st = bench_bind(model, weights_dir, o, &meta, max_b, read_s, &g, &vocab, out);
    if (st != MOEC_OK) {
        moec_cuda_model_free(&g);
        return st;
    }
    snprintf(out->device, sizeof out->device, "%s", rt_cuda_device_name(g.cuda));
    int32_t *tok = malloc((size_t)max_b * sizeof *tok), *pos = malloc((size_t)max_b * sizeof *pos),
            *slot = malloc((size_t)max_b * sizeof *slot);
    st = tok && pos && slot ? MOEC_OK : MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int i = 0; st == MOEC_OK && i < o->n_batch; i++) {
        int B = o->batch[i];
        if (B < 1 || B > rt_cuda_max_tokens(g.cuda)) {
            st = MOEC_ERR(MOEC_ERR_INVALID_ARG, "batch size %d is outside 1..%d", B,
                          rt_cuda_max_tokens(g.cuda));
            break;
        }
        for (int b = 0; b < B; b++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            tok[b] = (int32_t)((rng >> 33) % (uint64_t)vocab);
            pos[b] = out->context;
            slot[b] = b;
        }
        moec_bench_row *row = &out->rows[out->n_rows];
        st = time_modes(&g, B, tok, pos, slot, o, row);
        if (st == MOEC_OK)
            st = step_bytes(&g, B, out->context, tok, pos, slot, row);
        if (st == MOEC_OK && o->profile)
            st = profile(&g, B, tok, pos, slot, o->steps < 20 ? o->steps : 20, o->profile);
        if (st != MOEC_OK)
            break;
        row->batch = B;
        row->floor_ms = row->bytes / bw * 1e3;
        out->launches_per_step[out->n_rows] = launches(ir_plan_bucket_for(g.plan, B));
        out->n_rows++;
    }
    free(tok);
    free(pos);
    free(slot);
    moec_cuda_model_free(&g);
    return st;
}
