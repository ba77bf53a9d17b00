/* plan_build.c — the fused, planned module to a launch plan: per batch
 * bucket, the program (prologue, every op's kernels in module order, the
 * argmax of the logits) and its steps, then one NVRTC compile per bucket.
 * The compiles are independent and dominate the time, so they run on
 * parallel threads (cg_compile_many) once every bucket's source is
 * generated. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cg.h"
#include "err.h"

void cg_ctx_free(cg_ctx *c)
{
    moec_buf_free(&c->src);
    for (int i = 0; i < c->n_kernels; i++)
        free(c->kernel_names[i]);
    free(c->kernel_names);
    free(c->steps);
    memset(c, 0, sizeof *c);
}

static moec_status check_options(const cg_options *o)
{
    if (o->compute_dtype != IR_DTYPE_BF16 && o->compute_dtype != IR_DTYPE_F16 &&
        o->compute_dtype != IR_DTYPE_F32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "cg_plan_build: compute dtype %s (want bf16, f16 or f32)",
                        ir_dtype_name(o->compute_dtype));
    if (!o->arch[0] || !memchr(o->arch, '\0', sizeof o->arch))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "cg_plan_build: no target arch");
    if (o->kv_block_size < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "cg_plan_build: kv_block_size %d", o->kv_block_size);
    moec_status st = ir_buckets_check(o->buckets, o->n_buckets);
    return st == MOEC_OK ? st : moec_err_wrap(st, "cg_plan_build");
}

/* The module is fused and planned: one output, inputs only tokens and
 * positions, every op result at a 16-byte aligned arena offset inside
 * arena_bytes_per_token. */
static moec_status check_module(const ir_module *m, const cg_options *o)
{
    const ir_attr *arena = ir_module_meta(m, "arena_bytes_per_token");
    if (!arena || arena->kind != IR_ATTR_INT || arena->i <= 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "cg_plan_build: module %s has no memory plan (meta arena_bytes_per_token; "
                        "run the pass pipeline through plan_memory)",
                        m->name);
    const char *dt = NULL;
    const ir_attr *cd = ir_module_meta(m, "compute_dtype");
    if (cd && cd->kind == IR_ATTR_STR)
        dt = cd->s;
    if (dt && strcmp(dt, ir_dtype_name(o->compute_dtype)) != 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "cg_plan_build: module %s was compiled for compute dtype %s, not %s",
                        m->name, dt, ir_dtype_name(o->compute_dtype));
    if (m->n_outputs != 1)
        return MOEC_ERR(
            MOEC_ERR_INVALID_ARG,
            "cg_plan_build: module %s has %d outputs; the CUDA backend wants one, the logits",
            m->name, m->n_outputs);
    for (int i = 0; i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        if (v->kind == IR_VALUE_INPUT && strcmp(v->name, "tokens") && strcmp(v->name, "positions"))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "cg_plan_build: input %%%s is neither tokens nor positions", v->name);
        if (v->kind != IR_VALUE_OP)
            continue;
        int64_t bytes = ir_type_numel(&v->type, 1) * 4;
        if (v->mem_offset < 0)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "cg_plan_build: activation %%%s has no arena offset (run plan_memory)",
                            v->name);
        if (v->mem_offset % 16 || v->mem_offset + bytes > arena->i)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "cg_plan_build: activation %%%s at %lld (%lld bytes per token) is "
                            "misaligned or outside the %lld-byte arena",
                            v->name, (long long)v->mem_offset, (long long)bytes,
                            (long long)arena->i);
    }
    return MOEC_OK;
}

