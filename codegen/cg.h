/* cg.h — code generation for the CUDA backend: per batch bucket, every kernel
 * op of the fused IR emits CUDA C source with its shapes, counts and dtypes
 * baked in as literals (into one program per bucket, compiled once with
 * NVRTC) and the launch steps that run it (ir/ir_plan.h). One op per
 * codegen file (codegen/<op>.c); this header is the contract between them. */
#ifndef MOEC_CG_CG_H
#define MOEC_CG_CG_H

#include <stdarg.h>

#include "ir/ir.h"
#include "ir/ir_plan.h"
#include "strbuf.h"

/* Makes every kernel in the generated source begin with moec_pdl_enter()
 * (the prologue's programmatic-dependent-launch wait and trigger), which
 * the runtime's launches rely on (docs/CUDA.md). A kernel body that already
 * has a line "    moec_pdl_enter();" keeps it where it is: such a kernel
 * may issue moec_prefetch_l2 of its weights (or of its cache rows, found
 * from the step inputs) before it, and nothing else (no read of a value
 * an earlier kernel writes, no write but to its own shared memory): the
 * staged kernels load their first weights there, and the MLA attention
 * its first cache tiles where no kernel of the step writes their rows
 * (codegen/mla_attention.c, MLA_EARLY). */
void cg_add_pdl_waits(moec_buf *b);

/* L2 prefetch before the wait: in buckets of up to CG_PREFETCH_MAX_T
 * tokens the weight-streaming kernels (the few-token linear, the MLA
 * absorptions, the staged fp8 linear) have each block prefetch its own
 * weight rows (and their block scales) with moec_prefetch_l2 before its
 * moec_pdl_enter, the RMSNorms their weight, and the attention kernels (GQA, dense MLA) their cache
 * rows, found from the step inputs (positions, slots, block table: the
 * runtime copies them before the step's first kernel, and no kernel
 * writes them); at most MOEC_PREFETCH_KB KiB a block (read at code
 * generation, 0 to CG_PREFETCH_KB_MAX; 0: off, the kernels exactly as
 * without it). The cap is a constant of their source (PF_CAP), so the
 * cubin cache tells the variants apart (cg_prefetch_bytes,
 * cg_emit_prefetch). MOEC_PREFETCH_MAX_T overrides the bucket bound, an
 * A/B knob: (H200, 2026-11-29, V2-Lite's whole step, two calls, up to 64
 * against 8, ms at 32 / 64 tokens: bf16 9.043 / 9.920 against 9.053 /
 * 9.942 and 9.047 / 9.906 against 9.052 / 9.939; fp8 5.808 / 7.110
 * against 5.766 / 7.151 and 5.812 / 7.093 against 5.769 / 7.137: fp8 0.7%
 * slower at 32, both at most 0.6% faster at 64; 256 KiB a block no
 * better.) */
#define CG_PREFETCH_MAX_T 8
#define CG_PREFETCH_KB 64
#define CG_PREFETCH_KB_MAX 4096

enum { CG_MOE_AUTO = 0, CG_MOE_SIMT, CG_MOE_MMA };
/* Kernels of fp8 weights: CG_FP8_AUTO takes the tensor-core kernels that
 * stage the activations in shared memory (codegen/fp8_tc.h) where the old
 * ones took tensor cores, CG_FP8_OLD the kernels before them (few-rows
 * linear, tensor-core linear re-reading x per 16 rows, CUDA-core and
 * tensor-core experts), CG_FP8_TC the staged kernels wherever the shapes
 * allow (the few-token buckets too), for comparisons. */
enum { CG_FP8_AUTO = 0, CG_FP8_OLD, CG_FP8_TC };

