/* moec_dump.c — the public IR dumps: the module after any pass of the
 * pipeline, or after every pass into a folder, one file per pass with a
 * header naming it (moec dump-ir --after). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "compiler/api_internal.h"
#include "compiler/passes.h"
#include "err.h"

static moec_status dump_options(const moec_model_t *model, const char *dtype,
                                const moec_parallel *par, pass_options *opt)
{
    pass_options_default(opt);
    if (par) {
        MOEC_TRY(moec_parallel_check(par));
        opt->tp = par->tp;
        opt->ep = par->ep;
        opt->ep_combine = par->ep_combine;
        opt->rank = par->rank;
        opt->source = moec_model_module(model);
    }
    if (!dtype || !strcmp(dtype, "bf16"))
        opt->compute_dtype = IR_DTYPE_BF16;
    else if (!strcmp(dtype, "fp16"))
        opt->compute_dtype = IR_DTYPE_F16;
    else if (!strcmp(dtype, "fp32"))
        opt->compute_dtype = IR_DTYPE_F32;
    else
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "unknown dtype '%s' (bf16, fp16 or fp32)", dtype);
    return MOEC_OK;
}

static const char *repro_dir(void)
{
    const char *t = getenv("TMPDIR");
    return t && *t ? t : "/tmp";
}

moec_status moec_model_dump_ir_after(const moec_model_t *model, const char *pass,
                                     const char *dtype, FILE *out)
{
    return moec_model_dump_ir_rank(model, pass, dtype, NULL, out);
}

moec_status moec_model_dump_ir_rank(const moec_model_t *model, const char *pass,
                                    const char *dtype, const moec_parallel *par, FILE *out)
{
    if (par && !pass)
        pass = "shard";
    if (!model || !pass || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_model_dump_ir_after: NULL argument");
    pass_options opt;
    MOEC_TRY(dump_options(model, dtype, par, &opt));
    ir_module *m = NULL;
    MOEC_TRY(ir_module_clone(moec_model_module(model), &m));
    moec_status st = pass_run_pipeline(m, &opt, pass, NULL, NULL, repro_dir());
    if (st == MOEC_OK) {
        fprintf(out, "# after pass %s\n", pass);
        st = ir_module_print(m, out);
    }
    ir_module_free(m);
    return st;
}

typedef struct dump_dir {
    const char *dir;
} dump_dir;

static moec_status write_dump(const ir_module *m, const char *dir, int index, const char *name,
                              const char *what)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%02d_%s.mir", dir, index, name);
    FILE *f = fopen(path, "w");
    if (!f)
        return MOEC_ERR(MOEC_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    fprintf(f, "# after pass %s: %s\n", name, what);
    moec_status st = ir_module_print(m, f);
    if (fclose(f) != 0 && st == MOEC_OK)
        st = MOEC_ERR(MOEC_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    return st;
}

static moec_status observe_pass(const ir_module *m, const pass_info *p, int index, void *user)
{
    return write_dump(m, ((dump_dir *)user)->dir, index + 1, p->name, p->what);
}

moec_status moec_model_dump_passes(const moec_model_t *model, const char *dtype, const char *dir)
{
    return moec_model_dump_passes_rank(model, dtype, NULL, dir);
}

moec_status moec_model_dump_passes_rank(const moec_model_t *model, const char *dtype,
                                        const moec_parallel *par, const char *dir)
{
    if (!model || !dir)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_model_dump_passes: NULL argument");
    pass_options opt;
    MOEC_TRY(dump_options(model, dtype, par, &opt));
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return MOEC_ERR(MOEC_ERR_IO, "cannot create %s: %s", dir, strerror(errno));
    ir_module *m = NULL;
    MOEC_TRY(ir_module_clone(moec_model_module(model), &m));
    moec_status st = write_dump(m, dir, 0, "frontend", "the unfused module, one op per reference module");
    dump_dir d = {dir};
    if (st == MOEC_OK)
        st = pass_run_pipeline(m, &opt, NULL, observe_pass, &d, dir);
    ir_module_free(m);
    return st;
}

moec_status moec_parallel_check(const moec_parallel *par)
{
    if (!par)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_parallel_check: NULL argument");
    if (par->ep_combine != MOEC_EP_COMBINE_ALL_REDUCE &&
        par->ep_combine != MOEC_EP_COMBINE_REDUCE_SCATTER)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "ep_combine %d is neither all-reduce (%d) nor "
                        "reduce-scatter (%d)", par->ep_combine, MOEC_EP_COMBINE_ALL_REDUCE,
                        MOEC_EP_COMBINE_REDUCE_SCATTER);
    if (par->tp == 0 && par->ep_combine)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "the MoE combine (reduce-scatter) needs tp (the ranks the model is split "
                        "over)");
    if (par->tp == 0) {
        if (par->ep > 1 || par->rank)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "ep %d and rank %d need tp (the ranks the model is split over)",
                            par->ep, par->rank);
        return MOEC_OK;
    }
    return pass_shard_check(par->tp, par->ep ? par->ep : 1, par->rank);
}

int moec_pass_count(void)
{
    int n;
    pass_pipeline(&n);
    return n;
}

const char *moec_pass_name(int i)
{
    int n;
    const pass_info *p = pass_pipeline(&n);
    return i >= 0 && i < n ? p[i].name : NULL;
}

const char *moec_pass_description(int i)
{
    int n;
    const pass_info *p = pass_pipeline(&n);
    return i >= 0 && i < n ? p[i].what : NULL;
}
