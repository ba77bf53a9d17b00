/* test_scratch.c — a bucket's scratch is that of its largest op (per
 * stream), not the sum over layers: scratch lives only during its op's
 * steps. Checked on the DeepSeek-V2-Lite shape cut to 2 and 4 layers. */
#include <string.h>

#include "codegen/cg.h"
#include "compiler/frontend.h"
#include "compiler/passes.h"
#include "testlib.h"

static size_t scratch_of(const char *json, int layers, const char *cache)
{
    char *text = strdup(json), *at = strstr(text, "\"num_hidden_layers\": 27");
    T_CHECK(at != NULL);
    if (!at) {
        free(text);
        return 0;
    }
    char repl[32];
    snprintf(repl, sizeof repl, "\"num_hidden_layers\":%3d", layers);
    memcpy(at, repl, strlen(repl));
    ir_module *m = NULL;
    ir_plan *p = NULL;
    size_t bytes = 0;
    T_OK(fe_config_build(text, "deepseek_v2_lite.json", &m));
    if (m)
        T_OK(pass_run_pipeline(m, NULL, NULL, NULL, NULL, NULL));
    cg_options o;
    cg_options_default(&o);
    o.n_buckets = 1;
    o.buckets[0] = 64;
    o.cache_dir = cache;
    if (m && cg_plan_build(m, &o, &p) == MOEC_OK) {
        bytes = p->buckets[0].scratch_bytes;
        for (int s = 0; s < p->buckets[0].n_steps; s++)
            for (int a = 0; a < p->buckets[0].steps[s].n_args; a++)
                if (p->buckets[0].steps[s].args[a].kind == IR_ARG_SCRATCH)
                    T_CHECK((size_t)p->buckets[0].steps[s].args[a].i < bytes);
    } else {
        fprintf(stderr, "%s\n", moec_last_error());
        T_CHECK(!"plan build failed");
    }
    ir_plan_free(p);
    ir_module_free(m);
    free(text);
    return bytes;
}

int main(void)
{
    char *json = t_read_file(t_src("tests/data/configs/deepseek_v2_lite.json"), NULL);
    const char *cache = t_tmpdir("scratch");
    size_t two = scratch_of(json, 2, cache), four = scratch_of(json, 4, cache);
    printf("scratch at T=64: %zu bytes with 2 layers, %zu with 4\n", two, four);
    T_CHECK(two > 0 && two == four);
    free(json);
    return t_finish("test_scratch");
}