typedef struct cg_options {
    ir_dtype compute_dtype;   /* BF16 (default) or F32 */
    char arch[16];            /* "sm_90" */
    int kv_block_size;        /* tokens per KV page (64) */
    int n_buckets;
    int buckets[IR_BUCKETS_MAX]; /* ascending batch buckets T (ir_plan.h) */
    const char *cache_dir;    /* cubin cache (NULL: $MOEC_CACHE_DIR or ~/.cache/moec) */
    int moe_kernel;           /* routed-expert GEMMs: CG_MOE_AUTO (default), CG_MOE_SIMT
                               * (CUDA cores) or CG_MOE_MMA (tensor cores, bf16 only) */
    int fp8_kernel;           /* kernels of fp8 weights: CG_FP8_AUTO (default), CG_FP8_OLD or
                               * CG_FP8_TC */
    int fp8_tiles;            /* which fp8 weights lie in fragment tiles (IR_FP8_TILES_*,
                               * ir_weight_tiled; the plan's fp8_tiles): of the routed
                               * experts gate_up's (3: faster than rows at every
                               * batch), all that can (1: faster still from 8 tokens,
                               * slower at 1 to 4), down's (2) or none (0); with
                               * IR_FP8_TILES_LINEAR (4) the dense linears' too. The
                               * default, 7, gate_up's and the linears': faster than
                               * 3 from 2 tokens, slower at 1 (codegen/linear.c,
                               * GEMV_TL_BODY). MOEC_FP8_TILES=N sets it. */
    /* Called as each bucket's kernels finish compiling (progress lines),
     * with the kernels compiled so far of every bucket's kernels:
     * from the compiling threads, one call at a time. */
    void (*progress)(int done, int total, void *user);
    void *progress_user;
} cg_options;

void cg_options_default(cg_options *o);

/* The state of one bucket being generated. */
typedef struct cg_ctx {
    const ir_module *m;
    const cg_options *opt;
    int T;
    moec_buf src;               /* the bucket's program: prologue, then every kernel */
    int n_kernels, kernels_cap;
    char **kernel_names;
    int n_steps, steps_cap;
    ir_step *steps;
    size_t scratch_bytes;     /* the bucket's scratch: the largest op's, per stream */
    int stream;               /* the stream of the op being emitted */
    size_t scratch_cur[2];    /* the current op's reservations, per stream */
    size_t scratch_max[2];
    /* A moe_topk whose kernel also aligned the slots of the moe_routed
     * after it (cg_moe_topk_routed): that op's id + 1 (0: none), and the
     * scratch offsets of its sorted slots, block experts and count used,
     * then the end of them. */
    int moe_aligned;
    size_t moe_align_off[4];
} cg_ctx;

/* Frees what a bucket's generation made (its source, kernel names and
 * steps) and zeroes c. */
void cg_ctx_free(cg_ctx *c);

/* Registers kernel `name` (which must encode every literal its source bakes
 * in). Returns its index; *is_new tells whether the caller must now append
 * its source to c->src (identical specializations across layers share one
 * kernel). -1 when out of memory. */
int cg_kernel(cg_ctx *c, const char *name, int *is_new);
/* Appends a step for op (zeroed, stream = op->stream); NULL when out of memory. */
ir_step *cg_step(cg_ctx *c, ir_step_kind kind, const ir_op *op);
/* Reserves bytes of scratch (16-byte aligned) for the op being emitted;
 * returns its offset. Scratch lives only during its op's steps, so every
 * op on a stream starts again at offset 0 (stream 1's region follows
 * stream 0's: the two run at the same time). */
size_t cg_scratch(cg_ctx *c, size_t bytes);

/* After a bucket's steps are generated: stream 1's scratch follows stream
 * 0's region, so its steps' scratch operands (kernel arguments and GEMM
 * operands) move past it. cg_plan_build calls it once per bucket. */
void cg_scratch_place_streams(cg_ctx *c);

/* The bucket's replay of the side stream under the runtime's rule and its
 * knobs (MOEC_DUAL_STREAM_MAX_T, MOEC_DUAL_STREAM_FROM_T, docs/CUDA.md):
 * 0 on stream 0 alone, 1 two streams at up to IR_DUAL_STREAM_MAX_T tokens,
 * 2 two streams again from the module's from_t up. */
int cg_two_streams(const cg_ctx *c);

/* Where each fork step goes, once a bucket's steps are generated (a CUDA
 * graph keeps only the dependencies, not the order of capture, so this is
 * how a branch starts later): in buckets of two streams from from_t up
 * (cg_two_streams 2), where the side stream reads fp8 weights, past the
 * MoE's routing (the main-stream launches up to its moe_topk's), so that
 * the shared expert's blocks no longer take the SMs the router wants and
 * it runs beside the routed experts; where it reads none, each pair's
 * side-stream steps right after its fork and its join right before the
 * routed experts' first launch, so that the shared expert runs beside the
 * router and the routed experts after both (MOEC_SHARED_FIRST=0|1 picks
 * either form); elsewhere each fork stays right after its operand's op.
 * MOEC_FORK_DELAY=n moves each fork past the next n main-stream launches
 * instead (0: none), an A/B knob. A fork never moves past a step of the
 * side stream, a join or a collective. Where the fork goes past the
 * routing, the shared expert's silu_mul and the down projection reading it
 * get the step's prio (the device's greatest priority; MOEC_SIDE_PRIO=0:
 * not). cg_plan_build calls it once per bucket. */
