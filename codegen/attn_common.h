/* attn_common.h — what the two paged-cache attention emitters
 * (codegen/attention.c, codegen/mla_attention.c) share: the sequence-split
 * count, the steps of the cache write and of the attention kernel over the
 * cache, and the kernel that merges the splits' partial softmax states.
 * Internal to codegen; static inline so that it needs no source file. */
#ifndef MOEC_CG_ATTN_COMMON_H
#define MOEC_CG_ATTN_COMMON_H

#include <stdio.h>

#include "codegen/cg.h"
#include "err.h"

/* Blocks that keep an H100's 132 SMs busy, and the most splits of a sequence. */
#define CG_ATTN_TARGET_BLOCKS 264
#define CG_ATTN_MAX_SPLITS 64

/* The merge kernel's body (moec_attn_merge, codegen/cg.c): a block per
 * (token, head); padding tokens get zeros. Its token's slot and position
 * read before the programmatic wait (step inputs; the MLA attention's
 * early tiles' idea) measured level: V2-Lite 1.809 / 5.383 / 9.219 /
 * 10.058 ms at 1 / 8 / 32 / 64 tokens against 1.814 / 5.385 / 9.227 /
 * 10.059, fp8 1.449 / 3.607 / 5.520 / 6.614 against 1.451 / 3.609 / 5.524
 * / 6.609, Qwen3-30B (16 layers) 1.076 / 2.744 against 1.076 / 2.745 at 1
 * / 8 (H200, 2026-11-30; history at 22c2526, MOEC_ATTN_COMBINE_EARLY). */
static const char CG_ATTN_COMBINE_BODY[] =
    "    const int t = blockIdx.x, h = blockIdx.y, s = slots[t], p = pos[t];\n"
    "    TO *o = out + ((long long)t * H + h) * D;\n"
    "    if (s < 0 || p < 0 || p / BS >= max_blocks) {\n"
    "        for (int c = threadIdx.x; c < D; c += blockDim.x)\n"
    "            st(o + c, 0.0f);\n"
    "        return;\n"
    "    }\n"
    "    moec_attn_merge<NSPLIT, 1, D, G, NT>(part_ml, part_o, ((long long)t * H + h) * NSPLIT, o);\n";

/* The merge kernel's thread groups over the splits (moec_attn_merge's G)
 * and its threads: a group per eight splits, at most 8 groups and 1024
 * threads, whole warps; one group of 128 threads where a head's vectors
 * do not allow that. MOEC_ATTN_COMBINE_GROUPS (1 to 8) caps the groups,
 * for comparisons. (H100, 2026-11-24, ncu at batch 1: one group read the
 * splits eight at a time, 10.3 us for V2-Lite's 16 heads x 64 splits, 6.5
 * for Qwen3's 32 x 64.) */
static inline int cg_attn_combine_groups(long long D, int ns, int *nt)
{
    long long vecs = D % 4 ? D : D / 4;
    int g = (ns + 7) / 8, gmax = cg_env_int("MOEC_ATTN_COMBINE_GROUPS", 8, 1, 8);
    if (g > gmax)
        g = gmax;
    while (g > 1 && (g * vecs > 1024 || (g * vecs) % 32 != 0))
        g--;
    *nt = g > 1 ? (int)(g * vecs) : 128;
    return g;
}

/* The fewest positions a split takes, the kernels' MINPOS: dflt, the
 * emitter's choice, or MOEC_ATTN_SPLIT_MIN at codegen for an A/B. Splits
 * left without positions write a weight of 0 and no output, and the merge
 * skips them. (H100, 2026-11-24, V2-Lite at batch 1, context 1024: the
 * step 2.777 ms with 1, 2.829 with 64, 3.015 with 128: the splits' spread
 * over the SMs is worth more than the partial states they write.) */
static inline int cg_attn_split_min(int dflt)
{
    return cg_env_int("MOEC_ATTN_SPLIT_MIN", dflt, 1, 1 << 20);
}

/* Splits of each sequence so that `blocks` blocks per split fill the GPU
 * (the target, 264: two blocks a SM of an H100). A kernel that holds
 * exactly the target's blocks at once (`one_wave`: the tensor-core MLA
 * kernel, two a SM by its shared memory) rounds down, since blocks past
 * the target wait for a second wave (V2-Lite at 64 tokens had 5 splits,
 * 320 blocks: 15.049 ms a step against 14.759 with 4); the others, which
 * hold more blocks a SM, round up. MOEC_ATTN_TARGET_BLOCKS at codegen
 * moves the target and MOEC_ATTN_SPLIT_CEIL=1 rounds up everywhere, for
 * A/Bs. */
