/* ir.h — moec's static-graph IR: a module of named, typed values (inputs,
 * weights bound to checkpoint tensors, op results) and ops with typed
 * attributes, all living in one arena freed at once. The text form (see
 * ir_print.c) parses back to the same module; it is the interface between
 * passes, tests and people.
 *
 * Shapes are static except one symbolic token dimension T (IR_DIM_T), always
 * the first dimension of activations, specialized per batch bucket later.
 *
 * Op semantics are defined by the CPU interpreter (runtime/interp.c); the
 * table in ir_ops.c lists each op's operands, results and attributes. */
#ifndef MOEC_IR_H
#define MOEC_IR_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "moec_rt.h"

/* ---- arena ---------------------------------------------------------------- */

typedef struct ir_arena ir_arena;

ir_arena *ir_arena_init(void);
void ir_arena_free(ir_arena *a);
/* Zeroed, 16-byte aligned; NULL only when memory is exhausted. */
void *ir_arena_alloc(ir_arena *a, size_t size);
char *ir_arena_strdup(ir_arena *a, const char *s);

/* ---- types ---------------------------------------------------------------- */

typedef enum ir_dtype {
    IR_DTYPE_F32 = 0,
    IR_DTYPE_F16,
    IR_DTYPE_BF16,
    IR_DTYPE_I32,
    IR_DTYPE_F8E4M3, /* float8_e4m3fn: block-scaled weights only (ir_block_scale) */
    IR_DTYPE_COUNT,
} ir_dtype;

#define IR_MAX_RANK 4
#define IR_DIM_T (-1) /* the symbolic token dimension */

typedef struct ir_type {
    ir_dtype dtype;
    int rank;
    int64_t dims[IR_MAX_RANK];
} ir_type;

const char *ir_dtype_name(ir_dtype dt); /* "f32", "f16", "bf16", "i32", "f8e4m3" */
int ir_dtype_from_name(const char *name, ir_dtype *out); /* 0 on success */
size_t ir_dtype_size(ir_dtype dt);
/* Elements per token (product of all dims but a leading T), or of all dims. */
int64_t ir_type_numel(const ir_type *t, int64_t T);
int ir_type_equal(const ir_type *a, const ir_type *b);
/* Writes "bf16[T, 64]" into buf. */
void ir_type_format(const ir_type *t, char *buf, size_t cap);

/* ---- values --------------------------------------------------------------- */

typedef enum ir_value_kind {
    IR_VALUE_INPUT,  /* fed per step: token ids, positions */
    IR_VALUE_WEIGHT, /* bound to checkpoint tensors */
    IR_VALUE_OP,     /* the result of an op */
} ir_value_kind;

/* How a weight value is built from checkpoint tensors at load time.
 *   TENSOR:  one tensor, `"model.layers.0.mlp.gate.weight"`
 *   STACK:   `stack("model.layers.1.mlp.experts.{e}.up_proj.weight", 8)`:
 *            tensors with {e} = 0..count-1 stacked on a new leading axis
 *   CONCAT:  `concat(0, "a.weight", "b.weight", ...)`: parts (each a TENSOR
 *            or STACK binding) joined along `axis` (fused weights, issue 3) */
typedef enum ir_bind_kind {
    IR_BIND_TENSOR,
    IR_BIND_STACK,
    IR_BIND_CONCAT,
} ir_bind_kind;

typedef struct ir_binding {
    ir_bind_kind kind;
    const char *name;          /* TENSOR: tensor name; STACK: pattern with "{e}" */
    int count;                 /* STACK: number of experts */
    int axis;                  /* CONCAT */
    int n_parts;               /* CONCAT */
    struct ir_binding *parts;  /* CONCAT: TENSOR or STACK bindings */
    /* TENSOR and STACK: a box of the checkpoint tensor (a stack's dim 0 is
     * the expert index), what one rank of a sharded module reads:
     * `"o_proj.weight"[:, 32:64]`, `stack("...{e}...", 8)[4:8, 0:16, :]`.
     * box_rank 0: the whole tensor; else the weight's rank, and per dim
     * box_size[d] elements from box_start[d] (box_size 0: the whole dim). */
    int box_rank;
    int64_t box_start[IR_MAX_RANK];
    int64_t box_size[IR_MAX_RANK];
} ir_binding;