void cg_place_forks(cg_ctx *c);

ir_arg cg_arg_act(const ir_value *v);
ir_arg cg_arg_weight(const ir_value *v);
/* The block scales of an fp8 weight: its buffer past its codes
 * (ir_weight_scale_offset), f32 in ir_block_scale_type's layout. */
ir_arg cg_arg_scales(const ir_value *w);
ir_arg cg_arg_kv(const ir_op *attention_op, int pool);
ir_arg cg_arg_input(ir_input which);
/* Whether a module output is v or an op after op_id reads it (op_id -1:
 * whether anything reads it). */
int cg_read_after(const ir_module *m, const ir_value *v, int op_id);
/* Whether activations a and b hold common bytes of the arena (plan_memory's
 * offsets); 0 when either is no op result. */
int cg_acts_overlap(const cg_ctx *c, const ir_value *a, const ir_value *b);
/* The one op of `kind` after prologue op pro in m reading a as its operand
 * `first` (and b as the next, when b is not NULL), on pro's stream: the op
 * whose paged cache pro's kernel writes. NULL when there is none (or more
 * than one, or on another stream): then that op writes its cache itself. */
const ir_op *cg_cache_reader(const ir_module *m, const ir_op *pro, ir_op_kind kind, int first,
                             const ir_value *a, const ir_value *b);
/* A cache-writing kernel's arguments, appended to s: positions, slots,
 * block_table, max_blocks and the first n_pools pools of op att; and its
 * parameters (", const int *__restrict__ positions, ..., <pool_type>
 * *__restrict__ <pools[i]>"), or, in the form without a cache, the same
 * names as null locals. */
void cg_step_cache_args(ir_step *s, const ir_op *att, int n_pools);
void cg_cache_params(moec_buf *b, const char *pool_type, const char *const *pools, int n_pools);
void cg_cache_none(moec_buf *b, const char *pool_type, const char *const *pools, int n_pools);
ir_arg cg_arg_config(ir_config which);
ir_arg cg_arg_scratch(size_t offset);
ir_arg cg_arg_i32(int64_t v);
ir_arg cg_arg_f32(double v);

/* The storage dtype of a value on the GPU (ir_value_storage_dtype) and its
 * C type in generated code: "float", "__nv_bfloat16", "__half", "int",
 * "__nv_fp8_e4m3". */
ir_dtype cg_storage(const cg_ctx *c, const ir_value *v);
const char *cg_ctype(ir_dtype dt);

/* The widest of 8, 4, 2, 1 elements that divides n: the vector width of
 * 16-byte (bf16) loads a row of n elements allows. */
int cg_vec_width(int64_t n);
/* The compute capability of the target arch ("sm_90": 90), 0 when it
 * does not parse. */
int cg_arch_num(const cg_options *o);
/* The most dynamic shared memory a block of the target arch may take. */
size_t cg_smem_max(const cg_options *o);
/* The dynamic shared memory (unused) that a side-stream GEMV step of
 * weights stored as w takes so that at most N of its blocks share an SM,
 * leaving the main stream's kernels beside them the rest of it: N is 3
 * (fp8 weights: 4) or MOEC_SIDE_BLOCKS_PER_SM (0: no pad, 0 bytes). */
size_t cg_side_smem_pad(const cg_ctx *c, ir_dtype w);
/* A tuning knob from the environment, read at code generation: the integer
 * in $name when it is one in [lo, hi], else dflt. */
int cg_env_int(const char *name, int dflt, int lo, int hi);
/* The bytes a block prefetches in bucket c->T (0: none). */
long long cg_prefetch_bytes(const cg_ctx *c);
/* When pf > 0, a kernel body's first lines: thread 0 runs `lines`
 * (8-space indented calls of moec_prefetch_l2 or moec_prefetch_rows over
 * ranges the kernel itself reads, weights only, capped by the constant
 * PF_CAP = pf), then the line moec_pdl_enter() that cg_add_pdl_waits
 * keeps. Nothing when pf is 0 (cg_add_pdl_waits puts the wait first). */
