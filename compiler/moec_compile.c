/* moec_compile.c — ahead-of-time compile (moec compile, moec.h): the pass
 * pipeline, code generation and NVRTC for every batch bucket, and the plan
 * file the runtime loads with no compiler call. The in-process CUDA path
 * (moec_cuda_model_init) goes through the same options and passes, so a
 * plan file and an in-process plan of the same model are the same plan. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compiler/api_internal.h"
#include "compiler/passes.h"
#include "err.h"
#include "file.h"
#include "runtime/plan_check.h"
#include "runtime/weights.h"

moec_status moec_cg_options(ir_dtype dt, const char *arch, cg_options *out)
{
    cg_options_default(out);
    out->compute_dtype = dt;
    const char *mk = getenv("MOEC_MOE_KERNEL");
    if (mk && *mk && strcmp(mk, "auto")) {
        if (!strcmp(mk, "simt"))
            out->moe_kernel = CG_MOE_SIMT;
        else if (!strcmp(mk, "mma"))
            out->moe_kernel = CG_MOE_MMA;
        else
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "MOEC_MOE_KERNEL='%s' is not auto, simt or mma",
                            mk);
    }
    const char *fk = getenv("MOEC_FP8_KERNEL");
    if (fk && *fk && strcmp(fk, "auto")) {
        if (!strcmp(fk, "old"))
            out->fp8_kernel = CG_FP8_OLD;
        else if (!strcmp(fk, "tc"))
            out->fp8_kernel = CG_FP8_TC;
        else
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "MOEC_FP8_KERNEL='%s' is not auto, old or tc",
                            fk);
    }
    if (!arch || !*arch)
        arch = getenv("MOEC_ARCH");
    if (!arch || !*arch)
        return MOEC_OK;
    if (strlen(arch) >= sizeof out->arch || strncmp(arch, "sm_", 3) ||
        !isdigit((unsigned char)arch[3]))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "target arch '%s' is not a GPU arch like sm_90",
                        arch);
    snprintf(out->arch, sizeof out->arch, "%s", arch);
    return MOEC_OK;
}

_Static_assert(MOEC_BUCKETS_MAX == IR_BUCKETS_MAX, "the public bucket bound is ir_plan.h's");

/* Layout name `name` as its IR_FP8_TILES_* mode: the experts' part (gate_up,
 * tiles, down, rows), with +linear IR_FP8_TILES_LINEAR too; -1 for any
 * other name. */
static int fp8_layout_mode(const char *name)
{
    static const struct {
        const char *name;
        int tiles;
    } experts[] = {{"gate_up", IR_FP8_TILES_GATE_UP},
                   {"tiles", IR_FP8_TILES_ALL},
                   {"down", IR_FP8_TILES_DOWN},
                   {"rows", IR_FP8_TILES_NONE}};
    const char *plus = strchr(name, '+');
    size_t len = plus ? (size_t)(plus - name) : strlen(name);
    if (plus && strcmp(plus, "+linear"))
        return -1;
    for (size_t k = 0; k < sizeof experts / sizeof experts[0]; k++)
        if (strlen(experts[k].name) == len && !strncmp(name, experts[k].name, len))
            return experts[k].tiles | (plus ? IR_FP8_TILES_LINEAR : 0);
    return -1;
}

moec_status moec_fp8_layout_check(const char *layout)
{
    if (!layout)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_fp8_layout_check: NULL layout");
    if (fp8_layout_mode(layout) < 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "fp8 layout '%s' is not gate_up, tiles, down or rows, alone or with "
                        "+linear",
                        layout);
    return MOEC_OK;
}

moec_status moec_buckets_check(const int *buckets, int n)
{
    if (!buckets)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_buckets_check: NULL buckets");
    return ir_buckets_check(buckets, n);
}

int moec_buckets_default(int out[MOEC_BUCKETS_MAX]) { return ir_buckets_default(out); }

moec_status moec_fuse(const ir_module *module, const cg_options *co, ir_module **fused)
{
    return moec_fuse_rank(module, co, NULL, 0, fused);
}

moec_status moec_fuse_rank(const ir_module *module, const cg_options *co,
                           const moec_parallel *par, int rank, ir_module **fused)
{
    *fused = NULL;
    pass_options po;
    pass_options_default(&po);
    po.compute_dtype = co->compute_dtype;
    po.n_buckets = co->n_buckets;
    memcpy(po.buckets, co->buckets, sizeof po.buckets);
    if (par) {
        po.tp = par->tp;
        po.ep = par->ep;
        po.ep_combine = par->ep_combine;
        po.rank = rank;
        po.source = module;
    }
    const char *tmp = getenv("TMPDIR");
    ir_module *m = NULL;
    MOEC_TRY(ir_module_clone(module, &m));
    moec_status st = pass_run_pipeline(m, &po, NULL, NULL, NULL, tmp && *tmp ? tmp : "/tmp");
    /* Plans name values and ops by index. A plan file carries the module as
     * text, which parses back with values in printed order (inputs, weights,
     * results), while passes append new values at the end: so the plan is
     * built over the module as it reads back from its text. */
    ir_module *canonical = NULL;
    if (st == MOEC_OK)
        st = ir_module_clone(m, &canonical);
    ir_module_free(m);
    if (st != MOEC_OK)
        return st;
    *fused = canonical;
    return MOEC_OK;
}

