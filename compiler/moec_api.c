/* moec_api.c — the public API (include/moec.h) over the frontend, the weight
 * loader and the backends. A model is the verified IR of a config; a session
 * is one sequence being generated on one backend: the CPU interpreter on the
 * unfused module, or the CUDA runtime on a plan built in-process from the
 * module after every pass (compute dtype bf16, or fp32 with MOEC_DTYPE=fp32)
 * or read from a plan file (moec compile), which calls no compiler code. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codegen/cg.h"
#include "timer.h"
#include "compiler/api_internal.h"
#include "compiler/frontend.h"
#include "err.h"
#include "runtime/cuda_rt.h"
#include "runtime/interp.h"
#include "runtime/plan_check.h"
#include "runtime/weights.h"

struct moec_model {
    ir_module *module;
    int n_tensors;
    moec_tensor_info *tensors; /* names live in the module's arena */
    moec_eos eos;
};

/* Appends the tensors of one TENSOR or STACK binding of weight type t (fp8:
 * stored as F8_E4M3) to m->tensors; with m->tensors NULL only counts them. */
static moec_status model_add_tensors(moec_model_t *m, const ir_binding *b, const ir_type *t,
                                     int fp8)
{
    int count = b->kind == IR_BIND_STACK ? b->count : 1;
    for (int e = 0; e < count; e++) {
        if (m->tensors) {
            moec_tensor_info *ti = &m->tensors[m->n_tensors];
            ti->dtype = fp8                        ? MOEC_DTYPE_F8_E4M3
                        : t->dtype == IR_DTYPE_F32 ? MOEC_DTYPE_F32
                        : t->dtype == IR_DTYPE_F16 ? MOEC_DTYPE_F16
                                                   : MOEC_DTYPE_BF16;
            int skip = b->kind == IR_BIND_STACK ? 1 : 0;
            ti->rank = t->rank - skip;
            for (int d = 0; d < ti->rank; d++)
                ti->shape[d] = t->dims[d + skip];
            if (b->kind == IR_BIND_STACK) {
                size_t cap = 4 * strlen(b->name) + 16; /* each "{e}" a number of <= 11 */
                char *name = ir_arena_alloc(m->module->arena, cap);
                if (!name || ir_binding_tensor_name(b, e, name, cap))
                    return MOEC_ERR(MOEC_ERR_OOM, "out of memory listing tensors");
                ti->name = name;
            } else {
                ti->name = b->name;
            }
        }
        m->n_tensors++;
    }
    return MOEC_OK;
}

static moec_status model_list_tensors(moec_model_t *m)
{
    for (int pass = 0; pass < 2; pass++) {
        m->n_tensors = 0;
        for (int i = 0; i < m->module->n_values; i++) {
            const ir_value *v = m->module->values[i];
            if (v->kind != IR_VALUE_WEIGHT)
                continue;
            if (v->bind.kind != IR_BIND_CONCAT) {
                int fp8 = v->scale.block[0] > 0;
                MOEC_TRY(model_add_tensors(m, &v->bind, &v->type, fp8));
                ir_type st = ir_block_scale_type(v);
                if (fp8)
                    MOEC_TRY(model_add_tensors(m, &v->scale.bind, &st, 0));
                continue;
            }
            /* The frontend binds published tensors one to one; fused (concat)
             * weights appear only after passes. */
            return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                            "weight %%%s: listing the tensors of a concat binding is not supported",
                            v->name);
        }
        if (pass == 0) {
            m->tensors = ir_arena_alloc(m->module->arena,
                                        (size_t)(m->n_tensors + 1) * sizeof *m->tensors);
            if (!m->tensors)
                return MOEC_ERR(MOEC_ERR_OOM, "out of memory listing tensors");
        }
    }
    return MOEC_OK;
}

int moec_model_tensor_count(const moec_model_t *m) { return m ? m->n_tensors : 0; }

moec_status moec_model_tensor_info(const moec_model_t *m, int i, moec_tensor_info *out)
{
    if (!m || !out) /* not an index out of range, which is what a NULL was reported as */
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_model_tensor_info: NULL %s",
                        !m ? "model" : "out");
    if (i < 0 || i >= m->n_tensors)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "tensor index %d out of range [0, %d)", i,
                        m->n_tensors);
    *out = m->tensors[i];
    return MOEC_OK;
}