void cg_emit_prefetch(moec_buf *b, long long pf, const char *lines);
/* cg_emit_prefetch, without the line moec_pdl_enter() unless enter (for a
 * body that places its own after more work before the wait). */
void cg_emit_prefetch_to(moec_buf *b, long long pf, const char *lines, int enter);
/* "<result dtype>" when every operand is stored like op's first result,
 * else "<result>_<operand 0>_<operand 1>..." (the dtype part of kernel names). */
void cg_dtype_signature(const cg_ctx *c, const ir_op *op, char *buf, size_t cap);

/* The silu_mul kernel (codegen/eltwise.c) for op: silu(x[..., :half]) *
 * x[..., half:] into dst, stored ty (a linear with act silu_mul runs it
 * into scratch ahead of its GEMM). */
moec_status cg_emit_silu_mul(cg_ctx *c, const ir_op *op, const ir_value *x, int64_t half,
                             ir_dtype ty, ir_arg dst);

/* The prologue every program starts with: includes, and the load/store
 * helpers generated code uses: `float ld(const T *p)` for float, bf16,
 * half and fp8 (e4m3), `void st(T *p, float v)`, vector loads and stores,
 * the m16n8k16 product and its operand loads (`moec_ld8`: bf16 or fp8
 * weights as bf16 fragments), warp and block sum/max reductions. */
void cg_emit_prologue(moec_buf *b);

/* Emits the kernels and steps of one op (dispatching on op->kind). */
moec_status cg_emit_op(cg_ctx *c, const ir_op *op);

/* The per-op emitters (codegen/<op>.c). */
moec_status cg_emit_embedding(cg_ctx *c, const ir_op *op);
moec_status cg_emit_rms_norm(cg_ctx *c, const ir_op *op);
moec_status cg_emit_add_rms_norm(cg_ctx *c, const ir_op *op); /* sum and its RMSNorm, one kernel */
moec_status cg_emit_linear(cg_ctx *c, const ir_op *op);       /* cuBLASLt GEMM step */
moec_status cg_emit_copy(cg_ctx *c, const ir_op *op);         /* reshape, slice, concat, expand */
moec_status cg_emit_eltwise(cg_ctx *c, const ir_op *op);      /* add, mul, silu, sigmoid, silu_mul */
moec_status cg_emit_reduce_sum(cg_ctx *c, const ir_op *op);
moec_status cg_emit_rope(cg_ctx *c, const ir_op *op);
moec_status cg_emit_attention(cg_ctx *c, const ir_op *op);    /* GQA: cache write + attention */
moec_status cg_emit_mla_absorb(cg_ctx *c, const ir_op *op);   /* mla_qabsorb, mla_vabsorb: batched GEMM */
moec_status cg_emit_mla_attention(cg_ctx *c, const ir_op *op);/* cache write + attention */
moec_status cg_emit_moe_topk(cg_ctx *c, const ir_op *op);
moec_status cg_emit_moe_routed(cg_ctx *c, const ir_op *op);   /* align, gate_up+silu_mul, down*w, sum */
moec_status cg_emit_moe_experts(cg_ctx *c, const ir_op *op);  /* unfused form, for op tests */
moec_status cg_emit_stream(cg_ctx *c, const ir_op *op);       /* fork, join */
moec_status cg_emit_collective(cg_ctx *c, const ir_op *op);   /* every collective */
/* The one-shot all-reduce's kernel (allreduce_oneshot.c) over ranks in
 * dtype dt put in the bucket's program once, launched by no step: the
 * runtime finds it by name (ir_oneshot_kernel_name). Not for other dtypes. */
moec_status cg_emit_oneshot(cg_ctx *c, int ranks, ir_dtype dt);
/* Its source alone (after cg_emit_prologue's), for programs of its own. */
void cg_oneshot_source(moec_buf *src, int ranks, ir_dtype dt);
moec_status cg_emit_layer_norm(cg_ctx *c, const ir_op *op);
moec_status cg_emit_dsa_topk(cg_ctx *c, const ir_op *op);     /* key write, scores, top-k select */
/* The MLA prologue ops (mla_prologue, mla_prologue_kv, mla_prologue_q): one
 * kernel each; mla_prologue and mla_prologue_kv also write the paged cache
 * of the mla_attention cg_mla_prologue_cache names. */