static moec_status generate(const ir_module *m, const cg_options *o, int T, cg_ctx *c)
{
    memset(c, 0, sizeof *c);
    c->m = m;
    c->opt = o;
    c->T = T;
    cg_emit_prologue(&c->src);
    for (int k = 0; k < m->n_ops; k++) {
        c->stream = m->ops[k]->stream;
        c->scratch_cur[0] = c->scratch_cur[1] = 0;
        MOEC_TRY(cg_emit_op(c, m->ops[k]));
    }
    c->stream = 0;
    c->scratch_cur[0] = 0;
    moec_status st = cg_emit_argmax(c, m->outputs[0]);
    if (st != MOEC_OK)
        return moec_err_wrap(st, "codegen of the argmax (bucket T=%d)", T);
    if (cg_has_sampler(m)) {
        st = cg_emit_sample(c, m->outputs[0]);
        if (st != MOEC_OK)
            return moec_err_wrap(st, "codegen of the sampler (bucket T=%d)", T);
    }
    cg_place_forks(c);
    cg_scratch_place_streams(c);
    /* c->scratch_bytes (cg_scratch) already counts both regions. */
    cg_add_pdl_waits(&c->src);
    if (c->src.oom)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory generating bucket T=%d", T);
    return MOEC_OK;
}

moec_status cg_plan_build(const ir_module *m, const cg_options *opt, ir_plan **out)
{
    if (!m || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "cg_plan_build: NULL argument");
    *out = NULL;
    cg_options defaults;
    if (!opt) {
        cg_options_default(&defaults);
        opt = &defaults;
    }
    MOEC_TRY(check_options(opt));
    MOEC_TRY(check_module(m, opt));
    int nb = opt->n_buckets;
    moec_status st = MOEC_OK;
    cg_ctx *ctx = calloc((size_t)nb, sizeof *ctx);
    cg_compile_job *jobs = calloc((size_t)nb, sizeof *jobs);
    ir_plan *p = calloc(1, sizeof *p);
    if (p)
        p->buckets = calloc((size_t)nb, sizeof *p->buckets);
    if (!ctx || !jobs || !p || !p->buckets) {
        st = MOEC_ERR(MOEC_ERR_OOM, "cg_plan_build: out of memory");
        goto out;
    }
    for (int b = 0; b < nb && st == MOEC_OK; b++) {
        st = generate(m, opt, opt->buckets[b], &ctx[b]);
        jobs[b].src = ctx[b].src.data;
        jobs[b].weight = ctx[b].n_kernels; /* progress counts kernels */
    }
    if (st != MOEC_OK)
        goto out;
    cg_compile_many(jobs, nb, opt->arch, opt->cache_dir, opt->progress, opt->progress_user);
    p->module = m;
    p->compute_dtype = opt->compute_dtype;
    p->fp8_tiles = opt->fp8_tiles;
    snprintf(p->arch, sizeof p->arch, "%s", opt->arch);
    p->kv_block_size = opt->kv_block_size;
    p->pdl = 1; /* generate() gave every kernel its moec_pdl_enter */
    p->sampler = cg_has_sampler(m);
    p->n_buckets = nb;
    int64_t arena = ir_module_meta(m, "arena_bytes_per_token")->i;
    for (int b = 0; b < nb; b++) {
        cg_compile_job *j = &jobs[b];
        if (j->st != MOEC_OK && st == MOEC_OK)
            st = MOEC_ERR(j->st, "bucket T=%d: %s", opt->buckets[b], j->err);
        ir_bucket *bk = &p->buckets[b];
        cg_ctx *c = &ctx[b];
        bk->T = c->T;
        bk->cubin = j->cubin;
        bk->cubin_size = j->size;
        j->cubin = NULL;
        bk->n_kernels = c->n_kernels;
        bk->kernel_names = c->kernel_names;
        bk->n_steps = c->n_steps;
        bk->steps = c->steps;
        c->kernel_names = NULL;
        c->n_kernels = 0;
        c->steps = NULL;
        bk->arena_bytes = (size_t)arena * (size_t)c->T;
        bk->scratch_bytes = c->scratch_bytes;
    }
out:
    for (int b = 0; ctx && b < nb; b++)
        cg_ctx_free(&ctx[b]);
    for (int b = 0; jobs && b < nb; b++)
        free(jobs[b].cubin);
    free(ctx);
    free(jobs);
    if (st != MOEC_OK) {
        ir_plan_free(p);
        return st;
    }
    *out = p;
    return MOEC_OK;
}
