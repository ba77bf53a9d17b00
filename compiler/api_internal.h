/* api_internal.h — what the compiler's API glue (compiler/moec_*.c) and the
 * tests may ask of the public handles beyond engine/engine_internal.h: a
 * model's module, and a model compiled in-process and bound to the GPU. */
#ifndef MOEC_API_INTERNAL_H
#define MOEC_API_INTERNAL_H

#include "codegen/cg.h"
#include "engine/engine_internal.h"
#include "moec.h"
#include "runtime/plan_check.h"

/* The model's unfused, verified module (owned by the model). */
const ir_module *moec_model_module(const moec_model_t *model);

/* The compute dtype of CUDA work: bf16 unless MOEC_DTYPE says fp32. */
moec_status moec_cuda_dtype(ir_dtype *out);
/* Code generation options for compute dtype dt and target arch (NULL:
 * $MOEC_ARCH, else sm_90; moec --arch), the default buckets. */
moec_status moec_cg_options(ir_dtype dt, const char *arch, cg_options *out);
/* Every pass on a copy of module, compiled for co's dtype and buckets (a
 * failing pass leaves its input IR in $TMPDIR). */
moec_status moec_fuse(const ir_module *module, const cg_options *co, ir_module **fused);
/* The same for rank `rank` of par (NULL or tp 0: unsharded, as moec_fuse). */
moec_status moec_fuse_rank(const ir_module *module, const cg_options *co,
                           const moec_parallel *par, int rank, ir_module **fused);
/* Every rank's module of par (tp of them into mods[0 .. tp-1]) for the CPU
 * reference interpreter: the pipeline compiled for f32. On failure none
 * is left. */
moec_status moec_fuse_ranks_cpu(const moec_model_t *model, const moec_parallel *par,
                                ir_module **mods);
/* Every pass on a copy of the model's module, the checkpoint checked
 * against the fused weights, the plan built and compiled, then bound. */
moec_status moec_cuda_model_init(const moec_model_t *model, const char *weights_dir, ir_dtype dt,
                                 const moec_cuda_opts *o, moec_cuda_model *out);

/* A model split by par compiled for CUDA into a plan file of its own in a
 * fresh scratch directory under $TMPDIR (else /tmp): path (cap bytes) gets
 * DIR/model.moec. How a session or an engine runs a model split over ranks
 * on CUDA: the same plan and the same rank group as `moec compile --tp`
 * then `moec run PLAN`. Nothing is left on failure. */
moec_status moec_compile_scratch(const moec_model_t *model, const char *weights_dir,
                                 const moec_parallel *par, ir_dtype dt, char *path, size_t cap);
/* Removes a plan of moec_compile_scratch and its directory (once opened:
 * the plan is read whole at open). */
void moec_compile_scratch_remove(const char *path);

#endif
