/* api_internal.h — what the library's own files (not its users) may ask of
 * the public handles. */
#ifndef MOEC_API_INTERNAL_H
#define MOEC_API_INTERNAL_H

#include "codegen/cg.h"
#include "ir/ir.h"
#include "moec.h"
#include "runtime/cuda_rt.h"
#include "runtime/plan.h"
#include "runtime/plan_file.h"

/* The model's unfused, verified module (owned by the model). */
const ir_module *moec_model_module(const moec_model_t *model);

/* The eos ids of a module (its meta eos_token_id: one id or a list) as the
 * public API gives them out: *ids (free with moec_eos_free) gets n of them,
 * each checked to lie in [0, vocab_size). */
typedef struct moec_eos {
    int n;
    int32_t *ids;
} moec_eos;
moec_status moec_eos_init(const ir_module *m, moec_eos *out);
void moec_eos_free(moec_eos *e);
/* e's count, and *ids (when ids is not NULL) its ids; the first or -1. */
int moec_eos_list(const moec_eos *e, const int32_t **ids);
int moec_eos_first(const moec_eos *e);

/* A model compiled for and bound to the GPU: every pass on a copy of its
 * module, the checkpoint checked against the fused weights, the plan built
 * and compiled (or the plan and its module read from a plan file), the
 * runtime bound for max_seqs sequences of max_seq_len. */
typedef struct moec_cuda_model {
    ir_module *fused;
    rt_plan *plan;
    rt_cuda *cuda;
    double capture_s; /* capturing every bucket's graph (0: not captured) */
} moec_cuda_model;

/* How a model is bound to the GPU. Graphs are captured at init unless
 * `eager` or MOEC_DISABLE_GRAPHS=1; single_stream runs the shared-expert
 * branch on stream 0 too (moec --single-stream). */
typedef struct moec_cuda_opts {
    int max_seqs, max_seq_len;
    int single_stream;
    int eager;
} moec_cuda_opts;

/* 1 when MOEC_DISABLE_GRAPHS is set to anything but "" or "0". */
int moec_graphs_disabled(void);

/* AUTO becomes CUDA where a device is present, else CPU; CUDA is checked
 * to have a device (MOEC_ERR_NO_DEVICE otherwise). */
moec_status moec_resolve_backend(moec_backend *backend);

/* The compute dtype of CUDA work: bf16 unless MOEC_DTYPE says fp32. */
moec_status moec_cuda_dtype(ir_dtype *out);
/* Code generation options for compute dtype dt and target arch (NULL:
 * $MOEC_ARCH, else sm_90; moec --arch), the default buckets. */
moec_status moec_cg_options(ir_dtype dt, const char *arch, cg_options *out);
/* Every pass on a copy of module, compiled for co's dtype and buckets (a
 * failing pass leaves its input IR in $TMPDIR). */
moec_status moec_fuse(const ir_module *module, const cg_options *co, ir_module **fused);
moec_status moec_cuda_model_init(const moec_model_t *model, const char *weights_dir, ir_dtype dt,
                                 const moec_cuda_opts *o, moec_cuda_model *out);
/* The same from a plan file (no compiler call): moec_cuda_plan_read, then
 * moec_cuda_plan_bind. On failure x holds what was made (free it). */
moec_status moec_cuda_model_init_plan(const char *plan_path, const char *weights_dir,
                                      const moec_cuda_opts *o, moec_cuda_model *x, int *vocab);
/* MOEC_ERR_IO when plan_path is a directory. */
moec_status moec_check_plan_path(const char *plan_path);
/* Reads the plan file into x->plan and x->fused (x zeroed first). */
moec_status moec_cuda_plan_read(const char *plan_path, moec_cuda_model *x, rt_plan_meta *meta);
/* Binds a plan read into x for o: max_seq_len checked against the model's
 * max_position_embeddings, the plan checked against the checkpoint in
 * weights_dir (meta's hashes), weights uploaded, graphs captured; *vocab
 * gets the model's vocab_size. */
moec_status moec_cuda_plan_bind(moec_cuda_model *x, const rt_plan_meta *meta,
                                const char *plan_path, const char *weights_dir,
                                const moec_cuda_opts *o, int *vocab);
void moec_cuda_model_free(moec_cuda_model *x);

#endif