/* The options of moec_compile as code generation options. */
static moec_status compile_options(const moec_compile_options *o, cg_options *co)
{
    MOEC_TRY(moec_parallel_check(&o->par));
    ir_dtype dt;
    if (!o->dtype || !strcmp(o->dtype, "bf16"))
        dt = IR_DTYPE_BF16;
    else if (!strcmp(o->dtype, "fp32"))
        dt = IR_DTYPE_F32;
    else
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "compute dtype '%s' is not bf16 or fp32 (the CUDA runtime computes in "
                        "those)",
                        o->dtype);
    MOEC_TRY(moec_cg_options(dt, o->arch, co));
    if (o->n_buckets) {
        MOEC_TRY(ir_buckets_check(o->buckets, o->n_buckets));
        co->n_buckets = o->n_buckets;
        memcpy(co->buckets, o->buckets, (size_t)o->n_buckets * sizeof *o->buckets);
    }
    if (o->fp8_layout) {
        MOEC_TRY(moec_fp8_layout_check(o->fp8_layout));
        co->fp8_tiles = fp8_layout_mode(o->fp8_layout);
    }
    co->cache_dir = o->cache_dir;
    co->progress = o->progress;
    co->progress_user = o->progress_user;
    return MOEC_OK;
}

/* The plan file's path checked before the long part (passes, NVRTC): not a
 * directory, not one of the checkpoint's files (the rename would replace
 * it), in a directory that exists and can be written (the plan goes there
 * through a temporary file renamed into place). */
static moec_status check_out_path(const char *path, const char *weights_dir)
{
    struct stat sb;
    if (!*path) /* its folder would be ".": the write fails only after the compile */
        return MOEC_ERR(MOEC_ERR_IO, "cannot write the plan: its file name is empty");
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return MOEC_ERR(MOEC_ERR_IO,
                        "cannot write the plan %s: it is a directory (name a file, such as "
                        "%s/model.moec)",
                        path, path);
    char name[256]; /* a symbolic link is replaced by the rename, not written through */
    if (lstat(path, &sb) == 0 && !S_ISLNK(sb.st_mode) &&
        moec_path_in_folder(path, weights_dir, name, sizeof name))
        return MOEC_ERR(MOEC_ERR_IO,
                        "cannot write the plan %s: it is %s/%s, a file of the checkpoint it is "
                        "compiled from",
                        path, weights_dir, name);
    char dir[4096];
    moec_path_parent(path, dir, sizeof dir);
    if (stat(dir, &sb) != 0)
        return MOEC_ERR(MOEC_ERR_IO, "cannot write the plan %s: directory %s: %s", path, dir,
                        strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return MOEC_ERR(MOEC_ERR_IO, "cannot write the plan %s: %s is not a directory", path, dir);
    if (access(dir, W_OK) != 0)
        return MOEC_ERR(MOEC_ERR_IO, "cannot write the plan %s: directory %s is not writable: %s",
                        path, dir, strerror(errno));
    return MOEC_OK;
}

/* 1 when paths a and b, neither of which need exist, name the same entry:
 * the same last name (trailing slashes aside) in the same folder. */
static int same_entry(const char *a, const char *b)
{
    char pa[4096], pb[4096];
    size_t na = strlen(a), nb = strlen(b);
    while (na > 1 && a[na - 1] == '/')
        na--;
    while (nb > 1 && b[nb - 1] == '/')
        nb--;
    snprintf(pa, sizeof pa, "%.*s", (int)na, a);
    snprintf(pb, sizeof pb, "%.*s", (int)nb, b);
    const char *ba = strrchr(pa, '/'), *bb = strrchr(pb, '/');
    if (strcmp(ba ? ba + 1 : pa, bb ? bb + 1 : pb))
        return 0;
    char da[4096], db[4096];
    struct stat sa, sb;
    moec_path_parent(pa, da, sizeof da);
    moec_path_parent(pb, db, sizeof db);
    return stat(da, &sa) == 0 && stat(db, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* --quantize: the checkpoint quantized into its new folder, then the plan
 * compiled for that folder as for any fp8 checkpoint. */
static moec_status compile_quantized(const moec_model_t *model, const char *weights_dir,
                                     const moec_compile_options *opt, const char *out_path)
{
    if (strcmp(opt->quantize, "fp8"))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "quantize '%s' is not supported: moec writes block-scaled fp8 (fp8)",
                        opt->quantize);
    if (!opt->quantized_dir || !*opt->quantized_dir)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "quantize fp8 needs quantized_dir, the folder of the fp8 checkpoint");
    if (same_entry(out_path, opt->quantized_dir)) /* found now, not after the quantization */
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "cannot write the plan %s: it is where the fp8 checkpoint %s goes (name "
                        "another file or folder)",
                        out_path, opt->quantized_dir);
    MOEC_TRY(moec_quantize_fp8(model, weights_dir, opt->quantized_dir, NULL));
    moec_model_t *qm = NULL;
    MOEC_TRY(moec_model_open(opt->quantized_dir, &qm));
    moec_compile_options o = *opt;
    o.quantize = NULL;
    moec_status st = moec_compile(qm, opt->quantized_dir, &o, out_path);
    moec_model_free(qm);
    return st;
}

