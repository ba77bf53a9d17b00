/* passlib.c — pass equivalence checks through the interpreter (passlib.h). */
#include "passlib.h"

#include <math.h>
#include <string.h>

#include "compiler/frontend.h"
#include "runtime/interp.h"
#include "runtime/weights.h"
#include "testlib.h"

/* 13 positions: past deepseek_v32's index_topk of 8, so that its sparse
 * attention selects, in the prefill and in decode steps. */
enum { PREFILL = 10, DECODE = 3 };

ir_module *t_pipeline_module(const char *model, const char *stop_after, const pass_options *opt)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/%s", model);
    ir_module *m = NULL;
    T_OK(fe_model_load(t_src(rel), &m));
    if (m)
        T_OK(pass_run_pipeline(m, opt, stop_after, NULL, NULL, NULL));
    return m;
}

/* Runs m over tokens (PREFILL, then DECODE single steps) into rows, every
 * result rounded to `round` (rt_interp_round_storage; F32: none). */
static int run_module(const char *dir, const ir_module *m, const int32_t *tokens, int vocab,
                      ir_dtype round, float *rows)
{
    rt_weights *w = NULL;
    rt_interp *in = NULL;
    int ok = 0;
    if (rt_weights_open(m, dir, &w) != MOEC_OK ||
        rt_interp_init(m, w, PREFILL + DECODE, &in) != MOEC_OK ||
        rt_interp_round_storage(in, round, 0) != MOEC_OK)
        goto out;
    int32_t pos[PREFILL];
    for (int i = 0; i < PREFILL; i++)
        pos[i] = i;
    if (rt_interp_forward(in, tokens, pos, PREFILL, rows) != MOEC_OK)
        goto out;
    for (int k = 0; k < DECODE; k++) {
        int32_t p = PREFILL + k;
        if (rt_interp_forward(in, tokens + PREFILL + k, &p, 1, rows + (size_t)(PREFILL + k) * vocab) != MOEC_OK)
            goto out;
    }
    ok = 1;
out:
    if (!ok)
        fprintf(stderr, "run failed: %s\n", moec_last_error());
    rt_interp_free(in);
    rt_weights_free(w);
    return ok;
}

double t_modules_agree(const char *model, const ir_module *a, const ir_module *b, uint64_t seed)
{
    return t_modules_agree_stored(model, a, b, seed, IR_DTYPE_F32);
}

double t_modules_agree_stored(const char *model, const ir_module *a, const ir_module *b,
                              uint64_t seed, ir_dtype round)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/%s", model);
    const char *dir = t_src(rel);
    int vocab = (int)ir_module_meta_int(a, "vocab_size", 0);
    int32_t tokens[PREFILL + DECODE];
    for (int i = 0; i < PREFILL + DECODE; i++)
        tokens[i] = (int32_t)(t_rand_u64(&seed) % (uint64_t)vocab);
    size_t n = (size_t)(PREFILL + DECODE) * (size_t)vocab;
    float *ra = malloc(n * sizeof *ra), *rb = malloc(n * sizeof *rb);
    double worst = -1;
    if (ra && rb && run_module(dir, a, tokens, vocab, round, ra) &&
        run_module(dir, b, tokens, vocab, round, rb)) {
        worst = 0;
        for (int r = 0; r < PREFILL + DECODE; r++) {
            double maxref = 0, maxdiff = 0;
            for (int v = 0; v < vocab; v++) {
                size_t i = (size_t)r * vocab + v;
                maxref = fmax(maxref, fabs(ra[i]));
                maxdiff = fmax(maxdiff, fabs((double)ra[i] - rb[i]));
            }
            worst = fmax(worst, maxdiff / (maxref > 0 ? maxref : 1));
        }
    }
    free(ra);
    free(rb);
    T_CHECK(worst >= 0);
    return worst;
}

double t_pass_equivalence(const char *model, const char *pass, const pass_options *opt)
{
    pass_options defaults;
    if (!opt) {
        pass_options_default(&defaults);
        opt = &defaults;
    }
    int n;
    const pass_info *pipe = pass_pipeline(&n);
    const pass_info *p = pass_find(pass);
    T_CHECK(p != NULL);
    if (!p)
        return -1;
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/%s", model);
    ir_module *m = NULL;
    T_OK(fe_model_load(t_src(rel), &m));
    if (!m)
        return -1;
    T_OK(ir_module_set_meta_str(m, "compute_dtype", ir_dtype_name(opt->compute_dtype)));
    for (int i = 0; i < n && &pipe[i] != p; i++) {
        T_OK(pipe[i].run(m, opt));
        T_OK(ir_module_verify(m));
    }
    ir_module *before = NULL;
    T_OK(ir_module_clone(m, &before));
    double worst = -1;
    moec_status st = p->run(m, opt);
    if (st == MOEC_OK)
        st = ir_module_verify(m);
    if (st != MOEC_OK) {
        fprintf(stderr, "%s on %s: %s\n", pass, model, moec_last_error());
        T_CHECK(st == MOEC_OK);
    } else if (before) {
        worst = t_modules_agree(model, before, m, 0x5eed);
        printf("%-20s %-18s max row error %.3g\n", pass, model, worst);
        T_CHECK(worst >= 0 && worst <= 1e-5);
    }
    ir_module_free(before);
    ir_module_free(m);
    return worst;
}

int t_pipeline_pair(const char *model, const char *before, const char *after,
                    const pass_options *opt, ir_module **b, ir_module **a)
{
    *b = t_pipeline_module(model, before, opt);
    *a = t_pipeline_module(model, after, opt);
    if (*b && *a)
        return 1;
    ir_module_free(*b);
    ir_module_free(*a);
    *b = *a = NULL;
    return 0;
}

int t_count_ops(const ir_module *m, ir_op_kind kind)
{
    int n = 0;
    for (int i = 0; i < m->n_ops; i++)
        n += m->ops[i]->kind == kind;
    return n;
}

pass_options t_pass_options(ir_dtype dt)
{
    pass_options o;
    pass_options_default(&o);
    o.compute_dtype = dt;
    return o;
}

void t_pass_idempotent(ir_module *m, pass_fn run)
{
    char *once = ir_module_print_str(m);
    T_OK(run(m, NULL));
    char *twice = ir_module_print_str(m);
    T_CHECK(once && twice && !strcmp(once, twice));
    free(once);
    free(twice);
}
