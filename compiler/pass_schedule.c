/* pass_schedule.c — placeholder until the pass lands. */
#include "compiler/passes.h"
#include "err.h"
moec_status pass_assign_streams(ir_module *m, const pass_options *opt) { return MOEC_ERR(MOEC_ERR_INTERNAL, "pass assign_streams is not implemented"); }
moec_status pass_plan_memory(ir_module *m, const pass_options *opt) { return MOEC_ERR(MOEC_ERR_INTERNAL, "pass plan_memory is not implemented"); }