moec_status moec_compile(const moec_model_t *model, const char *weights_dir,
                         const moec_compile_options *opt, const char *out_path)
{
    if (!model || !weights_dir || !out_path)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_compile: NULL argument");
    moec_compile_options defaults;
    if (!opt) {
        memset(&defaults, 0, sizeof defaults);
        opt = &defaults;
    }
    cg_options co;
    MOEC_TRY(compile_options(opt, &co));
    MOEC_TRY(check_out_path(out_path, weights_dir));
    if (opt->quantize)
        return compile_quantized(model, weights_dir, opt, out_path);
    /* one plan per rank of the split (one when unsharded), in one file */
    const moec_parallel *par = opt->par.tp ? &opt->par : NULL;
    int n = par ? par->tp : 1;
    ir_module *fused[IR_MAX_RANKS] = {0};
    ir_plan *plans[IR_MAX_RANKS] = {0};
    ir_plan_meta meta;
    memset(&meta, 0, sizeof meta);
    meta.format = IR_PLAN_FORMAT;
    meta.tp = par ? par->tp : 0;
    meta.ep = par ? (par->ep ? par->ep : 1) : 0;
    moec_status st = MOEC_OK;
    for (int r = 0; r < n && st == MOEC_OK; r++) {
        st = moec_fuse_rank(moec_model_module(model), &co, par, r, &fused[r]);
        /* The checkpoint must fit the plan before the expensive part. */
        rt_weights *w = NULL;
        if (st == MOEC_OK)
            st = rt_weights_open(fused[r], weights_dir, &w);
        rt_weights_free(w);
        if (st != MOEC_OK && par)
            moec_err_wrap(st, "rank %d of tp %d", r, par->tp);
    }
    if (st == MOEC_OK)
        st = rt_hash_config(weights_dir, meta.config_hash);
    if (st == MOEC_OK)
        st = rt_hash_weights(fused[0], weights_dir, meta.weights_hash);
    for (int r = 0; r < n && st == MOEC_OK; r++)
        st = cg_plan_build(fused[r], &co, &plans[r]);
    if (st == MOEC_OK)
        st = ir_plan_write_ranks(out_path, (const ir_plan *const *)plans, &meta);
    for (int r = 0; r < n; r++) {
        ir_plan_free(plans[r]);
        ir_module_free(fused[r]);
    }
    return st;
}

moec_status moec_compile_scratch(const moec_model_t *model, const char *weights_dir,
                                 const moec_parallel *par, ir_dtype dt, char *path, size_t cap)
{
    /* the GPUs first: no compile for a machine that cannot run the split */
    int n_dev = 0, ranks = par->tp;
    MOEC_TRY(moec_cuda_device_count(&n_dev));
    if (ranks > n_dev)
        return MOEC_ERR(MOEC_ERR_NO_DEVICE,
                        "the model split over %d ranks (tp %d, ep %d) needs %d GPUs, this "
                        "machine has %d",
                        ranks, par->tp, par->ep ? par->ep : 1, ranks, n_dev);
    const char *tmp = getenv("TMPDIR");
    int n = snprintf(path, cap, "%s/moec-plan-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (n < 0 || (size_t)n >= cap)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "TMPDIR %s is too long", tmp);
    if (!mkdtemp(path))
        return MOEC_ERR(MOEC_ERR_IO, "cannot make a scratch directory %s: %s", path,
                        strerror(errno));
    size_t len = strlen(path);
    if (len + sizeof "/model.moec" > cap) {
        rmdir(path);
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "TMPDIR %s is too long", tmp);
    }
    memcpy(path + len, "/model.moec", sizeof "/model.moec");
    moec_compile_options o;
    memset(&o, 0, sizeof o);
    o.dtype = dt == IR_DTYPE_F32 ? "fp32" : "bf16";
    o.par = *par;
    moec_status st = moec_compile(model, weights_dir, &o, path);
    if (st != MOEC_OK)
        moec_compile_scratch_remove(path);
    return st;
}

void moec_compile_scratch_remove(const char *path)
{
    char dir[4096];
    unlink(path);
    moec_path_parent(path, dir, sizeof dir);
    rmdir(dir);
}
