/* weights.h — the weights an IR module binds, resolved against a checkpoint:
 * every weight value's binding (a tensor, a stack of per-expert tensors, or a
 * concatenation) is checked for presence, shape and dtype before anything
 * runs. A tensor may be stored in the IR's dtype or a narrower float type
 * (it is widened); a block-scaled weight (ir_block_scale) is stored as
 * F8_E4M3 beside F32 scale tensors of the block grid's shape, all finite;
 * anything else is a MOEC_ERR_MISMATCH naming the tensor. */
#ifndef MOEC_RT_WEIGHTS_H
#define MOEC_RT_WEIGHTS_H

#include "ir/ir.h"
#include "runtime/safetensors.h"

typedef struct rt_weights rt_weights;

/* Opens the checkpoint in dir and checks every weight of m. */
moec_status rt_weights_open(const ir_module *m, const char *dir, rt_weights **out);
void rt_weights_free(rt_weights *w);

/* Writes weight v (a weight value of the module given to open) as fp32,
 * ir_type_numel(&v->type, 0) floats, in the layout of v's type. A
 * block-scaled weight is dequantized exactly: each code decoded, times its
 * block's scale, one fp32 multiply. */
moec_status rt_weights_read_f32(const rt_weights *w, const ir_value *v, float *dst);

/* Writes block-scaled weight v (of dtype f8e4m3) as it is stored: its
 * codes, ir_type_numel(&v->type, 0) bytes in the layout of v's type, and
 * its scales, f32 in the layout of ir_block_scale_type(v), stacked and
 * concatenated as v's binding assembles its tensors (the loader checked
 * that the parts of a concatenation along a blocked axis line up with the
 * blocks). A weight bound to boxes of its tensors (a rank's slices, which
 * start on block boundaries) reads the codes of its boxes and the scales of
 * the blocks they touch, nothing else. Nothing is converted: the GPU
 * kernels read these bytes. */
moec_status rt_weights_read_f8(const rt_weights *w, const ir_value *v, uint8_t *codes,
                               float *scales);

/* Widens checkpoint tensor t (F32, F16, BF16 or I32: not fp8, which needs
 * its scales) into dst, one float per element; MOEC_ERR_INVALID_ARG naming
 * the tensor for another dtype. */
moec_status rt_tensor_read_f32(const rt_st_tensor *t, float *dst);

/* The value of a float8_e4m3fn code (OCP FP8 E4M3: bias 7, subnormals,
 * no infinities, NaN only at 0x7f and 0xff; largest 448), exact in fp32. */
float rt_f8e4m3_to_f32(uint8_t code);

#endif
