/* bf16_trace.c — where a bf16 GPU run loses precision, op by op: the tiny
 * model's compiled module runs on the GPU in bf16 (eager, one step at a
 * time up to each op: rt_cuda_run_until, rt_cuda_read_value) and on the CPU
 * twice, in fp32 (the reference) and with every result rounded to bf16
 * where the GPU stores it (rt_interp_round_storage: what storage precision
 * alone costs). For each op it prints the error of the GPU's result and of
 * the rounded CPU's against the fp32 one (max |x - ref| over max |ref|,
 * worst over the prefill and the teacher-forced decode steps of the
 * golden); an op whose GPU error jumps above the rounded CPU's is where a
 * kernel loses more than storage does. i32 results (top-k ids) count
 * entries that differ. Last, the worst logits row error of each (relative
 * to the row's largest logit, as the tests measure) and the rows whose
 * argmax moved. A diagnostic, run on the GPU machine:
 *
 *   build/tests/bf16_trace tests/data/deepseek_v3 [DECODE_STEPS]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/api_internal.h"
#include "err.h"
#include "runtime/cuda_rt.h"
#include "runtime/interp.h"
#include "runtime/weights.h"
#include "testlib.h"

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

typedef struct op_err {
    double gpu, emu;
    long gpu_ids, emu_ids; /* i32 results: entries that differ */
} op_err;

/* Error of got against ref over n floats: max |got - ref| / max |ref|. */
static double rel_err(const float *got, const float *ref, size_t n)
{
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]);
        d = isnan(e) ? INFINITY : fmax(d, e);
        m = fmax(m, fabs((double)ref[i]));
    }
    return m > 0 ? d / m : d;
}

/* Reads op's result i (n rows) from the GPU into f (floats, or the i32 ids
 * cast to float). */
