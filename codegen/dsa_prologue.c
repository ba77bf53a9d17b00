/* dsa_prologue.c — dsa_prologue_k (docs/IR.md): DeepSeek-V3.2's indexer key
 * path as one kernel. It reads the key's columns of a token's row of the
 * fused projection, LayerNorms them (weight and bias; the mean and biased
 * variance in fp32 as layer_norm.c computes them), rotates the first
 * rotary_dim channels with rope.c's frequency table (cg_rope_init), and
 * writes the key both to its result and straight into the paged key cache
 * of the dsa_topk that reads it (cg_dsa_prologue_cache), whose own write
 * kernel is then skipped: what a slice, layer_norm, rope and dsa_k_write
 * did in four kernels (issue 12). Padding tokens (slot < 0) write no cache
 * row. The normalized key stays in fp32 between the norm and the rotation.
 *
 * One warp a token, four to a block, the row staged in shared memory (the
 * rotation pairs channels other lanes normalized).
 *
 * Kernel dsa_prologue_k_d<D>_n<N>_o<col>_r<rotary_dim>_<style>[_bs<bs>]
 * _t<T>_<dtypes>_<rope hash>: grid ceil(T / 4), block 128. */
#include <stdio.h>
#include <string.h>

#include "codegen/cg.h"
#include "err.h"

#define DPK_TOKENS 4 /* tokens (warps) a block */
#define DPK_SMEM_MAX (48 * 1024)

static const char BODY[] =
    "    __shared__ float row_s[TPB][D];\n"
    "    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n"
    "    const int t = blockIdx.x * TPB + warp;\n"
    "    if (t >= TT)\n"
    "        return;\n"
    "    const TX *xr = x + (long long)t * N + COL;\n"
    "    float *r = row_s[warp];\n"
    "    /* each lane normalizes its own channels: no exchange before the rotation */\n"
    "    float s = 0.0f;\n"
    "    for (int c = lane * V; c < D; c += 32 * V) {\n"
    "        float v[V];\n"
    "        ldv<V>(xr + c, v);\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < V; j++) {\n"
    "            r[c + j] = v[j];\n"
    "            s += v[j];\n"
    "        }\n"
    "    }\n"
    "    const float mean = warp_sum(s) / (float)D;\n"
    "    float ss = 0.0f;\n"
    "    for (int c = lane * V; c < D; c += 32 * V)\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < V; j++)\n"
    "            ss += (r[c + j] - mean) * (r[c + j] - mean);\n"
    "    const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)D + eps);\n"
    "    for (int c = lane * V; c < D; c += 32 * V) {\n"
    "        float wv[V], bv[V];\n"
    "        ldv<V>(w + c, wv);\n"
    "        ldv<V>(b + c, bv);\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < V; j++)\n"
    "            r[c + j] = (r[c + j] - mean) * inv * wv[j] + bv[j];\n"
    "    }\n"
    "    __syncwarp();\n"
    "    moec_rope_row<RD, NEOX>(r, lane, (float)pos[t], inv_freq, AF);\n"
    "    __syncwarp();\n"
    "    TP *krow = nullptr;\n"
    "    if constexpr (CACHE) {\n"
    "        /* padding tokens (slot < 0) and positions past the table write no cache row */\n"
    "        const long long row = moec_cache_row<BS>(slots, positions, block_table, max_blocks, t);\n"
    "        if (row >= 0)\n"
    "            krow = kpool + row * D;\n"
    "    }\n"
    "    for (int c = lane * V; c < D; c += 32 * V) {\n"
    "        stv<V>(y + (long long)t * D + c, r + c);\n"
    "        if (krow)\n"
    "            stv<V>(krow + c, r + c);\n"
    "    }\n";

static long long gcd(long long a, long long b) { return b ? gcd(b, a % b) : a; }

const ir_op *cg_dsa_prologue_cache(const ir_module *m, const ir_op *pro)
{
    if (pro->kind != IR_OP_DSA_PROLOGUE_K)
        return NULL;
    return cg_cache_reader(m, pro, IR_OP_DSA_TOPK, 1, pro->out[0], NULL);
}

