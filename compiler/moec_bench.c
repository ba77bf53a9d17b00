/* moec_bench.c — the decode benchmark behind `moec bench` (moec.h): time
 * per step next to its memory floor, the bytes the step cannot avoid
 * reading over the bandwidth the device shows for a plain copy.
 *
 * A split (--tp, docs/PARALLEL.md) is benched as a session runs it: every
 * rank does each part at once on its thread (capture, timed steps, the
 * floor's partial runs, profiles), its collectives meeting the others';
 * a step takes as long as its slowest rank, and each rank's floor is what
 * that rank reads. */
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
        /* a split's rank holds experts e0 .. e0 + E - 1 of the ids the router gives */
        int E = (int)op->in[op->n_in - 1]->type.dims[0], K = (int)ids->type.dims[1];
        int64_t e0 = ir_op_attr_int(op, "expert_start", 0);
        int32_t *buf = malloc((size_t)B * (size_t)K * sizeof *buf);
        char *hit = calloc((size_t)E, 1);
        moec_status st = buf && hit ? rt_cuda_run_until(g->cuda, B, tok, pos, slot, op->id)
                                    : MOEC_ERR(MOEC_ERR_OOM, "out of memory");
        if (st == MOEC_OK)
            st = rt_cuda_read_value(g->cuda, B, ids, buf, (size_t)B * (size_t)K * sizeof *buf);
        int n_hit = 0;
        for (int k = 0; st == MOEC_OK && k < B * K; k++) {
            int64_t e = (int64_t)buf[k] - e0;
            if (e >= 0 && e < E && !hit[e]) {
                hit[e] = 1;
                n_hit++;
            }
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

_Static_assert(MOEC_BENCH_MAX_RANKS == IR_MAX_RANKS, "a bench row reports on every rank");

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

/* Writes the launches of B tokens' step timed into ms (one per plan step)
 * summed by kernel (GEMMs by the op they implement, collectives by their
 * op), the largest first; *coll_ms gets the collectives' sum. */
static moec_status profile_print(const moec_cuda_model *g, int rank, int n_ranks, int B,
                                 const double *ms, FILE *out, double *coll_ms)
{
    const ir_bucket *b = ir_plan_bucket_for(g->plan, B);
    prof_entry *e = calloc((size_t)b->n_steps, sizeof *e);
    if (!e)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    int n = 0;
    double total = 0;
    *coll_ms = 0;
    for (int i = 0; i < b->n_steps; i++) {
        const ir_step *s = &b->steps[i];
        char name[160];
        if (s->kind == IR_STEP_KERNEL)
            snprintf(name, sizeof name, "%s", b->kernel_names[s->kernel]);
        else if (s->kind == IR_STEP_GEMM)
            snprintf(name, sizeof name, "cublasLt (%s)",
                     ir_op_name(g->fused->ops[s->op_id]->kind));
        else if (s->kind == IR_STEP_COLLECTIVE)
            snprintf(name, sizeof name, "collective %s (%s)", ir_op_name(s->coll.op),
                     ir_dtype_name(s->coll.dtype));
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
        if (s->kind == IR_STEP_COLLECTIVE)
            *coll_ms += ms[i];
    }
    qsort(e, (size_t)n, sizeof *e, cmp_prof);
    char who[32] = "";
    if (n_ranks > 1)
        snprintf(who, sizeof who, "rank %d of %d, ", rank, n_ranks);
    fprintf(out,
            "profile: %sbatch %d (bucket T=%d), %d launches, %.3f ms summed over launches, "
            "%.3f ms in collectives\n",
            who, B, b->T, launches(b), total, *coll_ms);
    fprintf(out, "%10s %6s %8s %10s  %s\n", "ms", "%", "count", "us/launch", "kernel");
    for (int k = 0; k < n; k++)
        fprintf(out, "%10.4f %6.1f %8d %10.2f  %s\n", e[k].ms, 100 * e[k].ms / total, e[k].count,
                1e3 * e[k].ms / e[k].count, e[k].name);
    free(e);
    return MOEC_OK;
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
    return MOEC_OK;
}

/* What every rank does at once, and what each found. */
typedef struct bench_job {
    const moec_bench_options *o;
    int n_ranks, B, context;
    const int32_t *tok, *pos, *slot;
    double capture_s[IR_MAX_RANKS][2]; /* [rank][single] */
    moec_bench_row row[IR_MAX_RANKS];
    char *prof[IR_MAX_RANKS];          /* per rank: its profile's text (malloc'd) */
    size_t prof_len[IR_MAX_RANKS];
} bench_job;

/* One rank's capture of every bucket's graph in both stream modes. */
static moec_status rank_capture(moec_cuda_model *m, int rank, void *user)
{
    bench_job *j = user;
    for (int single = 1; single >= 0; single--) {
        rt_cuda_set_single_stream(m->cuda, single);
        double t0 = moec_now_s();
        MOEC_TRY(graph_capture(m->graphs));
        j->capture_s[rank][single] = moec_now_s() - t0;
    }
    return MOEC_OK;
}

/* One rank's part of a batch size: its times in every mode, its bytes and,
 * when asked, its profile. */
static moec_status rank_measure(moec_cuda_model *m, int rank, void *user)
{
    bench_job *j = user;
    moec_bench_row *row = &j->row[rank];
    MOEC_TRY(time_modes(m, j->B, j->tok, j->pos, j->slot, j->o, row));
    MOEC_TRY(step_bytes(m, j->B, j->context, j->tok, j->pos, j->slot, row));
    row->coll_ms = -1;
    if (!j->o->profile)
        return MOEC_OK;
    /* written to memory here, printed in rank order once every rank is done */
    const ir_bucket *b = ir_plan_bucket_for(m->plan, j->B);
    double *ms = calloc((size_t)b->n_steps + 1, sizeof *ms);
    FILE *f = open_memstream(&j->prof[rank], &j->prof_len[rank]);
    moec_status st = ms && f ? MOEC_OK : MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    if (st == MOEC_OK)
        st = rt_cuda_profile_steps(m->cuda, j->B, j->tok, j->pos, j->slot,
                                   j->o->steps < 20 ? j->o->steps : 20, ms);
    if (st == MOEC_OK)
        st = profile_print(m, rank, j->n_ranks, j->B, ms, f, &row->coll_ms);
    if (f && fclose(f) != 0 && st == MOEC_OK)
        st = MOEC_ERR(MOEC_ERR_OOM, "out of memory for rank %d's profile", rank);
    free(ms);
    return st;
}

/* The ranks' parts of a batch size as one row: each mode as slow as its
 * slowest rank, the floor of the rank that reads the most. */
static void combine_ranks(const bench_job *j, int n, double bw, moec_bench_row *row)
{
    int most = 0;
    row->coll_ms = -1;
    for (int r = 0; r < n; r++) {
        const moec_bench_row *x = &j->row[r];
        if (x->bytes > j->row[most].bytes)
            most = r;
        for (int k = 0; k < MOEC_BENCH_MODES; k++) { /* -1: a rank had no graph */
            double a = row->mode_ms[k], b = x->mode_ms[k];
            row->mode_ms[k] = r == 0 ? b : a < 0 || b < 0 ? -1 : a > b ? a : b;
        }
        row->rank_ms[r] = x->mode_ms[MOEC_BENCH_GRAPH_DUAL] > 0 ? x->mode_ms[MOEC_BENCH_GRAPH_DUAL]
                                                                 : x->mode_ms[MOEC_BENCH_EAGER_DUAL];
        row->rank_bytes[r] = x->bytes;
        row->coll_ms = x->coll_ms > row->coll_ms ? x->coll_ms : row->coll_ms;
    }
    row->step_ms = row->mode_ms[MOEC_BENCH_GRAPH_DUAL] > 0 ? row->mode_ms[MOEC_BENCH_GRAPH_DUAL]
                                                            : row->mode_ms[MOEC_BENCH_EAGER_DUAL];
    row->bytes = j->row[most].bytes;
    row->experts_hit = j->row[most].experts_hit;
    row->experts_total = j->row[most].experts_total;
    row->floor_ms = row->bytes / bw * 1e3;
}

/* Binds the model (or the plan already read into g, which took read_s) for
 * B up to max_b and captures both stream modes' graphs on every rank
 * (unless MOEC_DISABLE_GRAPHS=1), timing each part. */
static moec_status bench_bind(const moec_model_t *model, const char *weights_dir,
                              const moec_bench_options *o, const ir_plan_meta *meta, int max_b,
                              double read_s, moec_cuda_model *g, int *vocab, bench_job *job,
                              moec_bench_result *out)
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
    MOEC_TRY(moec_cuda_model_each(g, rank_capture, job, "capturing the graphs"));
    for (int r = 0; r < moec_cuda_model_ranks(g); r++)
        for (int single = 0; single < 2; single++) {
            double *s = single ? &out->capture_single_s : &out->capture_s;
            *s = job->capture_s[r][single] > *s ? job->capture_s[r][single] : *s;
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

/* Everything before the device is looked for: the plan read (g->fused) and
 * checked against the split asked for, the context checked against the
 * model. */
static moec_status bench_prepare(const moec_model_t *model, const moec_bench_options *o,
                                 moec_cuda_model *g, ir_plan_meta *meta, moec_bench_result *out)
{
    int max_pos = 0;
    if (o->plan_path) {
        MOEC_TRY(moec_cuda_plan_read(o->plan_path, g, meta));
        MOEC_TRY(moec_plan_check_parallel(meta, o->par.tp ? &o->par : NULL, o->plan_path));
        out->tp = meta->tp;
        out->ep = meta->tp ? meta->ep : 1;
        max_pos = (int)ir_module_meta_int(g->fused, "max_position_embeddings", 0);
    } else {
        max_pos = moec_model_max_positions(model);
    }
    return bench_context(o, max_pos, out);
}

/* Per batch size: every rank's part at once, then the row. */
static moec_status bench_rows(moec_cuda_model *g, const moec_bench_options *o, int max_b,
                              int vocab, double bw, bench_job *job, moec_bench_result *out)
{
    int32_t *tok = malloc((size_t)max_b * sizeof *tok), *pos = malloc((size_t)max_b * sizeof *pos),
            *slot = malloc((size_t)max_b * sizeof *slot);
    moec_status st = tok && pos && slot ? MOEC_OK : MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    int n_ranks = moec_cuda_model_ranks(g);
    job->n_ranks = n_ranks;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int i = 0; st == MOEC_OK && i < o->n_batch; i++) {
        int B = o->batch[i];
        if (B < 1 || B > rt_cuda_max_tokens(g->cuda)) {
            st = MOEC_ERR(MOEC_ERR_INVALID_ARG, "batch size %d is outside 1..%d", B,
                          rt_cuda_max_tokens(g->cuda));
            break;
        }
        for (int b = 0; b < B; b++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            tok[b] = (int32_t)((rng >> 33) % (uint64_t)vocab);
            pos[b] = out->context;
            slot[b] = b;
        }
        job->B = B;
        job->tok = tok;
        job->pos = pos;
        job->slot = slot;
        char what[64];
        snprintf(what, sizeof what, "benchmarking batch %d", B);
        st = moec_cuda_model_each(g, rank_measure, job, what);
        moec_bench_row *row = &out->rows[out->n_rows];
        if (st == MOEC_OK)
            combine_ranks(job, n_ranks, bw, row);
        for (int r = 0; r < n_ranks; r++) {
            if (st == MOEC_OK && job->prof[r])
                fwrite(job->prof[r], 1, job->prof_len[r], o->profile);
            free(job->prof[r]);
            job->prof[r] = NULL;
        }
        if (st != MOEC_OK)
            break;
        row->batch = B;
        out->launches_per_step[out->n_rows] = launches(ir_plan_bucket_for(g->plan, B));
        out->n_rows++;
    }
    free(tok);
    free(pos);
    free(slot);
    return st;
}

static moec_status bench_run(const moec_model_t *model, const char *weights_dir,
                             const moec_bench_options *o, double compile_s,
                             moec_bench_result *out)
{
    int max_b = 0;
    for (int i = 0; i < o->n_batch; i++)
        max_b = o->batch[i] > max_b ? o->batch[i] : max_b;
    moec_cuda_model g;
    memset(&g, 0, sizeof g);
    ir_plan_meta meta;
    bench_job *job = calloc(1, sizeof *job);
    if (!job)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    job->o = o;
    double t0 = moec_now_s();
    moec_status st = bench_prepare(model, o, &g, &meta, out);
    double read_s = compile_s + moec_now_s() - t0;
    job->context = out->context;
    int n_dev = 0;
    if (st == MOEC_OK)
        st = moec_cuda_device_count(&n_dev);
    double bw = 0;
    if (st == MOEC_OK)
        st = rt_cuda_copy_bandwidth((size_t)1 << 30, 20, &bw);
    out->copy_bytes_per_s = bw;
    int vocab = 0;
    if (st == MOEC_OK)
        st = bench_bind(model, weights_dir, o, &meta, max_b, read_s, &g, &vocab, job, out);
    if (st == MOEC_OK) {
        snprintf(out->device, sizeof out->device, "%s", rt_cuda_device_name(g.cuda));
        st = bench_rows(&g, o, max_b, vocab, bw, job, out);
    }
    moec_cuda_model_free(&g);
    free(job);
    return st;
}

moec_status moec_bench(const moec_model_t *model, const char *weights_dir,
                       const moec_bench_options *o, moec_bench_result *out)
{
    /* each refusal names its argument or field: a caller (moec bench's
     * flags) can say which one is wrong */
    if (!o || !out || !weights_dir)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_bench: NULL %s",
                        !o ? "options" : !out ? "result" : "weights_dir");
    if (!model && !o->plan_path)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_bench: NULL model and no plan_path");
    if (o->n_batch < 1 || o->n_batch > 16)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_bench: n_batch must be from 1 to 16, got %d",
                        o->n_batch);
    if (o->steps < 1 || o->warmup < 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "moec_bench: steps must be at least 1 and warmup at least 0, got %d and "
                        "%d",
                        o->steps, o->warmup);
    memset(out, 0, sizeof *out);
    out->ep = 1;
    if (o->par.tp)
        MOEC_TRY(moec_parallel_check(&o->par));
    if (o->plan_path || !o->par.tp)
        return bench_run(model, weights_dir, o, 0, out);
    /* a model split: its context checked, then compiled into a scratch plan
     * (the GPUs counted first: no compile for a machine that cannot run it)
     * and benched as that plan is */
    MOEC_TRY(bench_context(o, moec_model_max_positions(model), out));
    ir_dtype dt = IR_DTYPE_BF16;
    MOEC_TRY(moec_cuda_dtype(&dt));
    char path[4096];
    double t0 = moec_now_s();
    MOEC_TRY(moec_compile_scratch(model, weights_dir, &o->par, dt, path, sizeof path));
    moec_bench_options split = *o;
    split.plan_path = path;
    moec_status st = bench_run(NULL, weights_dir, &split, moec_now_s() - t0, out);
    moec_compile_scratch_remove(path);
    return st;
}