static inline int cg_attn_splits(long long blocks, int one_wave)
{
    long long target = cg_env_int("MOEC_ATTN_TARGET_BLOCKS", CG_ATTN_TARGET_BLOCKS, 1, 1 << 20);
    int up = !one_wave || cg_env_int("MOEC_ATTN_SPLIT_CEIL", 0, 0, 1);
    int ns = up ? (int)((target + blocks - 1) / blocks) : (int)(target / blocks);
    if (ns < 1)
        ns = 1;
    return ns > CG_ATTN_MAX_SPLITS ? CG_ATTN_MAX_SPLITS : ns;
}

/* The step of the cache-write kernel k of op: one block of 128 per token,
 * args (a, b, pos, slots, block_table, max_blocks, pool 0, pool 1). */
static inline ir_step *cg_attn_write_step(cg_ctx *c, const ir_op *op, int k, const ir_value *a,
                                          const ir_value *b)
{
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return NULL;
    s->kernel = k;
    s->grid[0] = (unsigned)c->T;
    s->block[0] = 128;
    s->n_args = 8;
    s->args[0] = cg_arg_act(a);
    s->args[1] = cg_arg_act(b);
    s->args[2] = cg_arg_input(IR_INPUT_POSITIONS);
    s->args[3] = cg_arg_input(IR_INPUT_SLOTS);
    s->args[4] = cg_arg_input(IR_INPUT_BLOCK_TABLE);
    s->args[5] = cg_arg_config(IR_CONFIG_MAX_BLOCKS);
    s->args[6] = cg_arg_kv(op, 0);
    s->args[7] = cg_arg_kv(op, 1);
    return s;
}

/* The most partial-state bytes (splits x heads x channels x 4) one last
 * block merges: one block reads them alone, while a merge kernel spreads
 * them over a block per head. (H100, 2026-11-24: Qwen3-30B at batch 8,
 * 36 KiB a group, 10.978 ms merged in the kernel against 11.162 with the
 * merge kernel; at 160 KiB, V2-Lite at batch 64 15.617 against 15.424
 * and V3.2 at batch 8 4.218 against 4.181; at 1 MiB, V3.2's sparse
 * attention 54 us a layer against 20. H200, 2026-11-28, Qwen3-30B-A3B cut
 * to 16 layers, batch 1, where GQA's 128-position splits leave 9 of 64
 * splits with positions at context 1024: MOEC_ATTN_MERGE=2 1.263 ms
 * against 1.236 with the merge kernel, 1.472 against 1.451 at 8192; the
 * merge kernel's launch costs less than one block's merge.) */
#define CG_ATTN_MERGE_MAX_BYTES (64 * 1024)

/* Whether a kernel split ns ways over hb heads of d channels a block merges
 * its own splits (its last block, moec_attn_arrive_merge, counting arrivals
 * in IR_INPUT_SPLIT_COUNTERS) instead of a third kernel doing it: when
 * split, its T * H / hb counters fit, a group's partial states are at most
 * CG_ATTN_MERGE_MAX_BYTES, and MOEC_ATTN_MERGE is not 0 at codegen
 * (MOEC_ATTN_MERGE=0 keeps the merge kernel, for an A/B; 2 merges in the
 * kernel whatever the bytes; 3 as 2, and GQA's kernel then merges only the
 * splits that may hold positions, cg_attn_merge_live). */
static inline int cg_attn_self_merge(const cg_ctx *c, long long H, int hb, long long d, int ns)
{
    int mode = cg_env_int("MOEC_ATTN_MERGE", 1, 0, 3);
    return ns > 1 && mode && (long long)c->T * (H / hb) <= IR_SPLIT_COUNTERS &&
           (mode >= 2 || (long long)ns * hb * d * 4 <= CG_ATTN_MERGE_MAX_BYTES);
}

/* MOEC_ATTN_MERGE=3 at codegen (an A/B knob, not timed yet): a GQA kernel
 * that merges its own splits reads only those that may hold positions,
 * all of a thread's loads of eight splits in flight at once
 * (moec_attn_arrive_merge_live, codegen/cg.c), where the general merge
 * reads every split's weight and each vector's splits in turn. */
static inline int cg_attn_merge_live(void) { return cg_env_int("MOEC_ATTN_MERGE", 1, 0, 3) == 3; }

/* The attention kernel's args after its query operands, from args[i]: pos,
 * slots, block_table, max_blocks, pool 0, pool 1, out, scale, window (and,
 * when split, the two scratch arrays and, when it merges them itself, the
 * split counters, set by cg_attn_emit_combine). */
