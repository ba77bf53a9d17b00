/* attn_prologue.c — attn_prologue (docs/IR.md): grouped-query attention's
 * prologue as one kernel. It reads a token's row of the fused qkv
 * projection once; each q and k head is RMS-normed (Qwen3's q_norm and
 * k_norm, the formula of rms_norm.c), rounded to the compute dtype as the
 * rms_norm's stored result was, and its first rotary_dim channels rotated
 * with rope.c's frequency table (cg_rope_init); v heads are copied. q, k
 * and v go to their results, and the token's k and v rows straight into
 * the paged cache of the attention that reads them
 * (cg_attn_prologue_cache), whose own write kernel is then skipped: what
 * three slices, two rms_norms, two ropes and the cache write did in eight
 * kernels (issue 15). Padding tokens (slot < 0) write no cache row.
 *
 * One warp a head, four to a block, the head staged in shared memory (the
 * rotation pairs channels other lanes normalized); a token's H + 2 Hkv
 * heads over blockIdx.y, so that they run side by side even at batch 1.
 *
 * Kernel attn_prologue_h<H>_hkv<Hkv>_d<D>_n<N>_r<rotary_dim>_<style>[_norm]
 * [_c<bs>]_t<T>_<dtypes>_<rope hash>: grid (T, ceil((H + 2 Hkv) / 4)),
 * block 128.
 *
 * At one token the whole prologue moves into the attention's kernel by
 * default (cg_attn_prologue_fused and the cg_attn_fused_pro_* parts below,
 * used by codegen/attention.c): one launch fewer a layer.
 * MOEC_ATTN_FUSE_PROLOGUE=0 keeps this kernel there too. Both forms make a
 * head with moec_attn_pro_head, so they round alike. */
#include <stdio.h>
#include <string.h>

#include "codegen/cg.h"
#include "err.h"

#define APK_HEADS 4 /* heads (warps) a block */
#define APK_SMEM_MAX (48 * 1024)

static const char HELPERS[] =
    "#ifndef MOEC_ATTN_PROLOGUE_HELPERS\n"
    "#define MOEC_ATTN_PROLOGUE_HELPERS\n"
    "/* v rounded to T's precision and back: what storing it as T keeps */\n"
    "template <typename T> __device__ __forceinline__ float moec_round_to(float v)\n"
    "{\n"
    "    T t;\n"
    "    st(&t, v);\n"
    "    return ld(&t);\n"
    "}\n"
    "/* one head (D channels at xh) of a token's fused qkv row, by one warp,\n"
    "   into r (D floats of shared memory): rounded to TC as the slice's\n"
    "   stored value was, RMS-normed with w (NORM) and rounded as the\n"
    "   rms_norm's stored result was, its first RD channels rotated at p */\n"
    "/* (with cs, the rotation's cos and sin at p, times af, pair k at\n"
    "   cs[2k], cs[2k + 1]: sincosf once a block, not once a head) */\n"
    "template <int D, int RD, int V, bool NEOX, bool NORM, typename TC, typename TX, typename TW>\n"
    "__device__ __forceinline__ void moec_attn_pro_head(const TX *xh, const TW *w, float eps, float p,\n"
    "                                                   const float *inv_freq, float af, float *r,\n"
    "                                                   int lane, const float *cs = nullptr)\n"
    "{\n"
    "    float ss = 0.0f;\n"
    "    for (int c = lane * V; c < D; c += 32 * V) {\n"
    "        float f[V];\n"
    "        ldv<V>(xh + c, f);\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < V; j++) {\n"
    "            r[c + j] = moec_round_to<TC>(f[j]);\n"
    "            ss += r[c + j] * r[c + j];\n"
    "        }\n"
    "    }\n"
    "    if constexpr (NORM) {\n"
    "        const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)D + eps);\n"
    "        for (int c = lane * V; c < D; c += 32 * V) {\n"
    "            float wv[V];\n"
    "            ldv<V>(w + c, wv);\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < V; j++)\n"
    "                r[c + j] = moec_round_to<TC>(wv[j] * (r[c + j] * inv));\n"
    "        }\n"
    "    }\n"
    "    __syncwarp();\n"
    "    if (cs) {\n"
    "        for (int k = lane; k < RD / 2; k += 32)\n"
    "            moec_rope_pair<RD, NEOX>(r, k, cs[2 * k], cs[2 * k + 1]);\n"
    "    } else {\n"
    "        moec_rope_row<RD, NEOX>(r, lane, p, inv_freq, af);\n"
    "    }\n"
    "    __syncwarp();\n"
    "}\n"
    "#endif\n\n";

