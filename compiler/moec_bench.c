/* moec_bench.c — the decode benchmark behind `moec bench` (moec.h): time
 * per step next to its memory floor, the bytes the step cannot avoid
 * reading over the bandwidth the device shows for a plain copy. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compiler/api_internal.h"
#include "err.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double storage_bytes(const ir_module *m, const ir_value *v, ir_dtype compute)
{
    return (double)ir_type_numel(&v->type, 0) *
           (double)ir_dtype_size(rt_value_storage_dtype(m, v, compute));
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
            bytes += per_token * (double)B * (double)(context + 1);
        }
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

moec_status moec_bench(const moec_model_t *model, const char *weights_dir,
                       const moec_bench_options *o, moec_bench_result *out)
{
    if (!model || !weights_dir || !o || !out || o->n_batch < 1 || o->n_batch > 16 ||
        o->context < 0 || o->steps < 1 || o->warmup < 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_bench: bad options");
    memset(out, 0, sizeof *out);
    int max_b = 0;
    for (int i = 0; i < o->n_batch; i++)
        max_b = o->batch[i] > max_b ? o->batch[i] : max_b;
    int max_pos = moec_model_max_positions(model);
    if (max_pos > 0 && o->context + 1 > max_pos)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "context %d exceeds max_position_embeddings %d",
                        o->context, max_pos);
    int n_dev = 0;
    MOEC_TRY(moec_cuda_device_count(&n_dev));
    ir_dtype dt = IR_DTYPE_BF16;
    MOEC_TRY(moec_cuda_dtype(&dt));
    double bw = 0;
    MOEC_TRY(rt_cuda_copy_bandwidth((size_t)1 << 30, 20, &bw));
    out->copy_bytes_per_s = bw;
    double t0 = now_s();
    moec_cuda_model g;
    MOEC_TRY(moec_cuda_model_init(model, weights_dir, dt, max_b, o->context + 1, &g));
    out->setup_s = now_s() - t0;
    snprintf(out->device, sizeof out->device, "%s", rt_cuda_device_name(g.cuda));
    int vocab = moec_model_vocab_size(model);
    int32_t *tok = malloc((size_t)max_b * sizeof *tok), *pos = malloc((size_t)max_b * sizeof *pos),
            *slot = malloc((size_t)max_b * sizeof *slot);
    moec_status st = tok && pos && slot ? MOEC_OK : MOEC_ERR(MOEC_ERR_OOM, "out of memory");
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
            pos[b] = o->context;
            slot[b] = b;
        }
        moec_bench_row *row = &out->rows[out->n_rows];
        float ms = 0;
        st = rt_cuda_time_steps(g.cuda, B, tok, pos, slot, o->warmup, o->steps, &ms);
        if (st == MOEC_OK)
            st = step_bytes(&g, B, o->context, tok, pos, slot, row);
        if (st != MOEC_OK)
            break;
        row->batch = B;
        row->step_ms = ms;
        row->floor_ms = row->bytes / bw * 1e3;
        out->n_rows++;
    }
    free(tok);
    free(pos);
    free(slot);
    moec_cuda_model_free(&g);
    return st;
}