/* The box of leaf b over dims [from, box_rank) as the text form writes it,
 * "[4:8, :, 0:16]" (':' a whole dim), into buf; "(none)" without a box. */
void ir_binding_box_format(const ir_binding *b, int from, char *buf, size_t cap);

/* The name of tensor e of a TENSOR binding (e 0) or a STACK binding (its
 * pattern with every "{e}" replaced by e) into buf; -1 when it does not fit
 * in cap bytes or b is a CONCAT. */
int ir_binding_tensor_name(const ir_binding *b, int e, char *buf, size_t cap);

/* A block-scaled weight, as DeepSeek-V3/R1 and Qwen3-FP8 checkpoints store
 * their linears: float8_e4m3fn codes q with one f32 scale s per block of
 * block[0] x block[1] elements of the weight's last two dims (rows,
 * columns), edge blocks partial:
 *   W[..., i, j] = q[..., i, j] * s[..., i / block[0], j / block[1]]
 * `bind` binds the scale tensors, of shape [..., ceil(N / block[0]),
 * ceil(K / block[1])] (ir_block_scale_type), exactly as the weight's own
 * binding binds q: same kind, stack count, concat axis and parts. A leaf
 * of the weight that holds a box of its tensor (a rank's slice) starts it
 * on a block boundary along the last two dims, and its scales' leaf holds
 * the blocks that box touches (ir_block_scale_box). The
 * weight's dtype is f8e4m3 (kept quantized), or a float dtype when the
 * loader dequantizes it into that dtype. block[0] == 0: not block-scaled.
 *
 * Refined scales: `stored` (when nonzero) is the checkpoint's blocks, which
 * the scale tensors grid and which the leaves' boxes align to, and `block`
 * divides it: the loader repeats each stored scale over the finer blocks it
 * holds (exact: the same scale, more often). Fusion refines where parts
 * would otherwise not join: gate (10944 rows, 85.5 blocks of 128) with up
 * joins in blocks of 64 rows. Printed `block_scale[64, 128] from [128,
 * 128]`. */
typedef struct ir_block_scale {
    int64_t block[2];
    int64_t stored[2]; /* the checkpoint's blocks; 0: block's */
    ir_binding bind;
} ir_block_scale;

/* The greatest common divisor of a and b (>= 0; gcd(a, 0) = a): the rows
 * fused fp8 parts join in (pass_fuse), concat's common row width (copy). */