static const char BODY[] =
    "    __shared__ float row_s[HPB][D];\n"
    "    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n"
    "    const int t = blockIdx.x, hh = blockIdx.y * HPB + warp;\n"
    "    if (hh >= H + 2 * HKV)\n"
    "        return;\n"
    "    const TX *xr = x + (long long)t * N + (long long)hh * D;\n"
    "    /* k and v heads: their row of the cache (none for padding tokens) */\n"
    "    TP *crow = nullptr;\n"
    "    if constexpr (CACHE) {\n"
    "        const long long row = moec_cache_row<BS>(slots, positions, block_table, max_blocks, t);\n"
    "        if (hh >= H && row >= 0)\n"
    "            crow = hh < H + HKV ? kpool + (row * HKV + hh - H) * D\n"
    "                                : vpool + (row * HKV + hh - H - HKV) * D;\n"
    "    }\n"
    "    if (hh >= H + HKV) { /* v: copied */\n"
    "        TY *yr = v + ((long long)t * HKV + hh - H - HKV) * D;\n"
    "        for (int c = lane * V; c < D; c += 32 * V) {\n"
    "            float f[V];\n"
    "            ldv<V>(xr + c, f);\n"
    "            stv<V>(yr + c, f);\n"
    "            if (crow)\n"
    "                stv<V>(crow + c, f);\n"
    "        }\n"
    "        return;\n"
    "    }\n"
    "    const bool isq = hh < H;\n"
    "    TY *yr = isq ? q + ((long long)t * H + hh) * D : k + ((long long)t * HKV + hh - H) * D;\n"
    "    float *r = row_s[warp];\n"
    "    moec_attn_pro_head<D, RD, V, NEOX, NORM, TC>(xr, isq ? qw : kw, eps, (float)pos[t], inv_freq,\n"
    "                                                 AF, r, lane);\n"
    "    for (int c = lane * V; c < D; c += 32 * V) {\n"
    "        stv<V>(yr + c, r + c);\n"
    "        if (crow)\n"
    "            stv<V>(crow + c, r + c);\n"
    "    }\n";

const ir_op *cg_attn_prologue_cache(const ir_module *m, const ir_op *pro)
{
    if (pro->kind != IR_OP_ATTN_PROLOGUE)
        return NULL;
    const ir_op *att = cg_cache_reader(m, pro, IR_OP_ATTENTION, 1, pro->out[1], pro->out[2]);
    return att && att->n_in == 4 ? att : NULL;
}

/* An attn_prologue's shape, checked. */
typedef struct pro_shape {
    long long N, H, HKV, D, rd;
    int norm, neox;
    double eps;
    const char *style;
    ir_dtype tx, ty, tw;
} pro_shape;

