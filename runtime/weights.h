/* weights.h — the weights an IR module binds, resolved against a checkpoint:
 * every weight value's binding (a tensor, a stack of per-expert tensors, or a
 * concatenation) is checked for presence, shape and dtype before anything
 * runs. A tensor may be stored in the IR's dtype or a narrower float type
 * (it is widened); anything else is a MOEC_ERR_MISMATCH naming the tensor. */
#ifndef MOEC_RT_WEIGHTS_H
#define MOEC_RT_WEIGHTS_H

#include "ir/ir.h"
#include "runtime/safetensors.h"

typedef struct rt_weights rt_weights;

/* Opens the checkpoint in dir and checks every weight of m. */
moec_status rt_weights_open(const ir_module *m, const char *dir, rt_weights **out);
void rt_weights_free(rt_weights *w);

/* Writes weight v (a weight value of the module given to open) as fp32,
 * ir_type_numel(&v->type, 0) floats, in the layout of v's type. */
moec_status rt_weights_read_f32(const rt_weights *w, const ir_value *v, float *dst);

#endif
