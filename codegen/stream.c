/* stream.c — fork and join as event steps between the main stream (0) and
 * the side stream (1) that runs the shared experts: at a fork stream 1
 * waits for stream 0's work so far, at a join stream 0 waits for stream 1's.
 * The op's result is its operand, unchanged: plan_memory gives both one
 * arena offset, so the event is all there is; were they apart, the value
 * would be copied on the stream that reads it next (the fork's on stream 1,
 * after the wait; the join's on stream 0). */
#include <string.h>

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

int cg_two_streams(const cg_ctx *c)
{
    int max = cg_env_int("MOEC_DUAL_STREAM_MAX_T", IR_DUAL_STREAM_MAX_T, 0, 1 << 20);
    int from = cg_env_int("MOEC_DUAL_STREAM_FROM_T", ir_dual_stream_from_t(c->m), 0, 1 << 20);
    if (!ir_bucket_two_streams(c->T, max, from))
        return 0;
    return c->T <= max ? 1 : 2;
}

static int is_launch(const ir_step *s)
{
    return s->stream == 0 && (s->kind == IR_STEP_KERNEL || s->kind == IR_STEP_GEMM);
}

/* The main-stream launches after fork step i up to and including the last
 * one of a moe_topk before anything else; 0 when there is none. */
static int routing_launches(const cg_ctx *c, int i)
{
    int n = 0;
    for (int j = i + 1; j < c->n_steps && is_launch(&c->steps[j]); j++) {
        int op = c->steps[j].op_id;
        if (op >= 0 && op < c->m->n_ops && c->m->ops[op]->kind == IR_OP_MOE_TOPK)
            n = j - i;
    }
    return n;
}

/* Moves step k to w (w <= k), the steps from w on one later. */
static void step_to(cg_ctx *c, int k, int w)
{
    ir_step s = c->steps[k];
    memmove(&c->steps[w + 1], &c->steps[w], sizeof s * (size_t)(k - w));
    c->steps[w] = s;
}

/* The shared expert beside the routing (MOEC_SHARED_FIRST): the side
 * stream's steps between fork step i and its join right after the fork,
 * the join right before the first launch of a moe_routed (the routed
 * experts wait for the shared expert, which ran beside the router); the
 * pair stays when there is no such launch. Returns the join's index. */
static int shared_first(cg_ctx *c, int i)
{
    int j = i + 1, r = -1;
    while (j < c->n_steps && c->steps[j].kind != IR_STEP_JOIN && c->steps[j].kind != IR_STEP_FORK)
        j++;
    if (j >= c->n_steps || c->steps[j].kind != IR_STEP_JOIN)
        return i;
    for (int k = i + 1; k < j && r < 0; k++) {
        int op = c->steps[k].op_id;
        if (is_launch(&c->steps[k]) && op >= 0 && op < c->m->n_ops &&
            c->m->ops[op]->kind == IR_OP_MOE_ROUTED)
            r = k;
    }
    if (r < 0)
        return j;
    int w = i + 1;
    for (int k = i + 1; k < j; k++)
        if (c->steps[k].stream == 1) {
            step_to(c, k, w++);
            r += k > r; /* a side step from past r moved in front of it */
        }
    if (cg_env_int("MOEC_SHARED_JOIN", 1, 0, 1)) /* 0: the join stays, for A/B runs */
        step_to(c, j, r);
    return j;
}

/* The shared expert's tail where it forks after the routing: its
 * silu_mul's kernel and the linear that reads it (its down projection) on
 * the side stream launch at the device's greatest priority (the step's
 * prio), so that they take SMs before the routed down's blocks still
 * waiting for one and the join after them waits less. (H200, 2026-11-30,
 * fp8 V2-Lite step: 6.930 / 6.939 / 6.939 ms at 64 tokens in three A/B
 * pairs against 6.969 / 6.976 / 6.975, 5.779 against 5.776 at 32; the
 * silu_mul alone 6.979 against 6.963. MOEC_SIDE_PRIO=0: none, here and
 * below.) */
/* The shared gate_up at that priority too (MOEC_PRIO_HIGH naming it beside
 * the plan's two): fp8 V2-Lite at 8 / 32 / 64 tokens 3.625 / 5.713 / 6.850
 * ms against 3.625 / 5.570 / 6.635 (H200, 2026-11-30): slower, its blocks
 * then hold SMs the routed gate_up's would take. */