static moec_status pro_check(cg_ctx *c, const ir_op *op, pro_shape *p)
{
    const char *who = op->out[0]->name;
    const ir_value *x = op->in[0], *pos = op->in[1];
    p->N = x->type.rank == 2 ? x->type.dims[1] : 0;
    p->H = ir_op_attr_int(op, "heads", 0);
    p->HKV = ir_op_attr_int(op, "kv_heads", 0);
    p->D = ir_op_attr_int(op, "head_dim", 0);
    p->rd = ir_op_attr_int(op, "rotary_dim", p->D);
    p->norm = op->n_in == 4;
    p->eps = p->norm ? ir_op_attr_float(op, "eps", -1) : 0;
    p->style = ir_op_attr_str(op, "style", "");
    p->neox = !strcmp(p->style, "neox");
    long long N = p->N, H = p->H, HKV = p->HKV, D = p->D, rd = p->rd;
    if ((op->n_in != 2 && !p->norm) || N < 1 || H < 1 || HKV < 1 || H % HKV || D < 2 || D % 2 ||
        (H + 2 * HKV) * D > N || rd < 2 || rd > D || rd % 2 || p->eps < 0 ||
        (!p->neox && strcmp(p->style, "interleave") != 0) || cg_storage(c, pos) != IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "attn_prologue %%%s: wants x [T, N] holding heads + 2 kv_heads heads of "
                        "an even head_dim, pos i32[T], an even rotary_dim <= head_dim, eps >= 0 "
                        "and style \"neox\" or \"interleave\"",
                        who);
    if ((long long)APK_HEADS * D * 4 > APK_SMEM_MAX)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "attn_prologue %%%s: a head of %lld channels does not fit shared memory",
                        who, D);
    p->tx = cg_storage(c, x);
    p->ty = cg_storage(c, op->out[0]);
    p->tw = p->norm ? cg_storage(c, op->in[2]) : p->ty;
    int same = cg_storage(c, op->out[1]) == p->ty && cg_storage(c, op->out[2]) == p->ty &&
               (!p->norm || cg_storage(c, op->in[3]) == p->tw);
    if (!same || p->tx == IR_DTYPE_I32 || p->ty == IR_DTYPE_I32 || p->tw == IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "attn_prologue %%%s: its results (and its norm weights) must be stored "
                        "alike, as floats",
                        who);
    return MOEC_OK;
}

/* The widest vectors that keep every head of every row aligned. */
static int pro_vec(long long N, long long D)
{
    return cg_vec_width(N) < cg_vec_width(D) ? cg_vec_width(N) : cg_vec_width(D);
}

const ir_op *cg_attn_prologue_fused(const cg_ctx *c, const ir_op *att)
{
    if (c->T != 1 || att->kind != IR_OP_ATTENTION || att->n_in != 4 ||
        !cg_env_int("MOEC_ATTN_FUSE_PROLOGUE", 1, 0, 1))
        return NULL;
    const ir_op *pro = att->in[1]->kind == IR_VALUE_OP ? att->in[1]->def : NULL;
    if (!pro || cg_attn_prologue_cache(c->m, pro) != att || att->in[0] != pro->out[0] ||
        att->in[3] != pro->in[1])
        return NULL;
    const ir_module *m = c->m;
    for (int k = 0; k < m->n_ops; k++)
        for (int i = 0; m->ops[k] != att && i < m->ops[k]->n_in; i++)
            for (int j = 0; j < 3; j++)
                if (m->ops[k]->in[i] == pro->out[j])
                    return NULL;
    for (int i = 0; i < m->n_outputs; i++)
        for (int j = 0; j < 3; j++)
            if (m->outputs[i] == pro->out[j])
                return NULL;
    return pro;
}

moec_status cg_attn_fused_pro_init(cg_ctx *c, const ir_op *pro, cg_attn_fused_pro *f)
{
    memset(f, 0, sizeof *f);
    pro_shape p;
    MOEC_TRY(pro_check(c, pro, &p));
    f->pro = pro;
    f->N = p.N;
    f->rd = p.rd;
    f->norm = p.norm;
    f->neox = p.neox;
    f->vec = pro_vec(p.N, p.D);
    f->eps = p.eps;
    f->tx = p.tx;
    f->tw = p.tw;
    return cg_rope_init(pro, p.rd, &f->rt);
}

void cg_attn_fused_pro_free(cg_attn_fused_pro *f) { cg_rope_free(&f->rt); }