static inline void cg_attn_args(ir_step *s, const ir_op *op, int i, int ns, int merge)
{
    s->n_args = i + (ns > 1 ? 11 + (merge ? 1 : 0) : 9);
    s->args[i] = cg_arg_input(IR_INPUT_POSITIONS);
    s->args[i + 1] = cg_arg_input(IR_INPUT_SLOTS);
    s->args[i + 2] = cg_arg_input(IR_INPUT_BLOCK_TABLE);
    s->args[i + 3] = cg_arg_config(IR_CONFIG_MAX_BLOCKS);
    s->args[i + 4] = cg_arg_kv(op, 0);
    s->args[i + 5] = cg_arg_kv(op, 1);
    s->args[i + 6] = cg_arg_act(op->out[0]);
    s->args[i + 7] = cg_arg_f32(ir_op_attr_float(op, "scale", 1.0));
    s->args[i + 8] = cg_arg_i32(ir_op_attr_int(op, "window", 0));
}

/* The attention kernel's extra parameters when the sequence is split. */
static inline const char *cg_attn_part_params(int ns, int merge)
{
    return ns == 1  ? ""
           : merge ? ", float *__restrict__ part_ml, float *__restrict__ part_o, "
                     "unsigned *__restrict__ cnt"
                   : ", float *__restrict__ part_ml, float *__restrict__ part_o";
}

/* Before the wait (cg_emit_prefetch), the cache rows of the block's share
 * of its sequence's positions, page by page. Positions, slots and the
 * block table are step inputs the runtime copies before the step's first
 * kernel and no kernel writes; the row this step's token writes (an
 * earlier kernel's) may be among them: a prefetch into L2 reads nothing
 * stale. The blocks of a split that read the same rows (other heads)
 * take a contiguous share each, NSH shares in all, this one share SH.
 * Format arguments: the positions per tile (a constant's name), the split
 * index, SH and NSH (expressions), then the two pools and their elements
 * a position. Not for a token selection (written by a kernel). */
static const char CG_ATTN_PREFETCH[] =
    "        const int t = blockIdx.x, s = slots[t], p = pos[t];\n"
    "        if (s >= 0 && p >= 0 && p / BS < max_blocks) {\n"
    "            constexpr int PTL = %s;\n"
    "            const long long SH = %s, NSH = %s;\n"
    "            const int lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;\n"
    "            const int n_tiles = (p - lo + PTL) / PTL, per_min = (MINPOS + PTL - 1) / PTL;\n"
    "            const int per_even = (n_tiles + NSPLIT - 1) / NSPLIT;\n"
    "            const int per = per_even > per_min ? per_even : per_min, first = (%s) * per;\n"
    "            const long long end = (long long)lo + (long long)(first + per) * PTL;\n"
    "            const int e = end < p + 1 ? (int)end : p + 1;\n"
    "            long long left = PF_CAP;\n"
    "            auto share = [&](const char *pool, long long row, long long n, long long rb) {\n"
    "                const long long len = n * rb, a = len * SH / NSH, b = len * (SH + 1) / NSH;\n"
    "                const long long m = b - a < left ? b - a : left;\n"
    "                moec_prefetch_l2(pool + row * rb + a, (unsigned long long)m);\n"
    "                left -= m;\n"
    "            };\n"
    "            for (int pq = lo + first * PTL; pq < e && left > 0;) {\n"
    "                const int pe = (pq / BS + 1) * BS < e ? (pq / BS + 1) * BS : e;\n"
    "                const long long page = block_table[(long long)s * max_blocks + pq / BS];\n"
    "                if (page >= 0) {\n"
    "                    share(reinterpret_cast<const char *>(%s), page * BS + pq %% BS, pe - pq,\n"
    "                          (long long)(%s) * (long long)sizeof(*%s));\n"
    "                    share(reinterpret_cast<const char *>(%s), page * BS + pq %% BS, pe - pq,\n"
    "                          (long long)(%s) * (long long)sizeof(*%s));\n"
    "                }\n"
    "                pq = pe;\n"
    "            }\n"
    "        }\n";

/* CG_ATTN_PREFETCH with its arguments, through cg_emit_prefetch (nothing
 * when the bucket prefetches nothing); without its moec_pdl_enter() unless
 * enter (a body that has its own after more work before the wait). */
