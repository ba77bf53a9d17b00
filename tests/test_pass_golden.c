/* test_pass_golden.c — the IR text after every pass of the pipeline for two
 * tiny models (deepseek_v3: MLA with q LoRA, grouped sigmoid routing, shared
 * experts, routed scaling; deepseek_v32: V3 with the DSA indexer, and its
 * branch on the side stream) against golden files: a readable diff is the
 * review of any change to a pass. MOEC_UPDATE_GOLDEN=1 rewrites them. */
#include <string.h>

#include "compiler/frontend.h"
#include "compiler/passes.h"
#include "testlib.h"

typedef struct golden_ctx {
    int update;
    const char *model;
} golden_ctx;

static moec_status check_golden(const ir_module *m, const pass_info *p, int index, void *user)
{
    golden_ctx *g = user;
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/ir/passes/%s/%02d_%s.mir", g->model, index + 1, p->name);
    char *text = ir_module_print_str(m);
    T_CHECK(text != NULL);
    if (!text)
        return MOEC_OK;
    if (g->update) {
        t_write_file(t_src(rel), text, strlen(text));
    } else {
        char *want = t_read_file(t_src(rel), NULL);
        int same = !strcmp(want, text);
        T_CHECK(same);
        if (!same)
            fprintf(stderr, "IR after %s differs from %s (MOEC_UPDATE_GOLDEN=1 rewrites it)\n",
                    p->name, rel);
        free(want);
    }
    /* The text parses back to the same module. */
    ir_module *back = NULL;
    T_OK(ir_module_parse(text, rel, &back));
    if (back) {
        char *again = ir_module_print_str(back);
        T_CHECK(again && !strcmp(again, text));
        free(again);
    }
    ir_module_free(back);
    free(text);
    return MOEC_OK;
}

int main(void)
{
    static const char *const models[] = {"deepseek_v3", "deepseek_v32"};
    for (int i = 0; i < 2; i++) {
        golden_ctx g = {getenv("MOEC_UPDATE_GOLDEN") != NULL, models[i]};
        char rel[256];
        snprintf(rel, sizeof rel, "tests/data/%s", models[i]);
        ir_module *m = NULL;
        T_OK(fe_model_load(t_src(rel), &m));
        if (m)
            T_OK(pass_run_pipeline(m, NULL, NULL, check_golden, &g, NULL));
        ir_module_free(m);
    }
    return t_finish("test_pass_golden");
}
