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
#include "runtime/plan_file.h"
#include "runtime/weights.h"

struct moec_model {
    ir_module *module;
    int n_tensors;
    moec_tensor_info *tensors; /* names live in the module's arena */
};

struct moec_session {
    moec_backend backend;
    int max_seq;
    int length;
    int vocab, eos;
    long steps; /* forward calls begun, for errors */
    /* CPU */
    rt_weights *weights;
    rt_interp *interp;
    /* CUDA: the plan points into the fused module, the runtime into both */
    moec_cuda_model gpu;
};

/* Appends the tensors of one TENSOR or STACK binding of weight type t to
 * m->tensors; with m->tensors NULL only counts them. */
static moec_status model_add_tensors(moec_model_t *m, const ir_binding *b, const ir_type *t)
{
    int count = b->kind == IR_BIND_STACK ? b->count : 1;
    for (int e = 0; e < count; e++) {
        if (m->tensors) {
            moec_tensor_info *ti = &m->tensors[m->n_tensors];
            ti->dtype = t->dtype == IR_DTYPE_F32 ? MOEC_DTYPE_F32
                        : t->dtype == IR_DTYPE_F16 ? MOEC_DTYPE_F16 : MOEC_DTYPE_BF16;
            int skip = b->kind == IR_BIND_STACK ? 1 : 0;
            ti->rank = t->rank - skip;
            for (int d = 0; d < ti->rank; d++)
                ti->shape[d] = t->dims[d + skip];
            if (b->kind == IR_BIND_STACK) {
                const char *at = strstr(b->name, "{e}");
                size_t cap = strlen(b->name) + 16;
                char *name = ir_arena_alloc(m->module->arena, cap);
                if (!name || !at)
                    return MOEC_ERR(MOEC_ERR_OOM, "out of memory listing tensors");
                snprintf(name, cap, "%.*s%d%s", (int)(at - b->name), b->name, e, at + 3);
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
                MOEC_TRY(model_add_tensors(m, &v->bind, &v->type));
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
    if (!m || !out || i < 0 || i >= m->n_tensors)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "tensor index %d out of range", i);
    *out = m->tensors[i];
    return MOEC_OK;
}

moec_status moec_model_open(const char *model_dir, moec_model_t **out)
{
    if (!model_dir || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_model_open: NULL argument");
    *out = NULL;
    moec_model_t *m = calloc(1, sizeof *m);
    if (!m)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory opening %s", model_dir);
    moec_status st = fe_model_load(model_dir, &m->module);
    if (st == MOEC_OK)
        st = model_list_tensors(m);
    if (st != MOEC_OK) {
        moec_model_free(m);
        return st;
    }
    *out = m;
    return MOEC_OK;
}

void moec_model_free(moec_model_t *m)
{
    if (!m)
        return;
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

int moec_model_eos_token(const moec_model_t *m)
{
    return m ? (int)ir_module_meta_int(m->module, "eos_token_id", -1) : -1;
}

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

int moec_graphs_disabled(void)
{
    const char *e = getenv("MOEC_DISABLE_GRAPHS");
    return e && *e && strcmp(e, "0");
}

/* After rt_cuda_init: the stream mode, then every bucket's graph captured
 * (timed) unless the options or MOEC_DISABLE_GRAPHS say eager. */
static moec_status cuda_model_finish(moec_cuda_model *x, const moec_cuda_opts *o)
{
    const char *ss = getenv("MOEC_SINGLE_STREAM");
    rt_cuda_set_single_stream(x->cuda, o->single_stream || (ss && *ss && strcmp(ss, "0")));
    if (o->eager || moec_graphs_disabled())
        return MOEC_OK;
    double t0 = moec_now_s();
    MOEC_TRY(rt_cuda_capture(x->cuda));
    x->capture_s = moec_now_s() - t0;
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
        st = rt_cuda_init(x->plan, w, o->max_seqs, o->max_seq_len, &x->cuda);
    rt_weights_free(w);
    if (st == MOEC_OK && rt_cuda_logits_cols(x->cuda) != moec_model_vocab_size(model))
        st = MOEC_ERR(MOEC_ERR_INTERNAL, "the plan's logits have %d columns, the vocabulary %d",
                      rt_cuda_logits_cols(x->cuda), moec_model_vocab_size(model));
    if (st == MOEC_OK)
        st = cuda_model_finish(x, o);
    if (st != MOEC_OK)
        moec_cuda_model_free(x);
    return st;
}

void moec_cuda_model_free(moec_cuda_model *x)
{
    rt_cuda_free(x->cuda);
    rt_plan_free(x->plan);
    ir_module_free(x->fused);
    memset(x, 0, sizeof *x);
}

moec_status moec_resolve_backend(moec_backend *backend)
{
    int n_dev = 0;
    if (*backend == MOEC_BACKEND_AUTO) {
        *backend = moec_cuda_device_count(&n_dev) == MOEC_OK && n_dev > 0 ? MOEC_BACKEND_CUDA
                                                                          : MOEC_BACKEND_CPU;
        moec_err_clear();
    }
    if (*backend == MOEC_BACKEND_CUDA)
        MOEC_TRY(moec_cuda_device_count(&n_dev));
    return MOEC_OK;
}

moec_status moec_session_init(const moec_model_t *model, const char *weights_dir,
                              moec_backend backend, int max_seq_len, moec_session_t **out)
{
    if (!model || !weights_dir || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_session_init: NULL argument");
    *out = NULL;
    int max_pos = moec_model_max_positions(model);
    if (max_seq_len <= 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "max_seq_len must be positive, got %d", max_seq_len);
    if (max_pos > 0 && max_seq_len > max_pos)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "max_seq_len %d exceeds the model's max_position_embeddings %d",
                        max_seq_len, max_pos);
    MOEC_TRY(moec_resolve_backend(&backend));
    moec_session_t *s = calloc(1, sizeof *s);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    s->backend = backend;
    s->vocab = moec_model_vocab_size(model);
    s->eos = moec_model_eos_token(model);
    s->max_seq = max_seq_len;
    moec_status st;
    if (backend == MOEC_BACKEND_CUDA) {
        ir_dtype dt = IR_DTYPE_BF16;
        st = moec_cuda_dtype(&dt);
        if (st == MOEC_OK) {
            moec_cuda_opts o = {.max_seqs = 1, .max_seq_len = max_seq_len};
            st = moec_cuda_model_init(model, weights_dir, dt, &o, &s->gpu);
        }
    } else {
        st = rt_weights_open(model->module, weights_dir, &s->weights);
        if (st == MOEC_OK)
            st = rt_interp_init(model->module, s->weights, max_seq_len, &s->interp);
    }
    if (st != MOEC_OK) {
        moec_session_free(s);
        return st;
    }
    *out = s;
    return MOEC_OK;
}

void moec_session_free(moec_session_t *s)
{
    if (!s)
        return;
    moec_cuda_model_free(&s->gpu);
    rt_interp_free(s->interp);
    rt_weights_free(s->weights);
    free(s);
}

moec_backend moec_session_backend(const moec_session_t *s) { return s ? s->backend : MOEC_BACKEND_AUTO; }

int moec_session_vocab_size(const moec_session_t *s) { return s ? s->vocab : 0; }

int moec_session_eos_token(const moec_session_t *s) { return s ? s->eos : -1; }

moec_status moec_check_plan_path(const char *plan_path)
{
    struct stat sb;
    if (stat(plan_path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return MOEC_ERR(MOEC_ERR_IO, "%s is a directory, not a plan file", plan_path);
    return MOEC_OK;
}

moec_status moec_cuda_plan_read(const char *plan_path, moec_cuda_model *x, rt_plan_meta *meta)
{
    memset(x, 0, sizeof *x);
    MOEC_TRY(moec_check_plan_path(plan_path));
    return rt_plan_read(plan_path, &x->plan, &x->fused, meta);
}

moec_status moec_cuda_plan_bind(moec_cuda_model *x, const rt_plan_meta *meta,
                                const char *plan_path, const char *weights_dir,
                                const moec_cuda_opts *o, int *vocab)
{
    int max_pos = (int)ir_module_meta_int(x->fused, "max_position_embeddings", 0);
    if (max_pos > 0 && o->max_seq_len > max_pos)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "max_seq_len %d exceeds the model's max_position_embeddings %d (plan %s)",
                        o->max_seq_len, max_pos, plan_path);
    MOEC_TRY(rt_plan_check_checkpoint(meta, x->fused, plan_path, weights_dir));
    rt_weights *w = NULL;
    MOEC_TRY(rt_weights_open(x->fused, weights_dir, &w));
    moec_status st = rt_cuda_init(x->plan, w, o->max_seqs, o->max_seq_len, &x->cuda);
    rt_weights_free(w);
    MOEC_TRY(st);
    *vocab = (int)ir_module_meta_int(x->fused, "vocab_size", 0);
    if (rt_cuda_logits_cols(x->cuda) != *vocab)
        return MOEC_ERR(MOEC_ERR_FORMAT, "plan %s: its logits have %d columns, its vocabulary %d",
                        plan_path, rt_cuda_logits_cols(x->cuda), *vocab);
    return cuda_model_finish(x, o);
}

moec_status moec_cuda_model_init_plan(const char *plan_path, const char *weights_dir,
                                      const moec_cuda_opts *o, moec_cuda_model *x, int *vocab)
{
    rt_plan_meta meta;
    MOEC_TRY(moec_cuda_plan_read(plan_path, x, &meta));
    return moec_cuda_plan_bind(x, &meta, plan_path, weights_dir, o, vocab);
}

moec_status moec_session_init_plan(const char *plan_path, const char *weights_dir,
                                   int max_seq_len, moec_session_t **out)
{
    if (!plan_path || !weights_dir || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_session_init_plan: NULL argument");
    *out = NULL;
    if (max_seq_len <= 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "max_seq_len must be positive, got %d", max_seq_len);
    moec_session_t *s = calloc(1, sizeof *s);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    s->backend = MOEC_BACKEND_CUDA;
    s->max_seq = max_seq_len;
    moec_cuda_opts o = {.max_seqs = 1, .max_seq_len = max_seq_len};
    moec_status st = moec_cuda_model_init_plan(plan_path, weights_dir, &o, &s->gpu, &s->vocab);
    if (st != MOEC_OK) {
        moec_session_free(s);
        return st;
    }
    s->eos = (int)ir_module_meta_int(s->gpu.fused, "eos_token_id", -1);
    *out = s;
    return MOEC_OK;
}

int moec_session_length(const moec_session_t *s) { return s ? s->length : 0; }

/* Runs the tokens on the interpreter; next gets each row's greedy id. */
static moec_status forward_cpu(moec_session_t *s, const int32_t *ids, int n, float *logits_out,
                               int32_t *next)
{
    size_t V = (size_t)s->vocab;
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    float *rows = logits_out ? logits_out : malloc((size_t)n * V * sizeof *rows);
    moec_status st = pos && rows ? MOEC_OK : MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    for (int i = 0; st == MOEC_OK && i < n; i++)
        pos[i] = s->length + i;
    if (st == MOEC_OK)
        st = rt_interp_forward(s->interp, ids, pos, n, rows);
    for (int i = 0; st == MOEC_OK && i < n; i++)
        next[i] = rt_logits_argmax(rows + (size_t)i * V, s->vocab);
    free(pos);
    if (rows != logits_out)
        free(rows);
    return st;
}

/* Runs the tokens in chunks of the largest bucket (one sequence, slot 0,
 * consecutive positions); next gets each row's greedy id. */
static moec_status forward_cuda(moec_session_t *s, const int32_t *ids, int n, float *logits_out,
                                int32_t *next)
{
    int chunk = rt_cuda_max_tokens(s->gpu.cuda);
    size_t cols = (size_t)rt_cuda_logits_cols(s->gpu.cuda);
    int32_t *pos = malloc((size_t)chunk * sizeof *pos);
    int32_t *slot = calloc((size_t)chunk, sizeof *slot);
    moec_status st = pos && slot ? MOEC_OK : MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    for (int done = 0; done < n && st == MOEC_OK; done += chunk) {
        int k = n - done < chunk ? n - done : chunk;
        for (int i = 0; i < k; i++)
            pos[i] = s->length + done + i;
        st = rt_cuda_step(s->gpu.cuda, k, ids + done, pos, slot,
                          logits_out ? logits_out + (size_t)done * cols : NULL, next + done);
    }
    free(pos);
    free(slot);
    return st;
}

/* MOEC_ERR_NUMERIC naming the call and the position of the first of the n
 * tokens just appended whose logits are not finite, if any. */
static moec_status session_check_finite(const moec_session_t *s, long step, const int32_t *next,
                                        int n)
{
    for (int i = 0; i < n; i++)
        if (next[i] == RT_SAMPLED_NONFINITE)
            return MOEC_ERR(MOEC_ERR_NUMERIC,
                            "step %ld, position %d: the logits hold a NaN or an infinity (a NaN "
                            "in the checkpoint, or an overflow)",
                            step, s->length - n + i);
    return MOEC_OK;
}

moec_status moec_session_forward(moec_session_t *s, const int32_t *ids, int n, float *logits_out)
{
    if (!s || !ids || n <= 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_session_forward: no tokens");
    if (n > s->max_seq - s->length)
        return MOEC_ERR(MOEC_ERR_CAPACITY,
                        "%d tokens do not fit: the sequence holds %d of at most %d tokens", n,
                        s->length, s->max_seq);
    /* each row's greedy id says whether it is finite: on the GPU the argmax
     * step computes it anyway, on the CPU it is one pass over the rows */
    int32_t *next = malloc((size_t)n * sizeof *next);
    if (!next)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    long step = s->steps++;
    moec_status st = s->gpu.cuda ? forward_cuda(s, ids, n, logits_out, next)
                                 : forward_cpu(s, ids, n, logits_out, next);
    if (st == MOEC_OK) {
        s->length += n;
        st = session_check_finite(s, step, next, n);
    }
    free(next);
    return st;
}

const ir_module *moec_model_module(const moec_model_t *m) { return m ? m->module : NULL; }