/* Where the shared expert forks before the router (few tokens), its fp8
 * tail at that priority too up to SIDE_PRIO_FEW_T tokens. At batch 1 the
 * side stream ended last, 2.6-3.3 us a layer after the routed down: its
 * silu_mul and down each waited 3-5 us for SMs behind the routed gate_up's
 * blocks. (H200, 2026-11-30, fp8 V2-Lite step at 1 / 2 / 4 / 8 / 16
 * tokens: 1.397 / 1.867 / 2.660 / 3.683 / 4.745 ms with the tail at that
 * priority against 1.453 / 1.825 / 2.551 / 3.602 / 4.706: from 2 tokens
 * the routed experts' branch is the longer one. Again at batch 1: 1.397,
 * the silu_mul alone 1.393, the down alone 1.404, against 1.452.
 * Qwen1.5-MoE-A2.7B in fp8, whose shared expert reads as many bytes as its
 * routed ones: 1.375 against 1.465 at batch 1, 1.755 against 1.756 at 2.
 * DeepSeek-V3's shape, 6 layers, where the routed experts read 8 times
 * the shared one's bytes: 1.649 against 1.653 at batch 1. bf16 at batch
 * 1, whose shared down reads h through its act: V2-Lite 1.890 against
 * 1.812, Qwen1.5-MoE-A2.7B 1.856 against 1.799, so none.)
 * MOEC_SIDE_PRIO_FEW_T=0: none. */
#define SIDE_PRIO_FEW_T 1
static void side_tail_prio(cg_ctx *c)
{
    for (int i = 0; i < c->n_steps; i++) {
        ir_step *s = &c->steps[i];
        int op = s->op_id;
        if (s->kind != IR_STEP_KERNEL || s->stream != 1 || op < 0 || op >= c->m->n_ops)
            continue;
        const ir_op *o = c->m->ops[op];
        const ir_op *src = o->n_in > 0 && o->in[0]->kind == IR_VALUE_OP ? o->in[0]->def : NULL;
        s->prio = o->kind == IR_OP_SILU_MUL ||
                  (o->kind == IR_OP_LINEAR &&
                   (ir_op_attr(o, "act") || (src && src->kind == IR_OP_SILU_MUL)));
    }
}

void cg_place_forks(cg_ctx *c)
{
    /* (H200, 2026-11-29, fp8 V2-Lite step, ms at 32 / 64 tokens: two
       streams with the fork after the one-launch router 5.826 / 7.162
       against 6.147 one stream / 7.312 two streams with the fork before
       the router's GEMM; after the GEMM 5.908 / 7.218, after the align
       5.888 / 7.272. At 1 and 8 tokens, where the shared expert is the
       longer branch, a later fork was slower: 1.547-1.678 against 1.458 at
       batch 1. bf16 at 32 and 64 on two streams this way: 9.544 / 10.633
       against 9.505 / 10.482 on one. With the shared expert beside the
       router instead, shared_first, bf16 9.286 / 10.199 against 9.509 /
       10.458 on one stream, fp8 6.060 / 7.432 against 5.842 / 7.213 with
       the fork after the routing: where the side stream reads bf16 the
       routed experts fill the GPU and starve a shared expert beside them.) */
    int delay = cg_env_int("MOEC_FORK_DELAY", -1, -1, 16);
    int two = delay < 0 ? cg_two_streams(c) : 0, fp8 = ir_side_stream_fp8(c->m);
    int routing = two == 2;
    int first = routing && cg_env_int("MOEC_SHARED_FIRST", !fp8, 0, 1);
    int few = two == 1 && fp8 &&
              c->T <= cg_env_int("MOEC_SIDE_PRIO_FEW_T", SIDE_PRIO_FEW_T, 0, 1 << 20);
    if (((routing && !first) || few) && cg_env_int("MOEC_SIDE_PRIO", 1, 0, 1))
        side_tail_prio(c);
    for (int i = 0; i < c->n_steps; i++) {
        if (c->steps[i].kind != IR_STEP_FORK)
            continue;
        if (first) {
            i = shared_first(c, i);
            continue;
        }
        int n = routing ? routing_launches(c, i) : delay > 0 ? delay : 0, j = i;
        while (n-- > 0 && j + 1 < c->n_steps && is_launch(&c->steps[j + 1]))
            j++;
        if (j == i)
            continue;
        ir_step fork = c->steps[i];
        memmove(&c->steps[i], &c->steps[i + 1], sizeof fork * (size_t)(j - i));
        c->steps[j] = fork;
        i = j;
    }
}