moec_status cg_emit_dsa_prologue_k(cg_ctx *c, const ir_op *op)
{
    const char *who = op->out[0]->name;
    const ir_value *x = op->in[0], *pos = op->in[1], *w = op->in[2], *b = op->in[3],
                   *y = op->out[0];
    long long N = x->type.rank == 2 ? x->type.dims[1] : 0;
    long long D = w->type.rank == 1 ? w->type.dims[0] : 0;
    long long col = ir_op_attr_int(op, "col", -1), rd = ir_op_attr_int(op, "rotary_dim", D);
    double eps = ir_op_attr_float(op, "eps", -1);
    const char *style = ir_op_attr_str(op, "style", "");
    int neox = !strcmp(style, "neox");
    if (op->n_in != 4 || N < 1 || D < 2 || D % 2 || col < 0 || col + D > N || rd < 2 ||
        rd > D || rd % 2 || eps < 0 || (!neox && strcmp(style, "interleave") != 0) ||
        b->type.rank != 1 || b->type.dims[0] != D || y->type.rank != 2 ||
        y->type.dims[1] != D || cg_storage(c, pos) != IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "dsa_prologue_k %%%s: wants x [T, N] holding D columns at col, pos i32[T], "
                        "weight and bias [D] (D even), an even rotary_dim <= D, eps >= 0 and "
                        "style \"neox\" or \"interleave\"",
                        who);
    if ((long long)DPK_TOKENS * D * 4 > DPK_SMEM_MAX)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "dsa_prologue_k %%%s: a key of %lld channels does not fit shared memory",
                        who, D);
    ir_dtype tx = cg_storage(c, x), ty = cg_storage(c, y), tw = cg_storage(c, w),
             tb = cg_storage(c, b), tp = c->opt->compute_dtype;
    if (tx == IR_DTYPE_I32 || ty == IR_DTYPE_I32 || tw == IR_DTYPE_I32 || tb == IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "dsa_prologue_k %%%s: its operands must be floats",
                        who);
    const ir_op *dsa = cg_dsa_prologue_cache(c->m, op);
    int bs = c->opt->kv_block_size;
    if (dsa && bs < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "dsa_prologue_k %%%s: kv_block_size %d", who, bs);
    cg_rope rt;
    MOEC_TRY(cg_rope_init(op, rd, &rt));
    char name[256], sig[64], cache[32] = "";
    cg_dtype_signature(c, op, sig, sizeof sig);
    if (dsa)
        snprintf(cache, sizeof cache, "_bs%d_%s", bs, ir_dtype_name(tp));
    snprintf(name, sizeof name, "dsa_prologue_k_d%lld_n%lld_o%lld_r%lld_%s%s_t%d_%s_%08x", D, N,
             col, rd, style, cache, c->T, sig, rt.hash);
    int is_new;
    int k = cg_kernel(c, name, &is_new);
    ir_step *s = k < 0 ? NULL : cg_step(c, IR_STEP_KERNEL, op);
    if (!s) {
        cg_rope_free(&rt);
        return MOEC_ERR(MOEC_ERR_OOM, "dsa_prologue_k %%%s: no memory", who);
    }
    s->kernel = k;
    s->grid[0] = (unsigned)((c->T + DPK_TOKENS - 1) / DPK_TOKENS);
    s->block[0] = DPK_TOKENS * 32;
    s->n_args = 0;
    s->args[s->n_args++] = cg_arg_act(x);
    s->args[s->n_args++] = cg_arg_act(pos);
    s->args[s->n_args++] = cg_arg_act(w);
    s->args[s->n_args++] = cg_arg_act(b);
    s->args[s->n_args++] = cg_arg_act(y);
    if (dsa)
        cg_step_cache_args(s, dsa, 1);
    s->args[s->n_args++] = cg_arg_f32(eps);
    if (is_new) {
        moec_buf *o = &c->src;
        char sym[300];
        snprintf(sym, sizeof sym, "%s_inv_freq", name);
        cg_rope_emit_table(o, &rt, sym);
        moec_buf_printf(o,
                        "// dsa_prologue_k: the indexer key's LayerNorm, rope and cache row "
                        "(codegen/dsa_prologue.c), first for %%%s\n"
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(const %s "
                        "*__restrict__ x, const int *__restrict__ pos, const %s *__restrict__ w, "
                        "const %s *__restrict__ b, %s *__restrict__ y",
                        who, DPK_TOKENS * 32, name, cg_ctype(tx), cg_ctype(tw), cg_ctype(tb),
                        cg_ctype(ty));
        static const char *const pools[1] = {"kpool"};
        if (dsa)
            cg_cache_params(o, cg_ctype(tp), pools, 1);
        moec_buf_printf(o, ", float eps)\n{\n    typedef %s TX;\n    typedef %s TP;\n",
                        cg_ctype(tx), cg_ctype(dsa ? tp : ty));
        if (!dsa)
            cg_cache_none(o, "TP", pools, 1);
        moec_buf_printf(o,
                        "    constexpr int D = %lld, N = %lld, COL = %lld, RD = %lld, V = %d, TPB = "
                        "%d, TT = %d, BS = %d;\n"
                        "    constexpr bool NEOX = %s, CACHE = %s;\n"
                        "    constexpr float AF = %af;\n"
                        "    const float *inv_freq = %s;\n"
                        "    (void)BS;\n%s}\n\n",
                        D, N, col, rd, cg_vec_width(gcd(gcd(N, col), D)), DPK_TOKENS, c->T,
                        dsa ? bs : 1, neox ? "true" : "false", dsa ? "true" : "false",
                        (double)rt.attn_factor, sym, BODY);
    }
    cg_rope_free(&rt);
    return MOEC_OK;
}