moec_status cg_emit_mla_prologue(cg_ctx *c, const ir_op *op);
/* The mla_attention whose cache the prologue op `pro` writes: the one op
 * reading pro's kv_c and k_pe results as its own kv_c and k_pe, on pro's
 * stream; NULL when there is none (then the attention writes its cache
 * itself). mla_attention's emitter asks the same to skip its write. */
const ir_op *cg_mla_prologue_cache(const ir_module *m, const ir_op *pro);
/* The mla_qabsorb run by the prologue op pro's kernel, or NULL: the op
 * right after pro on its stream, reading the q projection pro reads in
 * place (head_stride), at a bucket where it runs as a generated kernel,
 * its result in bytes neither op's other operands hold; one launch then
 * does both (MOEC_MLA_PRO_QABSORB=0 at codegen keeps two, for A/B runs),
 * and *part (unless NULL) is the absorption's part (cg_mla_qabsorb_part).
 * The absorption's emitter asks the same to emit nothing. */
typedef struct cg_qabsorb_part cg_qabsorb_part;
const ir_op *cg_mla_prologue_qabsorb(const cg_ctx *c, const ir_op *pro, cg_qabsorb_part *part);
/* The generated mla_qabsorb kernel as a part of another kernel
 * (codegen/mla_absorb.c): its blocks (grid_x heads by blocks / grid_x
 * column groups, bx and by in the part), threads, dtypes of kv_b and the
 * result, and a name tag; 0 when qa (with head_stride) does not run as the
 * generated kernel at c->T. */
struct cg_qabsorb_part {
    unsigned blocks, grid_x, threads, smem;
    ir_dtype dw, dy;
    char tag[96];
};
int cg_mla_qabsorb_part(const cg_ctx *c, const ir_op *qa, cg_qabsorb_part *p);
/* Its code, as one scope over parameters x, kv_b and y and locals bx, by:
 * what it does before the wait (moec_pdl_enter, which it calls), the wait
 * and the rest; smem bytes of dynamic shared memory. */
void cg_mla_qabsorb_emit_part(moec_buf *b, const cg_ctx *c, const ir_op *qa);
/* dsa_prologue_k: one kernel, which also writes the paged key cache of the
 * dsa_topk cg_dsa_prologue_cache names. */
moec_status cg_emit_dsa_prologue_k(cg_ctx *c, const ir_op *op);
/* The dsa_topk whose key cache the dsa_prologue_k `pro` writes: the one op
 * reading pro's result as its k, on pro's stream; NULL when there is none
 * (then dsa_topk writes its keys itself, and asks the same to skip it). */
const ir_op *cg_dsa_prologue_cache(const ir_module *m, const ir_op *pro);
/* attn_prologue: one kernel, which also writes the k and v cache rows of
 * the attention cg_attn_prologue_cache names. */
moec_status cg_emit_attn_prologue(cg_ctx *c, const ir_op *op);
/* The attention whose cache the attn_prologue `pro` writes: the one op
 * reading pro's k and v results as its own k and v, on pro's stream; NULL
 * when there is none (then the attention writes its cache itself, and asks
 * the same to skip it). */
const ir_op *cg_attn_prologue_cache(const ir_module *m, const ir_op *pro);

/* A rotation's frequencies for the rope attributes of op (rope or an MLA
 * prologue op) over heads of R channels: inv_freq[R/2] computed on the host
 * step by step as the interpreter computes them, attn_factor, and a hash of
 * both for kernel names (codegen/rope.c). */
typedef struct cg_rope {
    float *inv_freq;
    int64_t half;
    float attn_factor;
    unsigned hash;
} cg_rope;
moec_status cg_rope_init(const ir_op *op, int64_t R, cg_rope *r);
void cg_rope_free(cg_rope *r);
/* `__constant__ float <sym>[R/2] = {...};`: the table as exact hex floats. */
void cg_rope_emit_table(moec_buf *b, const cg_rope *r, const char *sym);

