/* stream.c — fork and join as event steps between the main stream (0) and
 * the side stream (1) that runs the shared experts: at a fork stream 1
 * waits for stream 0's work so far, at a join stream 0 waits for stream 1's.
 * The op's result is its operand, unchanged: plan_memory gives both one
 * arena offset, so the event is all there is; were they apart, the value
 * would be copied on the stream that reads it next (the fork's on stream 1,
 * after the wait; the join's on stream 0). */
#include "codegen/cg.h"
#include "err.h"

moec_status cg_emit_stream(cg_ctx *c, const ir_op *op)
{
    int fork = op->kind == IR_OP_FORK;
    if (!fork && op->kind != IR_OP_JOIN)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "cg_emit_stream: %s %%%s is not fork or join",
                        ir_op_name(op->kind), op->out[0]->name);
    if (op->stream != (fork ? 1 : 0))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s %%%s: runs on stream %d, not %d",
                        ir_op_name(op->kind), op->out[0]->name, op->stream, fork ? 1 : 0);
    ir_step *s = cg_step(c, fork ? IR_STEP_FORK : IR_STEP_JOIN, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: out of memory", ir_op_name(op->kind),
                        op->out[0]->name);
    return cg_emit_copy(c, op);
}