void cg_attn_fused_pro_tag(const cg_attn_fused_pro *f, char *buf, size_t cap)
{
    snprintf(buf, cap, "_pro_n%lld_r%lld_%s%s_%s_%s_%08x", f->N, f->rd,
             f->neox ? "neox" : "interleave", f->norm ? "_norm" : "", ir_dtype_name(f->tx),
             ir_dtype_name(f->tw), f->rt.hash);
}

void cg_attn_fused_pro_decls(moec_buf *b, const cg_attn_fused_pro *f, const char *kernel)
{
    char sym[300];
    snprintf(sym, sizeof sym, "%s_inv_freq", kernel);
    moec_buf_printf(b, "%s", HELPERS);
    cg_rope_emit_table(b, &f->rt, sym);
}

void cg_attn_fused_pro_params(moec_buf *b, const cg_attn_fused_pro *f)
{
    moec_buf_printf(b, "const %s *__restrict__ x", cg_ctype(f->tx));
    if (f->norm)
        moec_buf_printf(b, ", const %s *__restrict__ qw, const %s *__restrict__ kw, float eps",
                        cg_ctype(f->tw), cg_ctype(f->tw));
}

void cg_attn_fused_pro_consts(moec_buf *b, const cg_attn_fused_pro *f, const char *kernel)
{
    moec_buf_printf(b, "    typedef %s TX;\n    typedef %s TW;\n", cg_ctype(f->tx),
                    cg_ctype(f->tw));
    if (!f->norm)
        moec_buf_printf(b, "    const TW *qw = nullptr, *kw = nullptr;\n"
                           "    const float eps = 0.0f;\n"
                           "    (void)qw;\n    (void)kw;\n    (void)eps;\n");
    moec_buf_printf(b,
                    "    constexpr int PN = %lld, PRD = %lld, PV = %d;\n"
                    "    constexpr bool PNEOX = %s, PNORM = %s, PCS = %s;\n"
                    "    constexpr float PAF = %af;\n"
                    "    const float *inv_freq = %s_inv_freq;\n"
                    "    __shared__ float kx_s[DK];\n",
                    f->N, f->rd, f->vec, f->neox ? "true" : "false", f->norm ? "true" : "false",
                    /* the rotation's cos and sin once a block, not once a
                       head (MOEC_ATTN_ROPE_ONCE=0: once a head, for A/Bs;
                       H200, 2026-11-29, Qwen3-30B at batch 1: 2.901 ms a
                       step against 2.925) */
                    cg_env_int("MOEC_ATTN_ROPE_ONCE", 1, 0, 1) ? "true" : "false",
                    (double)f->rt.attn_factor, kernel);
}

/* In place of the attention body's query load (codegen/attention.c): the
 * block's GB query heads from the token's qkv row into q_s, rounded as the
 * prologue stored them; and, where this block's split holds the token's
 * own position (its last tile), its kv head's k and v rows into the cache,
 * as the prologue writes them, before the barrier after which the block
 * reads them. Blocks of other query-head groups of the same split write
 * the same bytes. */