static inline int64_t ir_gcd(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The checkpoint's block of s along k (0 rows, 1 columns). */
static inline int64_t ir_block_scale_stored(const ir_block_scale *s, int k)
{
    return s->stored[k] ? s->stored[k] : s->block[k];
}

typedef struct ir_op ir_op;

typedef struct ir_value {
    const char *name; /* without the leading '%'; [A-Za-z0-9_.]+ */
    ir_type type;
    ir_value_kind kind;
    int id;            /* index in module->values */
    ir_op *def;        /* the op that defines it (IR_VALUE_OP) */
    ir_binding bind;   /* IR_VALUE_WEIGHT */
    ir_block_scale scale; /* IR_VALUE_WEIGHT: its block scales (block[0] == 0: none) */
    int64_t mem_offset; /* activations after plan_memory: byte offset per token in the
                           arena (offset = mem_offset * T); -1 before; printed "@256*T" */
} ir_value;

/* ---- attributes ----------------------------------------------------------- */

typedef enum ir_attr_kind {
    IR_ATTR_INT,   /* 42 */
    IR_ATTR_FLOAT, /* 1e-06 (printed shortest round-trip) */
    IR_ATTR_STR,   /* "neox" */
    IR_ATTR_INTS,  /* [0, 3] */
} ir_attr_kind;

typedef struct ir_attr {
    const char *key;
    ir_attr_kind kind;
    int64_t i;
    double f;
    const char *s;
    int n;          /* IR_ATTR_INTS */
    int64_t *ints;  /* IR_ATTR_INTS */
} ir_attr;

/* ---- ops ------------------------------------------------------------------ */

/* Each op's exact semantics: runtime/interp.c. Operands in order; [opt] may
 * be absent. Shapes: x is [T, ...] unless noted. */
typedef enum ir_op_kind {
    IR_OP_EMBEDDING,   /* (ids i32[T], table [V, H]) -> f32[T, H] */
    IR_OP_RMS_NORM,    /* (x [T, ..., D], w [D]) {eps} -> like x; over the last dim */
    IR_OP_LINEAR,      /* (x [T, K], w [N, K], [opt] b [N]) -> [T, N]; y = x w^T + b */
    IR_OP_RESHAPE,     /* (x) -> result type; same elements per token */
    IR_OP_SLICE,       /* (x) {axis, start, size} -> x with dim axis = size */
    IR_OP_CONCAT,      /* (a, b, ...) {axis} -> joined along axis */
    IR_OP_EXPAND,      /* (x) -> result type; dims of size 1 broadcast */
    IR_OP_ADD,         /* (a, b) -> a + b; b broadcasts where its dim is 1 */
    IR_OP_MUL,         /* (a, b) -> a * b; b broadcasts where its dim is 1 */
    IR_OP_SILU,        /* (x) -> x * sigmoid(x) */
    IR_OP_SIGMOID,     /* (x) -> 1 / (1 + exp(-x)) */
    IR_OP_ROPE,        /* (x [T, H, D], pos i32[T]) {style, theta, scaling, factor,
                          yarn_low, yarn_high, attn_factor} -> like x; rotates all D */
    IR_OP_ATTENTION,   /* (q [T, H, Dk], k [T, Hkv, Dk], v [T, Hkv, Dv], pos i32[T],
                          [opt] sel i32[T, K]) {scale, window} -> f32[T, H, Dv]; appends
                          k, v to this op's KV cache at their positions, causal over the
                          cache (with sel: over the positions sel chose) */
    IR_OP_MOE_TOPK,    /* (logits [T, E], [opt] bias [E]) {scoring, top_k, n_group,
                          topk_group, group_score, norm_topk_prob, scaling}
                          -> (ids i32[T, K], weights f32[T, K]) */
    IR_OP_MOE_EXPERTS, /* (x [T, H], ids i32[T, K], gate [E, I, H], up [E, I, H],
                          down [E, H, I]) or (x, ids, gate_up [E, 2I, H], down)
                          -> f32[T, K, H]: down(silu(gate x) * up x) per chosen expert */
    IR_OP_REDUCE_SUM,  /* (x) {axis} -> x with dim axis removed */
    /* Ops that passes introduce (docs/IR.md, "Fused and scheduled ops"). */
    IR_OP_SILU_MUL,    /* (x [T, ..., 2I]) -> [T, ..., I]: silu(x[..., :I]) * x[..., I:] */
    IR_OP_MOE_ROUTED,  /* (x [T, H], ids i32[T, K], w f32[T, K], gate_up [E, 2I, H], down [E, H, I])
                          or (x, ids, w, gate, up, down) {scale} -> f32[T, H]:
                          sum_k scale * w[t,k] * down_e(silu(gate_e x) * up_e x) */
    IR_OP_MLA_QABSORB, /* (q_nope [T, H, dn], kv_b [H*(dn+dv), r]) {qk_nope_head_dim, v_head_dim}
                          -> f32[T, H, r]: q_nope[t,h] times head h's k up-projection */
    IR_OP_MLA_ATTENTION, /* (q_c [T, H, r], q_pe [T, H, dr], kv_c [T, r], k_pe [T, 1, dr], pos,
                          [opt] sel i32[T, K]) {scale, window} -> f32[T, H, r]; caches only
                          kv_c and k_pe */
    IR_OP_MLA_VABSORB, /* (o_c [T, H, r], kv_b [H*(dn+dv), r]) {qk_nope_head_dim, v_head_dim}
                          -> f32[T, H, dv]: head h's v up-projection of o_c[t,h] */
    IR_OP_FORK,        /* (x) -> x on the op's (side) stream, which waits for x */
    IR_OP_JOIN,        /* (x) -> x on the main stream, which waits for the side stream */
    IR_OP_ADD_RMS_NORM, /* (a [T, D], b [T, D], w [D], [opt] c [T, D]) {eps, alpha} -> (sum
                          f32[T, D] = a + alpha*b, or a + alpha*(b + c), normed f32[T, D] =
                          rms_norm(sum, w)) */
    /* Collectives over the `ranks` ranks of a sharded module (pass shard;
     * docs/IR.md, "Collectives"): every rank runs the same collectives in
     * the same order. */
    IR_OP_ALL_REDUCE,     /* (x) {ranks} -> f32 like x: the sum of every rank's x */
    IR_OP_ALL_GATHER,     /* (x) {axis, ranks} -> dim axis * ranks: block r is rank r's x */
    IR_OP_REDUCE_SCATTER, /* (x) {axis, ranks} -> dim axis / ranks: block `rank` of the sum */
    IR_OP_ALL_TO_ALL,     /* (x) {axis, ranks} -> like x: block j is rank j's block `rank` */
    /* DeepSeek-V3.2's sparse attention (DSA). */
    IR_OP_LAYER_NORM,  /* (x [T, ..., D], w [D], b [D]) {eps} -> like x; (x - mean) /
                          sqrt(var + eps) * w + b over the last dim */
    IR_OP_DSA_TOPK,    /* (q [T, Hi, Di], k [T, Di], w [T, Hi], pos i32[T]) {top_k, scale,
                          weight_scale} -> i32[T, top_k]: appends k to this op's key cache,
                          scores every cached position p <= pos by sum_h w[h] * weight_scale *
                          relu(scale * q[h] . k[p]) and keeps the top_k best, ascending.
                          With {heads = Hi, q_col, w_col} q and w are [T, Nq], [T, Nw] rows
                          holding q and w at those columns; with rope's attributes (and
                          rotary_dim) q is rotated at pos first (pass fuse_dsa_indexer) */
    /* MLA's prologue (pass fuse_mla_prologue; docs/IR.md, "mla_prologue"): what
     * reads a row of the fused q/kv projection, one op instead of its slices,
     * RMSNorms and ropes. x [T, N]: the sections a row holds, from column 0;
     * columns past them are not read. Rope attributes as rope's. */
    IR_OP_MLA_PROLOGUE,   /* (x [T, N], pos, kv_norm [r]) {heads, qk_nope_head_dim,
                             qk_rope_head_dim, eps, rope's} -> (q_nope f32[T, H, dn], q_pe
                             f32[T, H, dr] rotated, kv_c f32[T, r] normed, k_pe f32[T, 1, dr]
                             rotated); x = [H heads of dn + dr | r | dr] */
    IR_OP_MLA_PROLOGUE_KV, /* (x [T, N], pos, kv_norm [r], q_norm [qr]) {qk_rope_head_dim, eps,
                             rope's} -> (q_a f32[T, qr] normed, kv_c, k_pe as above);
                             x = [qr | r | dr] (q LoRA models) */
    IR_OP_MLA_PROLOGUE_Q, /* (x [T, N], pos) {heads, qk_nope_head_dim, qk_rope_head_dim,
                             rope's} -> (q_nope, q_pe as above); x = [H heads of dn + dr] */
    IR_OP_DSA_PROLOGUE_K, /* (x [T, N], pos, w [D], b [D]) {col, eps, rope's, rotary_dim} ->
                             f32[T, D]: the DSA indexer's key, layer_norm of x's columns
                             [col, col + D) then rope of its first rotary_dim channels
                             (pass fuse_dsa_indexer; docs/IR.md, "dsa_prologue_k") */
    IR_OP_ATTN_PROLOGUE,  /* (x [T, N], pos, [q_norm [D], k_norm [D]]) {heads, kv_heads,
                             head_dim, [eps], rope's, rotary_dim} -> (q f32[T, H, D], k
                             f32[T, Hkv, D], v f32[T, Hkv, D]); x = [H heads | Hkv | Hkv] of
                             D, q and k normed (with the weights) then rotated: GQA's
                             prologue (pass fuse_attn_prologue; docs/IR.md, "attn_prologue") */
    IR_OP_COUNT,
} ir_op_kind;

#define IR_MAX_OPERANDS 8
#define IR_MAX_RANKS 64 /* most ranks a collective spans */
#define IR_MAX_RESULTS 4
#define IR_MAX_ATTRS 16

struct ir_op {
    ir_op_kind kind;
    int id;                           /* index in module->ops */
    int n_in;
    ir_value *in[IR_MAX_OPERANDS];
    int n_out;
    ir_value *out[IR_MAX_RESULTS];
    int n_attr;
    ir_attr attrs[IR_MAX_ATTRS];
    int stream;                       /* 0 main, 1 side (assign_streams); printed "stream 1" */
};

/* Buckets of up to IR_DUAL_STREAM_MAX_T tokens, and from
 * IR_DUAL_STREAM_FROM_T up (ir_dual_stream_from_t), replay the side stream
 * beside the main one; those between run on the main stream alone (the runtime's
 * MOEC_DUAL_STREAM_MAX_T and MOEC_DUAL_STREAM_FROM_T defaults, which
 * codegen reads too where a kernel suits one stream only). */
#define IR_DUAL_STREAM_MAX_T 16
#define IR_DUAL_STREAM_FROM_T 32

/* 1 when a bucket of T tokens replays the side stream beside the main one
 * under the limits max_t and from_t (from_t 0: never again from there). */
static inline int ir_bucket_two_streams(int T, int max_t, int from_t)
{
    return T <= max_t || (from_t > 0 && T >= from_t);
}

const char *ir_op_name(ir_op_kind k); /* "linear" */
int ir_op_kind_from_name(const char *name, ir_op_kind *out); /* 0 on success */

/* Attribute lookup; NULL when absent. */
const ir_attr *ir_op_attr(const ir_op *op, const char *key);
int64_t ir_op_attr_int(const ir_op *op, const char *key, int64_t dflt);
double ir_op_attr_float(const ir_op *op, const char *key, double dflt);
const char *ir_op_attr_str(const ir_op *op, const char *key, const char *dflt);

/* ---- module --------------------------------------------------------------- */

typedef struct ir_module {
    ir_arena *arena;
    const char *name;      /* the model_type: "deepseek_v2", ... */
    int n_meta;            /* module attributes: vocab_size, max_position_embeddings ... */
    ir_attr *meta;
    int meta_cap;
    int n_values, values_cap;
    ir_value **values;     /* every value, in definition order */
    struct ir_name_map *index; /* name -> value, owned (malloc); rebuilt when
                                * stale (see ir_value_rename) */
    int index_stale;
    int n_ops, ops_cap;
    ir_op **ops;           /* in execution order */
    int n_inputs;
    ir_value *inputs[8];
    int n_outputs;
    ir_value *outputs[8];
} ir_module;

/* An empty module named `name`; NULL when memory is exhausted. */
ir_module *ir_module_init(const char *name);
void ir_module_free(ir_module *m);

const ir_attr *ir_module_meta(const ir_module *m, const char *key);
int64_t ir_module_meta_int(const ir_module *m, const char *key, int64_t dflt);
/* An int or int-list meta as a list: *v (into the module) gets its values;
 * returns how many (0, *v NULL, when absent or of another kind). */
int ir_module_meta_ints(const ir_module *m, const char *key, const int64_t **v);

ir_value *ir_module_find_value(const ir_module *m, const char *name);
/* Gives v the name `name` (an arena string of m, or one that outlives it).
 * Every change of a value's name, and every removal of values from
 * m->values, goes through here or ir_module_values_changed so that
 * ir_module_find_value's index stays true. */
void ir_value_rename(ir_module *m, ir_value *v, const char *name);
void ir_module_values_changed(ir_module *m);

/* ---- building --------------------------------------------------------------
 * Builders only record. Each returns the new value (or op), or NULL with the
 * error recorded (duplicate name, shape that does not agree, no memory). */

moec_status ir_module_set_meta_int(ir_module *m, const char *key, int64_t v);
moec_status ir_module_set_meta_ints(ir_module *m, const char *key, const int64_t *v, int n);
moec_status ir_module_set_meta_float(ir_module *m, const char *key, double v);
moec_status ir_module_set_meta_str(ir_module *m, const char *key, const char *v);

ir_value *ir_module_add_input(ir_module *m, const char *name, ir_type type);
/* A weight bound to one checkpoint tensor. */
ir_value *ir_module_add_weight(ir_module *m, const char *name, ir_type type, const char *tensor);
/* A weight bound to count tensors named by pattern with "{e}" replaced by 0..count-1. */
ir_value *ir_module_add_weight_stack(ir_module *m, const char *name, ir_type type,
                                     const char *pattern, int count);
/* A weight with any binding (deep-copied into the module's arena). */
ir_value *ir_module_add_weight_bound(ir_module *m, const char *name, ir_type type,
                                     const ir_binding *bind);
moec_status ir_module_add_output(ir_module *m, ir_value *v);
/* Makes weight w block-scaled by blocks of rows x cols (the checkpoint's),
 * its scales bound by `scale` (deep-copied; it must mirror w's binding);
 * checked as the verifier checks it. */
moec_status ir_weight_set_block_scale(ir_module *m, ir_value *w, int64_t rows, int64_t cols,
                                      const ir_binding *scale);
/* Block-scaled weight w's blocks made rows x cols, each dividing the
 * checkpoint's blocks its scales grid (which stay `stored`); checked. */
moec_status ir_weight_refine_block_scale(ir_module *m, ir_value *w, int64_t rows, int64_t cols);
/* The f32 type of block-scaled weight w's scales: w's dims with the last
 * two divided by the block, rounded up. */
ir_type ir_block_scale_type(const ir_value *w);
/* 1 when block-scaled weight w's scale blocks hold whole 16-row tiles and
 * 64-wide k chunks (what the staged fp8 kernels, codegen/fp8_tc.c, need;
 * fuse_silu_mul_linear asks before it gives an fp8 linear act). */
static inline int ir_block_scale_tiles(const ir_value *w)
{
    return w->scale.block[0] > 0 && w->scale.block[0] % 16 == 0 && w->scale.block[1] % 64 == 0;
}
/* The box of the scales that leaf b (a TENSOR or STACK binding of a
 * block-scaled weight of `rank` dims, blocks of block[0] x block[1]) reads:
 * along the last two dims the blocks its box touches, [start / block,
 * ceil(end / block)); along the others (a stack's experts) its own box;
 * none when b has none. Written into s's box; s's kind, name and count are
 * left as they are. */
void ir_block_scale_box(const ir_binding *b, int rank, const int64_t *block, ir_binding *s);

/* Appends an op; result types come from ir_op_infer unless out_types is given
 * (then they must agree with it). out_names has n_out entries. Attributes are
 * added after with ir_op_set_*, before the op is used; call ir_op_finish to
 * infer and check the result types once all attributes are set. */
ir_op *ir_module_add_op(ir_module *m, ir_op_kind kind, ir_value *const *in, int n_in,
                        const char *const *out_names, int n_out);
moec_status ir_op_set_int(ir_module *m, ir_op *op, const char *key, int64_t v);
moec_status ir_op_set_float(ir_module *m, ir_op *op, const char *key, double v);
moec_status ir_op_set_str(ir_module *m, ir_op *op, const char *key, const char *v);
moec_status ir_op_set_ints(ir_module *m, ir_op *op, const char *key, const int64_t *v, int n);
/* Infers the result types (for RESHAPE and EXPAND, pass the wanted type in
 * `hint`; others ignore it) and checks operands; records the error naming
 * the op's first result on failure. */
moec_status ir_op_finish(ir_module *m, ir_op *op, const ir_type *hint);

/* Convenience: one-result op with no attributes, finished. */
ir_value *ir_build(ir_module *m, ir_op_kind kind, const char *name, ir_value *const *in, int n_in);

/* ---- rewriting (passes) ----------------------------------------------------
 * Passes rewrite a module in place: add new ops with ir_module_add_op (they
 * go to the end), move them where they belong, redirect uses, then drop
 * what became dead. */

/* Moves op to just before anchor (anchor NULL: to the end); renumbers ops. */
moec_status ir_module_move_op_before(ir_module *m, ir_op *op, const ir_op *anchor);
/* Every operand (and module output) that is `from` becomes `to`, except in
 * the op that defines `to` (so `y = fork(x)` can take over x's other uses). */
void ir_module_replace_uses(ir_module *m, const ir_value *from, ir_value *to);
/* Operand slots (and outputs) that use v. */
int ir_module_use_count(const ir_module *m, const ir_value *v);
/* The op using v when exactly one op uses it once and it is not an output; else NULL. */
ir_op *ir_module_single_user(const ir_module *m, const ir_value *v);
/* The default from_t of module m's plans: IR_DUAL_STREAM_FROM_T where m has
 * a side stream, else 0. Where the side stream reads fp8 weights (its
 * linears then run generated kernels at every bucket) it runs the shared
 * expert beside the routed experts there, else beside the router
 * (cg_place_forks). (H200, 2026-11-29, bf16 V2-Lite at 32 / 64 tokens,
 * the shared expert beside the router: 9.286 / 10.199 ms against 9.509 /
 * 10.458 on one stream.) (H100, 2026-11-25, V2-Lite bf16 at 64
 * tokens, whose side stream runs cuBLASLt GEMMs: two streams 13.69 ms in a
 * process that ran no other bucket, but 14.57-14.74 once the one-token
 * bucket's graph had run, in five runs; one stream 13.80-13.82 either way.
 * fp8: two streams 9.40 after the one-token bucket, one stream ~0.35 ms
 * slower. H200, 2026-11-29, fp8 V2-Lite at 32 tokens with the fork after
 * the routing, cg_place_forks: 5.826 against 6.147 on one stream.) */
int ir_dual_stream_from_t(const ir_module *m);
/* 1 where an op of m's side stream reads fp8 weights. */
int ir_side_stream_fp8(const ir_module *m);
/* Removes ops none of whose results are used (repeatedly), then weights and
 * inputs nothing uses (but never "tokens"/"positions"); renumbers values and
 * ops. */
moec_status ir_module_dce(ir_module *m);
/* A fresh name "<base>" or "<base>.N" not yet used in m (in m's arena). */
const char *ir_module_unique_name(ir_module *m, const char *base);
/* A deep copy (through the text form). */
moec_status ir_module_clone(const ir_module *m, ir_module **out);

/* ---- checking, printing, parsing ------------------------------------------ */

/* Computes the result types of op from its operands and attributes into
 * out[0..n_out-1]. For RESHAPE/EXPAND the result type is op->out[0]->type
 * (checked for agreement). Errors name the op's first result. */
moec_status ir_op_infer(const ir_op *op, ir_type *out);

/* Types and shapes agree, one definition per value, no use before definition,
 * in a sharded module (meta tp) every collective over tp ranks,
 * only known attributes of the right kind (required ones present), weights
 * bound, names unique; and among activations with arena offsets, no two
 * share bytes while both are live (ir_module_live_ranges), but for a
 * reshape, fork or join result at exactly its operand's offset (an alias:
 * the two are then live as one). The error names the first offending value. */
moec_status ir_module_verify(const ir_module *m);

/* ---- the memory plan ------------------------------------------------------- */

/* 1 for the ops whose result may share its operand's arena bytes after
 * plan_memory (reshape, fork, join: the same bytes, so no copy). */
int ir_op_may_alias(ir_op_kind kind);
/* When each value's bytes are needed, in op indices, inclusive: from its
 * defining op (inputs: -1) to its last use (outputs: n_ops), stretched over
 * every fork..join interval that touches it (the streams interleave there).
 * start and end have n_values entries (weights': meaningless). Needs op ids
 * equal to their index, as in a verified module. 0, or -1 when out of memory. */
int ir_module_live_ranges(const ir_module *m, int *start, int *end);

moec_status ir_module_print(const ir_module *m, FILE *out);
/* The text into a malloc'd string (caller frees). */
char *ir_module_print_str(const ir_module *m);

/* Parses IR text; a malformed file gives MOEC_ERR_FORMAT with
 * "<filename>:<line>:<col>: message". The result is verified. */
moec_status ir_module_parse(const char *text, const char *filename, ir_module **out);

#endif
