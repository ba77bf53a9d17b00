/* bf16_probe.c — what storing activations in bf16 costs, op kind by op kind,
 * on the CPU: the interpreter with rt_interp_round_storage (each op's result
 * rounded to bf16 where the GPU stores it so) on a tiny model of tests/data,
 * teacher-forced on the golden's greedy tokens, against the fp32 golden.
 * Prints the worst row error (relative to the row's largest logit, as the
 * tests measure) of the unfused module (the structure transformers runs)
 * and of the compiled one, then of the compiled one with each op kind's
 * results left in fp32 in turn: the kind whose rounding costs the most shows
 * as the largest drop. A diagnostic, not a test:
 *
 *   build/bf16_probe tests/data/deepseek_v3 [--kinds]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/frontend.h"
#include "compiler/passes.h"
#include "runtime/interp.h"
#include "runtime/weights.h"
#include "testlib.h"

/* The worst row error of m run teacher-forced with its results rounded to
 * bf16 except op kinds in skip; *flips counts rows whose argmax differs. */
static double probe(const ir_module *m, const char *dir, const t_golden *g, uint64_t skip,
                    int *flips)
{
    rt_weights *w = NULL;
    rt_interp *in = NULL;
    float *got = malloc((size_t)g->P * (size_t)g->vocab * sizeof *got);
    double worst = -1;
    *flips = 0;
    if (!got || rt_weights_open(m, dir, &w) != MOEC_OK ||
        rt_interp_init(m, w, g->n_ids, &in) != MOEC_OK ||
        rt_interp_round_storage(in, IR_DTYPE_BF16, skip) != MOEC_OK)
        goto out;
    int32_t pos[2 * T_GOLDEN_IDS];
    for (int i = 0; i < g->n_ids; i++)
        pos[i] = i;
    if (rt_interp_forward(in, g->ids, pos, g->P, got) != MOEC_OK)
        goto out;
    worst = 0;
    for (int row = 0; row < g->rows; row++) {
        const float *have = got + (size_t)(row < g->P ? row : 0) * g->vocab;
        if (row >= g->P && rt_interp_forward(in, &g->ids[row], &pos[row], 1, got) != MOEC_OK) {
            worst = -1;
            goto out;
        }
        const float *want = g->logits + (size_t)row * g->vocab;
        worst = fmax(worst, t_row_error(have, want, g->vocab));
        *flips += t_argmax(have, g->vocab) != t_argmax(want, g->vocab);
    }
out:
    if (worst < 0)
        fprintf(stderr, "bf16_probe: %s\n", moec_last_error());
    rt_interp_free(in);
    rt_weights_free(w);
    free(got);
    return worst;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bf16_probe MODEL_DIR [--kinds]\n");
        return 2;
    }
    const char *dir = argv[1];
    int kinds = argc > 2 && strcmp(argv[2], "--kinds") == 0;
    t_golden g;
    if (!t_golden_read(dir, &g)) {
        fprintf(stderr, "bf16_probe: %s has no readable golden.json + logits.bin\n", dir);
        return 1;
    }
    ir_module *raw = NULL, *fused = NULL;
    if (fe_model_load(dir, &raw) != MOEC_OK || fe_model_load(dir, &fused) != MOEC_OK ||
        pass_run_pipeline(fused, NULL, NULL, NULL, NULL, NULL) != MOEC_OK) {
        fprintf(stderr, "bf16_probe: %s\n", moec_last_error());
        return 1;
    }
    int flips;
    double e = probe(raw, dir, &g, 0, &flips);
    printf("%-24s unfused  bf16 storage: worst row error %.4g, argmax flips %d/%d\n", dir, e,
           flips, g.rows);
    e = probe(fused, dir, &g, 0, &flips);
    printf("%-24s compiled bf16 storage: worst row error %.4g, argmax flips %d/%d\n", dir, e,
           flips, g.rows);
    for (int k = 0; kinds && k < IR_OP_COUNT; k++) {
        int present = 0;
        for (int i = 0; i < fused->n_ops; i++)
            present |= fused->ops[i]->kind == (ir_op_kind)k;
        if (!present)
            continue;
        e = probe(fused, dir, &g, 1ull << k, &flips);
        printf("  %-16s kept fp32: worst row error %.4g, argmax flips %d\n",
               ir_op_name((ir_op_kind)k), e, flips);
    }
    ir_module_free(raw);
    ir_module_free(fused);
    t_golden_free(&g);
    return 0;
}