static const char FUSED_BODY[] =
    "    {\n"
    "        const bool own = first < last && last == n_tiles;\n"
    "        const long long crow =\n"
    "            own ? (long long)block_table[(long long)s * max_blocks + p / BS] * BS + p % BS : 0;\n"
    "        const TX *xr = x + (long long)t * PN;\n"
    "        /* a split without positions makes nothing: it only arrives */\n"
    "        const int items = first < last ? GB + (own ? 2 : 0) : 0;\n"
    "        /* the rotation at p once for the block's heads (PCS) */\n"
    "        __shared__ float cs_s[PCS ? (PRD / 2 > 0 ? PRD : 2) : 2];\n"
    "        if constexpr (PCS && PRD / 2 > 0) {\n"
    "            if (items) {\n"
    "                for (int k = threadIdx.x; k < PRD / 2; k += NT)\n"
    "                    moec_rope_cs((float)p, inv_freq, PAF, k, &cs_s[2 * k], &cs_s[2 * k + 1]);\n"
    "                __syncthreads();\n"
    "            }\n"
    "        }\n"
    "        for (int it = warp; it < items; it += NW) {\n"
    "            if (it == GB + 1) { /* v: copied */\n"
    "                const TX *xh = xr + (long long)(H + HKV + kh) * DK;\n"
    "                TS *vd = vpool + (crow * HKV + kh) * DV;\n"
    "                for (int c = lane * PV; c < DV; c += 32 * PV) {\n"
    "                    float f[PV];\n"
    "                    ldv<PV>(xh + c, f);\n"
    "                    stv<PV>(vd + c, f);\n"
    "                }\n"
    "                continue;\n"
    "            }\n"
    "            const bool isq = it < GB;\n"
    "            float *r = isq ? q_s[it] : kx_s;\n"
    "            moec_attn_pro_head<DK, PRD, PV, PNEOX, PNORM, TS>(\n"
    "                xr + (long long)(isq ? h0 + it : H + kh) * DK, isq ? qw : kw, eps, (float)p, inv_freq,\n"
    "                PAF, r, lane, PCS && PRD / 2 > 0 ? cs_s : nullptr);\n"
    "            if (isq) {\n"
    "                for (int c = lane; c < DK; c += 32)\n"
    "                    r[c] = moec_round_to<TQ>(r[c]);\n"
    "            } else {\n"
    "                TS *kd = kpool + (crow * HKV + kh) * DK;\n"
    "                for (int c = lane * PV; c < DK; c += 32 * PV)\n"
    "                    stv<PV>(kd + c, r + c);\n"
    "            }\n"
    "        }\n"
    "        __syncthreads();\n"
    "    }\n";

void cg_attn_fused_pro_body(moec_buf *b) { moec_buf_printf(b, "%s", FUSED_BODY); }

int cg_attn_fused_pro_args(ir_step *s, const cg_attn_fused_pro *f)
{
    int n = 0;
    s->args[n++] = cg_arg_act(f->pro->in[0]);
    if (f->norm) {
        s->args[n++] = cg_arg_act(f->pro->in[2]);
        s->args[n++] = cg_arg_act(f->pro->in[3]);
        s->args[n++] = cg_arg_f32(f->eps);
    }
    return n;
}

