/* pass_fuse.c — placeholder until the pass lands. */
#include "compiler/passes.h"
#include "err.h"
moec_status pass_fuse_qkv_a(ir_module *m, const pass_options *opt) { return MOEC_ERR(MOEC_ERR_INTERNAL, "pass fuse_qkv_a is not implemented"); }
moec_status pass_fuse_gate_up(ir_module *m, const pass_options *opt) { return MOEC_ERR(MOEC_ERR_INTERNAL, "pass fuse_gate_up is not implemented"); }
moec_status pass_fuse_silu_and_mul(ir_module *m, const pass_options *opt) { return MOEC_ERR(MOEC_ERR_INTERNAL, "pass fuse_silu_and_mul is not implemented"); }
moec_status pass_fuse_router_weight(ir_module *m, const pass_options *opt) { return MOEC_ERR(MOEC_ERR_INTERNAL, "pass fuse_router_weight is not implemented"); }