static moec_status read_gpu(rt_cuda *c, const ir_module *m, ir_dtype cdt, const ir_value *v, int n,
                            float *f, void *raw, size_t cap)
{
    size_t w = (size_t)ir_type_numel(&v->type, 1) * (size_t)n;
    MOEC_TRY(rt_cuda_read_value(c, n, v, raw, cap));
    ir_dtype dt = ir_value_storage_dtype(m, v, cdt);
    for (size_t i = 0; i < w; i++)
        f[i] = dt == IR_DTYPE_BF16  ? bf16_to_f32(((const uint16_t *)raw)[i])
               : dt == IR_DTYPE_I32 ? (float)((const int32_t *)raw)[i]
                                    : ((const float *)raw)[i];
    return MOEC_OK;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bf16_trace MODEL_DIR [DECODE_STEPS]\n");
        return 2;
    }
    const char *dir = argv[1];
    int steps = argc > 2 ? atoi(argv[2]) : 4;
    t_golden gd;
    if (!t_golden_read(dir, &gd)) {
        fprintf(stderr, "bf16_trace: %s has no readable golden.json + logits.bin\n", dir);
        return 1;
    }
    const int32_t *ids = gd.ids;
    int P = gd.P, n_ids = gd.n_ids;
    int32_t pos[2 * T_GOLDEN_IDS], slot[2 * T_GOLDEN_IDS];
    if (steps > n_ids - P)
        steps = n_ids - P;
    for (int i = 0; i < n_ids; i++) {
        pos[i] = i;
        slot[i] = 0;
    }

    moec_model_t *model = NULL;
    moec_cuda_model x;
    memset(&x, 0, sizeof x);
    rt_weights *w = NULL;
    rt_interp *ref = NULL, *emu = NULL;
    moec_cuda_opts o = {.max_seqs = 1, .max_seq_len = 256, .eager = 1};
    moec_status st = moec_model_open(dir, &model);
    if (st == MOEC_OK)
        st = moec_cuda_model_init(model, dir, IR_DTYPE_BF16, &o, &x);
    if (st == MOEC_OK)
        st = rt_weights_open(x.fused, dir, &w);
    if (st == MOEC_OK)
        st = rt_interp_init(x.fused, w, 256, &ref);
    if (st == MOEC_OK)
        st = rt_interp_init(x.fused, w, 256, &emu);
    if (st == MOEC_OK)
        st = rt_interp_round_storage(emu, IR_DTYPE_BF16, 0);
    if (st != MOEC_OK) {
        fprintf(stderr, "bf16_trace: %s\n", moec_last_error());
        return 1;
    }
    const ir_module *m = x.fused;
    op_err *err = calloc((size_t)m->n_ops, sizeof *err);
    size_t cap = 0;
    for (int i = 0; i < m->n_values; i++)
        if (m->values[i]->kind != IR_VALUE_WEIGHT) {
            size_t b = (size_t)ir_type_numel(&m->values[i]->type, 1) * 4 * (size_t)P;
            cap = b > cap ? b : cap;
        }
    float *gf = malloc(cap), *ef = malloc(cap), *rf = malloc(cap);
    const ir_value *outv = m->outputs[0];
    int V = (int)ir_type_numel(&outv->type, 1);
    double row_gpu = 0, row_emu = 0;
    int flips_gpu = 0, flips_emu = 0, n_rows = 0;
    void *raw = malloc(cap);
    /* the prefill, then each teacher-forced decode token */
    for (int s = 0; s <= steps && st == MOEC_OK; s++) {
        int first = s == 0 ? 0 : P + s - 1, n = s == 0 ? P : 1;
        st = rt_interp_forward(ref, ids + first, pos + first, n, NULL);
        if (st == MOEC_OK)
            st = rt_interp_forward(emu, ids + first, pos + first, n, NULL);
        for (int k = 0; k < m->n_ops && st == MOEC_OK; k++) {
            const ir_op *op = m->ops[k];
            const ir_value *v = op->out[0];
            if (v->mem_offset < 0 || op->kind == IR_OP_FORK || op->kind == IR_OP_JOIN)
                continue;
            st = rt_cuda_run_until(x.cuda, n, ids + first, pos + first, slot, op->id + 1);
            if (st == MOEC_OK)
                st = read_gpu(x.cuda, m, IR_DTYPE_BF16, v, n, gf, raw, cap);
            if (st != MOEC_OK)
                break;
            size_t nel = (size_t)ir_type_numel(&v->type, 1) * (size_t)n;
            const float *r = rt_interp_value(ref, v), *e = rt_interp_value(emu, v);
            if (v->type.dtype == IR_DTYPE_I32) {
                for (size_t i = 0; i < nel; i++) {
                    err[k].gpu_ids += (int32_t)gf[i] != ((const int32_t *)(const void *)r)[i];
                    err[k].emu_ids += ((const int32_t *)(const void *)e)[i] !=
                                      ((const int32_t *)(const void *)r)[i];
                }
                continue;
            }
            memcpy(rf, r, nel * 4);
            memcpy(ef, e, nel * 4);
            if (v == outv)
                for (int t = 0; t < n; t++) {
                    const float *rr = rf + (size_t)t * V;
                    row_gpu = fmax(row_gpu, t_row_error(gf + (size_t)t * V, rr, V));
                    row_emu = fmax(row_emu, t_row_error(ef + (size_t)t * V, rr, V));
                    flips_gpu += t_argmax(gf + (size_t)t * V, V) != t_argmax(rr, V);
                    flips_emu += t_argmax(ef + (size_t)t * V, V) != t_argmax(rr, V);
                    n_rows++;
                }
            err[k].gpu = fmax(err[k].gpu, rel_err(gf, rf, nel));
            err[k].emu = fmax(err[k].emu, rel_err(ef, rf, nel));
        }
        /* the whole step, so that every cache holds this step's rows */
        if (st == MOEC_OK)
            st = rt_cuda_step(x.cuda, n, ids + first, pos + first, slot, NULL, NULL);
    }
    if (st != MOEC_OK)
        fprintf(stderr, "bf16_trace: %s\n", moec_last_error());
    printf("%s: bf16 error per op against the fp32 CPU, prefill of %d + %d decode steps\n", dir,
           P, steps);
    printf("%-5s %-16s %-28s %12s %12s %8s\n", "op", "kind", "result", "gpu", "cpu-rounded",
           "ratio");
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        const ir_value *v = op->out[0];
        if (v->mem_offset < 0 || op->kind == IR_OP_FORK || op->kind == IR_OP_JOIN)
            continue;
        if (v->type.dtype == IR_DTYPE_I32)
            printf("%-5d %-16s %-28s %12ld %12ld   (ids differing)\n", k, ir_op_name(op->kind),
                   v->name, err[k].gpu_ids, err[k].emu_ids);
        else
            printf("%-5d %-16s %-28s %12.3g %12.3g %8.2f\n", k, ir_op_name(op->kind), v->name,
                   err[k].gpu, err[k].emu, err[k].emu > 0 ? err[k].gpu / err[k].emu : 0.0);
    }
    printf("%s: logits rows %d: worst row error gpu %.4g (argmax flips %d), cpu-rounded %.4g "
           "(flips %d)\n",
           dir, n_rows, row_gpu, flips_gpu, row_emu, flips_emu);
    free(gf);
    free(ef);
    free(rf);
    free(raw);
    free(err);
    rt_interp_free(ref);
    rt_interp_free(emu);
    rt_weights_free(w);
    moec_cuda_model_free(&x);
    moec_model_free(model);
    t_golden_free(&gd);
    return st == MOEC_OK ? 0 : 1;
}
