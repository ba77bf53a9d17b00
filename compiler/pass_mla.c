/* pass_mla.c — placeholder until the pass lands. */
#include "compiler/passes.h"
#include "err.h"
moec_status pass_absorb_mla(ir_module *m, const pass_options *opt) { return MOEC_ERR(MOEC_ERR_INTERNAL, "pass absorb_mla is not implemented"); }