moec_status cg_emit_attn_prologue(cg_ctx *c, const ir_op *op)
{
    const char *who = op->out[0]->name;
    const ir_value *x = op->in[0], *pos = op->in[1];
    pro_shape ps;
    MOEC_TRY(pro_check(c, op, &ps));
    long long N = ps.N, H = ps.H, HKV = ps.HKV, D = ps.D, rd = ps.rd;
    int norm = ps.norm;
    double eps = ps.eps;
    const char *style = ps.style;
    int neox = ps.neox;
    ir_dtype tx = ps.tx, ty = ps.ty, tw = ps.tw, tp = c->opt->compute_dtype;
    const ir_op *att = cg_attn_prologue_cache(c->m, op);
    if (att && cg_attn_prologue_fused(c, att) == op)
        return MOEC_OK; /* the attention's kernel runs it */
    int bs = c->opt->kv_block_size;
    if (att && bs < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "attn_prologue %%%s: kv_block_size %d", who, bs);
    cg_rope rt;
    MOEC_TRY(cg_rope_init(op, rd, &rt));
    char name[256], sig[64], cache[32] = "";
    cg_dtype_signature(c, op, sig, sizeof sig);
    if (att)
        snprintf(cache, sizeof cache, "_c%d_%s", bs, ir_dtype_name(tp));
    snprintf(name, sizeof name, "attn_prologue_h%lld_hkv%lld_d%lld_n%lld_r%lld_%s%s%s_t%d_%s_%08x",
             H, HKV, D, N, rd, style, norm ? "_norm" : "", cache, c->T, sig, rt.hash);
    int is_new;
    int k = cg_kernel(c, name, &is_new);
    ir_step *s = k < 0 ? NULL : cg_step(c, IR_STEP_KERNEL, op);
    if (!s) {
        cg_rope_free(&rt);
        return MOEC_ERR(MOEC_ERR_OOM, "attn_prologue %%%s: no memory", who);
    }
    s->kernel = k;
    s->grid[0] = (unsigned)c->T;
    s->grid[1] = (unsigned)((H + 2 * HKV + APK_HEADS - 1) / APK_HEADS);
    s->block[0] = APK_HEADS * 32;
    s->n_args = 0;
    s->args[s->n_args++] = cg_arg_act(x);
    s->args[s->n_args++] = cg_arg_act(pos);
    if (norm) {
        s->args[s->n_args++] = cg_arg_act(op->in[2]);
        s->args[s->n_args++] = cg_arg_act(op->in[3]);
    }
    for (int i = 0; i < 3; i++)
        s->args[s->n_args++] = cg_arg_act(op->out[i]);
    if (att)
        cg_step_cache_args(s, att, 2);
    if (norm)
        s->args[s->n_args++] = cg_arg_f32(eps);
    if (is_new) {
        moec_buf *o = &c->src;
        const char *cx = cg_ctype(tx), *cy = cg_ctype(ty), *cw = cg_ctype(tw), *cp = cg_ctype(tp);
        char sym[300];
        snprintf(sym, sizeof sym, "%s_inv_freq", name);
        moec_buf_printf(o, "%s", HELPERS);
        cg_rope_emit_table(o, &rt, sym);
        moec_buf_printf(o,
                        "// attn_prologue: q/k RMSNorms, ropes, v and the k/v cache rows "
                        "(codegen/attn_prologue.c), first for %%%s\n"
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(const %s "
                        "*__restrict__ x, const int *__restrict__ pos, ",
                        who, APK_HEADS * 32, name, cx);
        if (norm)
            moec_buf_printf(o, "const %s *__restrict__ qw, const %s *__restrict__ kw, ", cw, cw);
        moec_buf_printf(o, "%s *__restrict__ q, %s *__restrict__ k, %s *__restrict__ v", cy, cy,
                        cy);
        static const char *const pools[2] = {"kpool", "vpool"};
        int vec = pro_vec(N, D);
        if (att)
            cg_cache_params(o, cp, pools, 2);
        if (norm)
            moec_buf_printf(o, ", float eps");
        moec_buf_printf(o, ")\n{\n    typedef %s TX;\n    typedef %s TY;\n    typedef %s TW;\n"
                           "    typedef %s TC;\n    typedef %s TP;\n",
                        cx, cy, cw, cp, att ? cp : cy);
        /* the unused parts' names, so that one body serves every form */
        if (!norm)
            moec_buf_printf(o, "    const TW *qw = nullptr, *kw = nullptr;\n"
                               "    const float eps = 0.0f;\n"
                               "    (void)qw;\n    (void)kw;\n    (void)eps;\n");
        if (!att)
            cg_cache_none(o, "TP", pools, 2);
        moec_buf_printf(o,
                        "    constexpr int H = %lld, HKV = %lld, D = %lld, N = %lld, RD = %lld, "
                        "V = %d, HPB = %d, BS = %d;\n"
                        "    constexpr bool NEOX = %s, NORM = %s, CACHE = %s;\n"
                        "    constexpr float AF = %af;\n"
                        "    const float *inv_freq = %s;\n"
                        "    (void)BS;\n%s}\n\n",
                        H, HKV, D, N, rd, vec, APK_HEADS, att ? bs : 1,
                        neox ? "true" : "false", norm ? "true" : "false",
                        att ? "true" : "false", (double)rt.attn_factor, sym, BODY);
    }
    cg_rope_free(&rt);
    return MOEC_OK;
}
