/* pass_fold_scale.c — placeholder until the pass lands. */
#include "compiler/passes.h"
#include "err.h"
moec_status pass_fold_routed_scale(ir_module *m, const pass_options *opt) { return MOEC_ERR(MOEC_ERR_INTERNAL, "pass fold_routed_scale is not implemented"); }