static inline void cg_attn_emit_prefetch(cg_ctx *c, const char *tile, const char *split,
                                         const char *sh, const char *nsh, const char *pool0,
                                         const char *el0, const char *pool1, const char *el1,
                                         int enter)
{
    long long pf = cg_prefetch_bytes(c);
    if (pf <= 0)
        return;
    moec_buf lines = {0};
    moec_buf_printf(&lines, CG_ATTN_PREFETCH, tile, sh, nsh, split, pool0, el0, pool0, pool1, el1,
                    pool1);
    if (lines.oom)
        c->src.oom = 1;
    else
        cg_emit_prefetch_to(&c->src, pf, lines.data, enter);
    moec_buf_free(&lines);
}

/* The attention kernel's first lines about its splits: the constant MERGE
 * (whether it merges them itself), and the split-only pointers it lacks as
 * unused locals. */
static inline void cg_attn_emit_parts(moec_buf *b, int ns, int merge)
{
    moec_buf_printf(b, "    constexpr bool MERGE = %s;\n", merge ? "true" : "false");
    if (ns == 1)
        moec_buf_printf(b, "    float *part_ml = nullptr, *part_o = nullptr;\n"
                           "    (void)part_ml;\n    (void)part_o;\n");
    if (!merge)
        moec_buf_printf(b, "    unsigned *cnt = nullptr;\n    (void)cnt;\n");
}

/* For a split attention step s (its last args the scratch arrays, and the
 * split counters when merge): reserves the partial states of T tokens by
 * H heads by ns splits of D channels, and, unless the kernel merges them
 * itself, emits the kernel that merges them into op->out[0], named
 * <prefix>_combine_h<H>_<dim><D>_ns.., for op `what` of codegen/<what>.c. */
static inline moec_status cg_attn_emit_combine(cg_ctx *c, const ir_op *op, ir_step *s,
                                               const char *what, const char *prefix,
                                               const char *dim, long long H, long long D, int ns,
                                               int merge)
{
    const char *who = op->out[0]->name;
    int bs = c->opt->kv_block_size;
    ir_dtype odt = cg_storage(c, op->out[0]);
    size_t off_ml = cg_scratch(c, (size_t)c->T * (size_t)H * (size_t)ns * 2 * 4);
    size_t off_o = cg_scratch(c, (size_t)c->T * (size_t)H * (size_t)ns * (size_t)D * 4);
    int n = s->n_args - (merge ? 1 : 0);
    s->args[n - 2] = cg_arg_scratch(off_ml);
    s->args[n - 1] = cg_arg_scratch(off_o);
    if (merge) {
        s->args[n] = cg_arg_input(IR_INPUT_SPLIT_COUNTERS);
        return MOEC_OK;
    }
    char cname[256];
    int nt, g = cg_attn_combine_groups(D, ns, &nt);
    snprintf(cname, sizeof cname, "%s_combine_h%lld_%s%lld_ns%d_g%d_bs%d_t%d_%s", prefix, H, dim, D,
             ns, g, bs, c->T, ir_dtype_name(odt));
    int is_new = 0;
    int kc = cg_kernel(c, cname, &is_new);
    if (kc < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: no memory", what, who);
    if (is_new) {
        moec_buf_printf(&c->src,
                      "// %s: merge of the sequence splits (codegen/%s.c, cg_emit_%s)\n"
                      "extern \"C\" __global__ void __launch_bounds__(%d) %s(const int *__restrict__ "
                      "pos, const int *__restrict__ slots, int max_blocks, const float *__restrict__ "
                      "part_ml, const float *__restrict__ part_o, %s *__restrict__ out)\n{\n"
                      "    typedef %s TO;\n"
                      "    constexpr int H = %lld, D = %lld, BS = %d, NSPLIT = %d, G = %d, NT = %d;\n",
                      what, what, what, nt, cname, cg_ctype(odt), cg_ctype(odt), H, D, bs, ns, g,
                      nt);
        moec_buf_printf(&c->src, "%s}\n\n", CG_ATTN_COMBINE_BODY);
    }
    s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: no memory", what, who);
    s->kernel = kc;
    s->grid[0] = (unsigned)c->T;
    s->grid[1] = (unsigned)H;
    s->block[0] = (unsigned)nt;
    s->n_args = 6;
    s->args[0] = cg_arg_input(IR_INPUT_POSITIONS);
    s->args[1] = cg_arg_input(IR_INPUT_SLOTS);
    s->args[2] = cg_arg_config(IR_CONFIG_MAX_BLOCKS);
    s->args[3] = cg_arg_scratch(off_ml);
    s->args[4] = cg_arg_scratch(off_o);
    s->args[5] = cg_arg_act(op->out[0]);
    return MOEC_OK;
}

#endif