/* The attn_prologue that GQA attention `att` runs in its own kernel, in a
 * bucket of one token (unless MOEC_ATTN_FUSE_PROLOGUE=0 at codegen): the
 * prologue whose k and v att reads as its cache's
 * (cg_attn_prologue_cache), whose q is att's q, whose positions are att's,
 * and whose results nothing else reads. NULL otherwise. Such a prologue
 * emits no kernel: the attention kernel reads the token's qkv row, makes
 * its query heads as the prologue would, and the block whose split holds
 * the token's own position writes its k and v rows to the cache before it
 * reads them. One token: no other token of the step reads those rows. */
const ir_op *cg_attn_prologue_fused(const cg_ctx *c, const ir_op *att);
/* What the attention kernel needs of a fused prologue pro. */
typedef struct cg_attn_fused_pro {
    const ir_op *pro;
    long long N, rd; /* the qkv row's length, the rotated channels */
    int norm, neox, vec;
    double eps;
    ir_dtype tx, tw; /* the row's and the norm weights' storage */
    cg_rope rt;
} cg_attn_fused_pro;
moec_status cg_attn_fused_pro_init(cg_ctx *c, const ir_op *pro, cg_attn_fused_pro *f);
void cg_attn_fused_pro_free(cg_attn_fused_pro *f);
/* The kernel name's part that tells this prologue apart. */
void cg_attn_fused_pro_tag(const cg_attn_fused_pro *f, char *buf, size_t cap);
/* Before the kernel: its helpers and the rotation table <kernel>_inv_freq. */
void cg_attn_fused_pro_decls(moec_buf *b, const cg_attn_fused_pro *f, const char *kernel);
/* The kernel's parameters in place of q: the row x, then (norm) qw, kw, eps. */
void cg_attn_fused_pro_params(moec_buf *b, const cg_attn_fused_pro *f);
/* The kernel's typedefs and constants (TX, TW, inv_freq, P*), at its top. */
void cg_attn_fused_pro_consts(moec_buf *b, const cg_attn_fused_pro *f, const char *kernel);
/* The code in place of the attention body's query load (after the split's
 * tiles are known: first, last, n_tiles). */
void cg_attn_fused_pro_body(moec_buf *b);
/* The step's arguments in place of q, from args[0]; returns the next index. */
int cg_attn_fused_pro_args(ir_step *s, const cg_attn_fused_pro *f);

/* The last step of every bucket: argmax of each token's logits into
 * IR_INPUT_SAMPLED. */
moec_status cg_emit_argmax(cg_ctx *c, const ir_value *logits);
/* Then the device sampler (codegen/sample.c): each row whose parameter row
 * (IR_INPUT_SAMPLE_ROWS) is on gets its token drawn into
 * IR_INPUT_SAMPLE_TOKENS and its log probability into
 * IR_INPUT_SAMPLE_LOGPROBS, by the algorithm of ir/ir_sample.h. */
moec_status cg_emit_sample(cg_ctx *c, const ir_value *logits);
/* 1 when module m's buckets get the sampler: its vocabulary is at most
 * IR_SAMPLE_VOCAB_MAX (larger ones sample on the host). */
int cg_has_sampler(const ir_module *m);

/* NVRTC: compiles src for arch into a cubin, through the on-disk cache
 * (keyed by a hash of source, options and NVRTC version). A compile error
 * is MOEC_ERR_CUDA with NVRTC's log and the source with line numbers.
 * *cubin is malloc'd. */
moec_status cg_compile(const char *src, const char *arch, const char *cache_dir, void **cubin,
                       size_t *size);

/* One NVRTC compile of cg_compile_many: src in; cubin (owned by the caller
 * afterwards), its size, the status and the error text out. weight counts
 * towards the progress (e.g. the source's kernels). */
typedef struct cg_compile_job {
    const char *src;
    int weight;
    void *cubin;
    size_t size;
    moec_status st;
    char err[4096];
} cg_compile_job;
/* Compiles every job for arch on up to one thread per CPU; progress (when
 * not NULL) is called, one call at a time, as each job compiles, with the
 * weight done so far of the total. */
void cg_compile_many(cg_compile_job *jobs, int n, const char *arch, const char *cache_dir,
                     void (*progress)(int done, int total, void *user), void *user);

/* Generates and compiles every bucket of the fused, planned module m. */
moec_status cg_plan_build(const ir_module *m, const cg_options *opt, ir_plan **out);

#endif
