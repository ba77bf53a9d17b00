/* test_pass_manager.c — the pass driver: the pipeline is listed in order;
 * it stops after the pass asked for; an unknown pass is named; a pass that
 * fails, or leaves IR the verifier rejects, is named in the error and leaves
 * the IR it was given in a reproducer file that parses back. */
#include <string.h>

#include "common/err.h"
#include "compiler/frontend.h"
#include "compiler/passes.h"
#include "testlib.h"

static moec_status fail_pass(ir_module *m, const pass_options *opt)
{
    return MOEC_ERR(MOEC_ERR_INTERNAL, "deliberate failure");
}

/* Breaks the module: the first op's result gets a wrong shape. */
static moec_status corrupt_pass(ir_module *m, const pass_options *opt)
{
    m->ops[0]->out[0]->type.dims[1] += 1;
    return MOEC_OK;
}

static int seen;
static moec_status count_pass(const ir_module *m, const pass_info *p, int index, void *user)
{
    seen++;
    return MOEC_OK;
}

static void check_reproducer(const char *dir, const char *pass, const char *want_first_line)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/moec-repro-%s.mir", dir, pass);
    char *text = t_read_file(path, NULL);
    T_CHECK(!strncmp(text, want_first_line, strlen(want_first_line)));
    ir_module *back = NULL;
    T_OK(ir_module_parse(text, path, &back));
    ir_module_free(back);
    free(text);
}

int main(void)
{
    int n;
    const pass_info *pipe = pass_pipeline(&n);
    const char *order[] = {"fuse_qkv_a", "fuse_gate_up", "fuse_silu_and_mul", "fuse_router_weight",
                           "fold_routed_scale", "fuse_add_rms_norm", "absorb_mla", "shard",
                           "fuse_mla_prologue", "fuse_attn_prologue", "fuse_dsa_indexer",
                           "assign_streams", "fuse_add3_rms_norm", "fuse_moe_sum",
                           "fuse_silu_mul_linear", "plan_memory"};
    T_CHECK(n == 16);
    for (int i = 0; i < n && i < 16; i++)
        T_CHECK(!strcmp(pipe[i].name, order[i]) && pipe[i].what && *pipe[i].what);

    ir_module *m = NULL;
    T_OK(fe_model_load(t_src("tests/data/qwen2_moe"), &m));
    T_ERR(pass_run_pipeline(m, NULL, "fuse_all", NULL, NULL, NULL), MOEC_ERR_INVALID_ARG,
          "unknown pass 'fuse_all' (passes: fuse_qkv_a, fuse_gate_up");
    seen = 0;
    T_OK(pass_run_pipeline(m, NULL, "fuse_silu_and_mul", count_pass, NULL, NULL));
    T_CHECK(seen == 3);
    T_CHECK(!strcmp(ir_module_meta(m, "compute_dtype")->s, "bf16"));

    const char *dir = t_tmpdir("repro");
    pass_info failing[] = {{"fuse_qkv_a", pass_fuse_qkv_a, "x"}, {"explode", fail_pass, "fails"}};
    T_ERR(pass_run_passes(m, failing, 2, NULL, NULL, NULL, NULL, dir), MOEC_ERR_INTERNAL,
          "pass explode failed (its input IR is in ");
    T_CHECK(strstr(moec_last_error(), "deliberate failure") != NULL);
    check_reproducer(dir, "explode", "# moec reproducer: the IR given to pass explode");

    pass_info corrupting[] = {{"corrupt", corrupt_pass, "breaks shapes"}};
    T_ERR(pass_run_passes(m, corrupting, 1, NULL, NULL, NULL, NULL, dir), MOEC_ERR_INVALID_ARG,
          "pass corrupt failed");
    check_reproducer(dir, "corrupt", "# moec reproducer: the IR given to pass corrupt");
    /* Without a reproducer folder the error still names the pass. */
    T_ERR(pass_run_passes(m, failing + 1, 1, NULL, NULL, NULL, NULL, NULL), MOEC_ERR_INTERNAL,
          "pass explode failed: ");
    ir_module_free(m);
    return t_finish("test_pass_manager");
}