/* A model from the folder or config file at path (is_dir says which). */
static moec_status model_open(const char *path, int is_dir, moec_model_t **out)
{
    if (!path || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_model_open: NULL argument");
    *out = NULL;
    moec_model_t *m = calloc(1, sizeof *m);
    if (!m)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory opening %s", path);
    moec_status st = is_dir ? fe_model_load(path, &m->module) : fe_config_load(path, &m->module);
    if (st == MOEC_OK)
        st = model_list_tensors(m);
    if (st == MOEC_OK)
        st = moec_eos_init(m->module, &m->eos);
    if (st != MOEC_OK) {
        moec_model_free(m);
        return st;
    }
    *out = m;
    return MOEC_OK;
}

moec_status moec_model_open(const char *model_dir, moec_model_t **out)
{
    return model_open(model_dir, 1, out);
}

moec_status moec_model_open_config(const char *config_path, moec_model_t **out)
{
    return model_open(config_path, 0, out);
}

void moec_model_free(moec_model_t *m)
{
    if (!m)
        return;
    moec_eos_free(&m->eos);
    ir_module_free(m->module);
    free(m);
}

moec_status moec_model_dump_ir(const moec_model_t *m, FILE *out)
{
    if (!m || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_model_dump_ir: NULL argument");
    return ir_module_print(m->module, out);
}

moec_status moec_model_summary(const moec_model_t *m, FILE *out)
{
    if (!m || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_model_summary: NULL argument");
    const ir_module *mod = m->module;
    int by_kind[IR_OP_COUNT] = {0};
    int n_weights = 0;
    double params = 0, bytes = 0;
    for (int i = 0; i < mod->n_ops; i++)
        by_kind[mod->ops[i]->kind]++;
    for (int i = 0; i < mod->n_values; i++) {
        const ir_value *v = mod->values[i];
        if (v->kind != IR_VALUE_WEIGHT)
            continue;
        n_weights++;
        double n = (double)ir_type_numel(&v->type, 0);
        params += n;
        bytes += n * (double)ir_dtype_size(v->type.dtype);
        if (v->scale.block[0] > 0) {
            ir_type st = ir_block_scale_type(v);
            bytes += (double)ir_type_numel(&st, 0) * 4;
        }
    }
    fprintf(out, "model %s: %lld layers, hidden %lld, vocab %lld\n", mod->name,
            (long long)ir_module_meta_int(mod, "num_hidden_layers", 0),
            (long long)ir_module_meta_int(mod, "hidden_size", 0),
            (long long)ir_module_meta_int(mod, "vocab_size", 0));
    fprintf(out, "  %d values, %d ops, %d weights (%d checkpoint tensors), %.3g parameters, %.3g MB\n",
            mod->n_values, mod->n_ops, n_weights, m->n_tensors, params, bytes / 1e6);
    fprintf(out, "  ops:");
    for (int k = 0; k < IR_OP_COUNT; k++)
        if (by_kind[k])
            fprintf(out, " %s %d", ir_op_name((ir_op_kind)k), by_kind[k]);
    fprintf(out, "\n");
    return ferror(out) ? MOEC_ERR(MOEC_ERR_IO, "cannot write the summary") : MOEC_OK;
}

int moec_model_vocab_size(const moec_model_t *m)
{
    return m ? (int)ir_module_meta_int(m->module, "vocab_size", 0) : 0;
}

int moec_model_max_positions(const moec_model_t *m)
{
    return m ? (int)ir_module_meta_int(m->module, "max_position_embeddings", 0) : 0;
}

int moec_model_eos_tokens(const moec_model_t *m, const int32_t **ids)
{
    return moec_eos_list(m ? &m->eos : NULL, ids);
}

int moec_model_eos_token(const moec_model_t *m) { return moec_eos_first(m ? &m->eos : NULL); }

moec_status moec_cuda_dtype(ir_dtype *out)
{
    const char *e = getenv("MOEC_DTYPE");
    if (!e || !*e || !strcmp(e, "bf16"))
        *out = IR_DTYPE_BF16;
    else if (!strcmp(e, "fp32"))
        *out = IR_DTYPE_F32;
    else
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "MOEC_DTYPE='%s' is not bf16 or fp32", e);
    return MOEC_OK;
}

moec_status moec_cuda_model_init(const moec_model_t *model, const char *weights_dir, ir_dtype dt,
                                 const moec_cuda_opts *o, moec_cuda_model *x)
{
    memset(x, 0, sizeof *x);
    cg_options co;
    moec_status st = moec_cg_options(dt, NULL, &co);
    if (st == MOEC_OK)
        st = moec_fuse(model->module, &co, &x->fused);
    rt_weights *w = NULL;
    if (st == MOEC_OK)
        st = rt_weights_open(x->fused, weights_dir, &w);
    if (st == MOEC_OK)
        st = cg_plan_build(x->fused, &co, &x->plan);
    if (st == MOEC_OK)
        st = moec_cuda_model_bind(x, w, o, moec_model_vocab_size(model), "the compiled plan");
    rt_weights_free(w);
    if (st != MOEC_OK)
        moec_cuda_model_free(x);
    return st;
}

/* A session's max_seq_len: positive and within max_position_embeddings. */
static moec_status session_len_check(const moec_model_t *model, int max_seq_len)
{
    int max_pos = moec_model_max_positions(model);
    if (max_seq_len <= 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "max_seq_len must be positive, got %d", max_seq_len);
    if (max_pos > 0 && max_seq_len > max_pos)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "max_seq_len %d exceeds the model's max_position_embeddings %d",
                        max_seq_len, max_pos);
    return MOEC_OK;
}

moec_status moec_session_init(const moec_model_t *model, const char *weights_dir,
                              moec_backend backend, int max_seq_len, moec_session_t **out)
{
    if (!model || !weights_dir || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_session_init: NULL argument");
    *out = NULL;
    MOEC_TRY(session_len_check(model, max_seq_len));
    MOEC_TRY(moec_resolve_backend(&backend));
    moec_session_t *s;
    MOEC_TRY(moec_session_new(backend, max_seq_len, &s));
    s->vocab = moec_model_vocab_size(model);
    moec_status st = moec_eos_init(model->module, &s->eos);
    if (st != MOEC_OK) {
        /* recorded */
    } else if (backend == MOEC_BACKEND_CUDA) {
        ir_dtype dt = IR_DTYPE_BF16;
        st = moec_cuda_dtype(&dt);
        if (st == MOEC_OK) {
            moec_cuda_opts o = {.max_seqs = 1, .max_seq_len = max_seq_len};
            st = moec_cuda_model_init(model, weights_dir, dt, &o, &s->gpu);
        }
    } else {
        st = moec_session_bind_cpu(s, model->module, weights_dir);
    }
    if (st != MOEC_OK) {
        moec_session_free(s);
        return st;
    }
    *out = s;
    return MOEC_OK;
}

const ir_module *moec_model_module(const moec_model_t *m) { return m ? m->module : NULL; }

moec_status moec_fuse_ranks_cpu(const moec_model_t *model, const moec_parallel *par,
                                ir_module **mods)
{
    MOEC_TRY(moec_parallel_check(par));
    cg_options co;
    MOEC_TRY(moec_cg_options(IR_DTYPE_F32, NULL, &co));
    for (int r = 0; r < par->tp; r++) {
        moec_status st = moec_fuse_rank(model->module, &co, par, r, &mods[r]);
        if (st != MOEC_OK) {
            for (int j = 0; j < r; j++)
                ir_module_free(mods[j]);
            return moec_err_wrap(st, "rank %d of tp %d", r, par->tp);
        }
    }
    return MOEC_OK;
}

moec_status moec_session_init_parallel(const moec_model_t *model, const char *weights_dir,
                                       moec_backend backend, int max_seq_len,
                                       const moec_parallel *par, moec_session_t **out)
{
    if (!par || par->tp == 0)
        return moec_session_init(model, weights_dir, backend, max_seq_len, out);
    if (!model || !weights_dir || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_session_init_parallel: NULL argument");
    *out = NULL;
    MOEC_TRY(moec_parallel_check(par));
    if (backend != MOEC_BACKEND_CUDA)
        MOEC_TRY(moec_resolve_backend(&backend));
    if (backend == MOEC_BACKEND_CUDA) {
        /* the model compiled into a scratch plan, run as `moec run PLAN --tp` */
        ir_dtype dt;
        char path[4096];
        MOEC_TRY(moec_cuda_dtype(&dt));
        MOEC_TRY(moec_compile_scratch(model, weights_dir, par, dt, path, sizeof path));
        moec_status st = moec_session_init_plan_parallel(path, weights_dir, max_seq_len, par, out);
        moec_compile_scratch_remove(path);
        return st;
    }
    MOEC_TRY(session_len_check(model, max_seq_len));
    moec_session_t *s;
    MOEC_TRY(moec_session_new(backend, max_seq_len, &s));
    s->vocab = moec_model_vocab_size(model);
    ir_module *mods[IR_MAX_RANKS];
    moec_status st = moec_eos_init(model->module, &s->eos);
    if (st == MOEC_OK)
        st = moec_fuse_ranks_cpu(model, par, mods);
    if (st == MOEC_OK)
        st = rt_interp_init_ranks(mods, par->tp, weights_dir, max_seq_len, &s->interp);
    if (st != MOEC_OK) {
        moec_session_free(s);
        return st;
    }
    *out = s;
    return MOEC_OK;
}
