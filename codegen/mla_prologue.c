/* mla_prologue.c — the MLA prologue ops (docs/IR.md, "mla_prologue"): one
 * kernel reads a token's row of the fused q/kv projection once and writes
 * q_nope contiguous for mla_qabsorb, the rotated q_pe, the q latent's
 * RMSNorm (q LoRA), the RMS-normed kv_c and the rotated k_pe, and the
 * token's kv_c and k_pe rows straight into the paged cache of the
 * mla_attention that reads them (cg_mla_prologue_cache), whose own write
 * kernel is then skipped. What the slices, rms_norms, ropes and the cache
 * write did in nine kernels (issue 15), with their formulas: the norm as
 * rms_norm.c computes it, the rotation with rope.c's frequency table
 * (cg_rope_init), padding tokens (slot < 0) written nowhere in the cache.
 *
 * A block takes one token and one role, blockIdx.y: a group of HG q heads
 * (their nope channels copied, their rope channels rotated), the q
 * latent's norm, or the kv side (norm, rotation, cache rows), so a token's
 * sections run side by side even at batch 1.
 *
 * Kernel mla_prologue[_kv|_q]_h<H>_dn<dn>_dr<dr>_r<r>_qr<qr>_n<N>_<style>
 * [_c<bs>]_t<T>_<dtype>_<rope hash>: grid (T, roles), block 128. */
#include <stdio.h>
#include <string.h>

#include "codegen/cg.h"
#include "err.h"

#define PRO_THREADS 128
/* q head channels a block takes, about */
#define PRO_GROUP_ELEMS 1024
/* Buckets from this many tokens launch the prologue plainly (its step's
 * plain), not as a programmatic dependent, where the q/kv projection before
 * it reads fp8 weights (the staged linear's kernel; MOEC_MLA_PRO_PLAIN_T,
 * 0: never). In fp8 at 64 tokens that kernel ran 13.9 us and the
 * prologue, launched early, ended 10.9 us after it, against 7.4 after
 * cuBLASLt's bf16 GEMM (the kernel timeline, V2-Lite cut to 4 layers); as
 * with GQA's fused prologue (codegen/attention.c), blocks resident early
 * seem to cost more than the launch they save. (H200, 2026-11-29, V2-Lite
 * at context 1024, one call, ms a step at 1 / 8 / 16 / 32 / 64 tokens: fp8
 * plain from 32 1.456 / 3.731 / 4.816 / 5.758 / 7.044, never 1.455 / 3.732
 * / 4.827 / 5.811 / 7.146, always 1.533 / 3.760 / 4.840 / 5.758 / 7.046;
 * bf16 at 32 / 64 plain 9.258 / 10.178, never 9.251 / 10.139, so bf16's
 * GEMMs keep the programmatic launch.) */
#define PRO_PLAIN_T 32

/* 1 where x is a linear's result over fp8 weights */
static int after_fp8_linear(const cg_ctx *c, const ir_value *x)
{
    const ir_op *d = x->def;
    return d && d->kind == IR_OP_LINEAR && d->n_in > 1 &&
           cg_storage(c, d->in[1]) == IR_DTYPE_F8E4M3;
}

/* The shared device code: a row's RMSNorm into y (and the cache row, when
 * given) and one rotated pair, both in fp32 as rms_norm.c and rope.c. */
static const char HELPERS[] =
    "#ifndef MOEC_MLA_PROLOGUE_HELPERS\n"
    "#define MOEC_MLA_PROLOGUE_HELPERS\n"
    "template <int D, int V, typename TX, typename TW, typename TY, typename TP>\n"
    "__device__ __forceinline__ void mla_pro_norm(const TX *x, const TW *w, TY *y, TP *pool, float eps)\n"
    "{\n"
    "    float ss = 0.0f;\n"
    "    for (int c = threadIdx.x * V; c < D; c += blockDim.x * V) {\n"
    "        float v[V];\n"
    "        ldv<V>(x + c, v);\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < V; j++)\n"
    "            ss += v[j] * v[j];\n"
    "    }\n"
    "    ss = block_sum(ss);\n"
    "    const float inv = 1.0f / sqrtf(ss / (float)D + eps);\n"
    "    for (int c = threadIdx.x * V; c < D; c += blockDim.x * V) {\n"
    "        float v[V], wv[V];\n"
    "        ldv<V>(x + c, v);\n"
    "        ldv<V>(w + c, wv);\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < V; j++)\n"
    "            v[j] = wv[j] * (v[j] * inv);\n"
    "        stv<V>(y + c, v);\n"
    "        if (pool)\n"
    "            stv<V>(pool + c, v);\n"
    "    }\n"
    "}\n"
    "\n"
    "/* pair k of a head of DR channels: (2k, 2k+1) interleaved, (k, k + DR/2) neox */\n"
    "template <int DR, bool NEOX, typename TX, typename TY, typename TP>\n"
    "__device__ __forceinline__ void mla_pro_rot(const TX *x, TY *y, TP *pool, int k, float p,\n"
    "                                            const float *inv_freq, float af)\n"
    "{\n"
    "    float sn, cs;\n"
    "    sincosf(p * inv_freq[k], &sn, &cs);\n"
    "    cs *= af;\n"
    "    sn *= af;\n"
    "    const int i0 = NEOX ? k : 2 * k, i1 = NEOX ? k + DR / 2 : 2 * k + 1;\n"
    "    const float x0 = ld(x + i0), x1 = ld(x + i1);\n"
    "    const float y0 = x0 * cs - x1 * sn, y1 = x1 * cs + x0 * sn;\n"
    "    st(y + i0, y0);\n"
    "    st(y + i1, y1);\n"
    "    if (pool) {\n"
    "        st(pool + i0, y0);\n"
    "        st(pool + i1, y1);\n"
    "    }\n"
    "}\n"
    "#endif\n\n";

/* The kernel body after its constants (H, DN, DR, R, QR, N, KO = the kv
 * section's first column, NQG head groups of HG, vector widths VN, VQ, VR,
 * BS, the flags HEADS, LATENT, KV, CACHE, NEOX, AF) and `inv_freq`. */
static const char BODY[] =
    "    const int t = bx, role = by, tid = threadIdx.x;\n"
    "    const TX *xr = x + (long long)t * N;\n"
    "    const float p = (float)pos[t];\n"
    "    if constexpr (HEADS) {\n"
    "        if (role < NQG) {\n"
    "            const int h0 = role * HG, nh = H - h0 < HG ? H - h0 : HG;\n"
    "            if constexpr (NOPE)\n"
    "                for (int i = tid; i < nh * (DN / VN); i += blockDim.x) {\n"
    "                    const int hh = h0 + i / (DN / VN), j = (i % (DN / VN)) * VN;\n"
    "                    cpv<VN>(q_nope + ((long long)t * H + hh) * DN + j, xr + hh * (DN + DR) + j);\n"
    "                }\n"
    "            for (int i = tid; i < nh * (DR / 2); i += blockDim.x) {\n"
    "                const int hh = h0 + i / (DR / 2), k = i % (DR / 2);\n"
    "                mla_pro_rot<DR, NEOX>(xr + hh * (DN + DR) + DN, q_pe + ((long long)t * H + hh) * DR,\n"
    "                                      (TY *)nullptr, k, p, inv_freq, AF);\n"
    "            }\n"
    "            return;\n"
    "        }\n"
    "    }\n"
    "    if constexpr (LATENT) {\n"
    "        if (role == NQG) {\n"
    "            mla_pro_norm<QR, VQ>(xr, q_w, q_a + (long long)t * QR, (TY *)nullptr, eps);\n"
    "            return;\n"
    "        }\n"
    "    }\n"
    "    if constexpr (KV) {\n"
    "        TP *kvrow = nullptr, *perow = nullptr;\n"
    "        if constexpr (CACHE) {\n"
    "            /* padding tokens (slot < 0) and positions past the table write no cache row */\n"
    "            const int s = slots[t], pp = positions[t];\n"
    "            if (s >= 0 && pp >= 0 && pp / BS < max_blocks) {\n"
    "                const long long row = (long long)block_table[(long long)s * max_blocks + pp / BS] * BS + pp % BS;\n"
    "                kvrow = kvpool + row * R;\n"
    "                perow = pepool + row * DR;\n"
    "            }\n"
    "        }\n"
    "        mla_pro_norm<R, VR>(xr + KO, kv_w, kv_c + (long long)t * R, kvrow, eps);\n"
    "        for (int k = tid; k < DR / 2; k += blockDim.x)\n"
    "            mla_pro_rot<DR, NEOX>(xr + KO + R, k_pe + (long long)t * DR, perow, k, p, inv_freq, AF);\n"
    "    }\n";

static long long gcd(long long a, long long b) { return b ? gcd(b, a % b) : a; }

static int kv_result(const ir_op *pro, int i)
{
    return pro->n_out - 2 + i; /* kv_c, then k_pe: the last two results */
}

const ir_op *cg_mla_prologue_cache(const ir_module *m, const ir_op *pro)
{
    if (pro->kind != IR_OP_MLA_PROLOGUE && pro->kind != IR_OP_MLA_PROLOGUE_KV)
        return NULL;
    return cg_cache_reader(m, pro, IR_OP_MLA_ATTENTION, 2, pro->out[kv_result(pro, 0)],
                           pro->out[kv_result(pro, 1)]);
}

const ir_op *cg_mla_prologue_qabsorb(const cg_ctx *c, const ir_op *pro, cg_qabsorb_part *part)
{
    if ((pro->kind != IR_OP_MLA_PROLOGUE && pro->kind != IR_OP_MLA_PROLOGUE_Q) ||
        pro->id + 1 >= c->m->n_ops || !cg_env_int("MOEC_MLA_PRO_QABSORB", 1, 0, 1))
        return NULL;
    const ir_op *qa = c->m->ops[pro->id + 1];
    cg_qabsorb_part own;
    if (!part)
        part = &own;
    if (qa->kind != IR_OP_MLA_QABSORB || qa->stream != pro->stream || qa->in[0] != pro->in[0] ||
        !cg_mla_qabsorb_part(c, qa, part))
        return NULL;
    /* the absorption's result is written at pro's place in the steps: in
       bytes that no operand of either op holds (q_nope, read by nothing,
       is not written) */
    const ir_value *y = qa->out[0];
    for (int i = 0; i < pro->n_in; i++)
        if (cg_acts_overlap(c, y, pro->in[i]))
            return NULL;
    for (int i = 0; i < pro->n_out; i++)
        if (cg_read_after(c->m, pro->out[i], -1) && cg_acts_overlap(c, y, pro->out[i]))
            return NULL;
    return qa;
}

/* A pointer parameter and its argument. */
static void param(moec_buf *p, ir_step *s, const char *decl, ir_arg a)
{
    moec_buf_printf(p, "%s%s", s->n_args ? ", " : "", decl);
    s->args[s->n_args++] = a;
}

moec_status cg_emit_mla_prologue(cg_ctx *c, const ir_op *op)
{
    const char *who = op->out[0]->name;
    const ir_value *x = op->in[0], *pos = op->in[1];
    int heads = op->kind != IR_OP_MLA_PROLOGUE_KV, kv = op->kind != IR_OP_MLA_PROLOGUE_Q;
    int latent = op->kind == IR_OP_MLA_PROLOGUE_KV;
    if (op->kind != IR_OP_MLA_PROLOGUE && !latent && op->kind != IR_OP_MLA_PROLOGUE_Q)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%%%s: %s is no MLA prologue op", who,
                        ir_op_name(op->kind));
    long long N = x->type.rank == 2 ? x->type.dims[1] : 0;
    long long DR = ir_op_attr_int(op, "qk_rope_head_dim", 0);
    long long H = heads ? ir_op_attr_int(op, "heads", 0) : 0;
    long long DN = heads ? ir_op_attr_int(op, "qk_nope_head_dim", 0) : 0;
    long long R = kv ? ir_type_numel(&op->in[2]->type, 1) : 0;
    long long QR = latent ? ir_type_numel(&op->in[3]->type, 1) : 0;
    long long KO = heads ? H * (DN + DR) : QR; /* the kv section's first column */
    double eps = kv ? ir_op_attr_float(op, "eps", -1) : 0;
    if (N < 1 || DR < 2 || DR % 2 || (heads && (H < 1 || DN < 1)) || (kv && R < 1) ||
        (latent && QR < 1) || KO + (kv ? R + DR : 0) > N || eps < 0 ||
        cg_storage(c, pos) != IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s %%%s: wants x [T, N] holding its sections, pos i32[T], an even "
                        "qk_rope_head_dim and eps >= 0",
                        ir_op_name(op->kind), who);
    const char *style = ir_op_attr_str(op, "style", "");
    int neox = !strcmp(style, "neox");
    if (!neox && strcmp(style, "interleave") != 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s %%%s: style must be \"interleave\" or \"neox\", not \"%s\"",
                        ir_op_name(op->kind), who, style);
    ir_dtype tx = cg_storage(c, x), ty = cg_storage(c, op->out[0]);
    ir_dtype tw = kv ? cg_storage(c, op->in[2]) : ty, tp = c->opt->compute_dtype;
    int same = 1;
    for (int i = 0; i < op->n_out; i++)
        same &= cg_storage(c, op->out[i]) == ty;
    if (latent)
        same &= cg_storage(c, op->in[3]) == tw;
    if (!same || tx == IR_DTYPE_I32 || ty == IR_DTYPE_I32 || tw == IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s %%%s: its results (and its norm weights) must be stored alike, as "
                        "floats",
                        ir_op_name(op->kind), who);
    const ir_op *att = cg_mla_prologue_cache(c->m, op);
    int bs = c->opt->kv_block_size;
    if (att && bs < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s %%%s: kv_block_size %d", ir_op_name(op->kind),
                        who, bs);
    /* heads per block, and the roles: head groups, the latent, the kv side */
    long long hg = heads ? PRO_GROUP_ELEMS / (DN + DR) : 0;
    hg = hg < 1 ? 1 : hg > H ? H : hg;
    long long nqg = heads ? (H + hg - 1) / hg : 0, roles = nqg + latent + kv;
    cg_rope rt;
    MOEC_TRY(cg_rope_init(op, DR, &rt));
    char name[256], tag[64];
    if (tx == ty && tw == ty && tp == ty)
        snprintf(tag, sizeof tag, "%s", ir_dtype_name(ty));
    else
        snprintf(tag, sizeof tag, "%s_%s_%s_%s", ir_dtype_name(ty), ir_dtype_name(tx),
                 ir_dtype_name(tw), ir_dtype_name(tp));
    char cache[32] = "", fused[128] = "";
    if (att)
        snprintf(cache, sizeof cache, "_c%d", bs);
    /* q_nope is copied out only where something reads it; the absorption
       may run in this kernel (cg_mla_prologue_qabsorb) */
    int nope = heads && cg_read_after(c->m, op->out[0], -1);
    cg_qabsorb_part part = {0};
    const ir_op *qa = cg_mla_prologue_qabsorb(c, op, &part);
    if (qa)
        snprintf(fused, sizeof fused, "_qabsorb_%s", part.tag);
    snprintf(name, sizeof name,
             "mla_prologue%s_h%lld_dn%lld_dr%lld_r%lld_qr%lld_n%lld_%s%s%s%s_t%d_%s_%08x",
             latent ? "_kv" : kv ? "" : "_q", H, DN, DR, R, QR, N, style, cache,
             heads && !nope ? "_nonope" : "", fused, c->T, tag, rt.hash);
    int is_new;
    int k = cg_kernel(c, name, &is_new);
    ir_step *s = k < 0 ? NULL : cg_step(c, IR_STEP_KERNEL, op);
    if (!s) {
        cg_rope_free(&rt);
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: no memory", ir_op_name(op->kind), who);
    }
    s->kernel = k;
    int plain_t = cg_env_int("MOEC_MLA_PRO_PLAIN_T", PRO_PLAIN_T, 0, 1 << 20);
    s->plain = plain_t > 0 && c->T >= plain_t && after_fp8_linear(c, x);
    /* fused: the absorption's blocks first, then the prologue's, on one axis */
    unsigned threads = qa && part.threads > PRO_THREADS ? part.threads : PRO_THREADS;
    s->grid[0] = qa ? part.blocks + (unsigned)(c->T * roles) : (unsigned)c->T;
    s->grid[1] = qa ? 1u : (unsigned)roles;
    s->block[0] = threads;
    s->smem = qa ? part.smem : 0;
    /* the parameters, in the steps' argument order */
    moec_buf params = {0};
    char decl[128];
    const char *cx = cg_ctype(tx), *cy = cg_ctype(ty), *cw = cg_ctype(tw);
    snprintf(decl, sizeof decl, "const %s *__restrict__ x", cx);
    param(&params, s, decl, cg_arg_act(x));
    param(&params, s, "const int *__restrict__ pos", cg_arg_act(pos));
    int o = 0;
    if (heads) {
        snprintf(decl, sizeof decl, "%s *__restrict__ q_nope", cy);
        param(&params, s, decl, cg_arg_act(op->out[o++]));
        snprintf(decl, sizeof decl, "%s *__restrict__ q_pe", cy);
        param(&params, s, decl, cg_arg_act(op->out[o++]));
    }
    if (latent) {
        snprintf(decl, sizeof decl, "const %s *__restrict__ q_w", cw);
        param(&params, s, decl, cg_arg_act(op->in[3]));
        snprintf(decl, sizeof decl, "%s *__restrict__ q_a", cy);
        param(&params, s, decl, cg_arg_act(op->out[o++]));
    }
    if (kv) {
        snprintf(decl, sizeof decl, "const %s *__restrict__ kv_w", cw);
        param(&params, s, decl, cg_arg_act(op->in[2]));
        snprintf(decl, sizeof decl, "%s *__restrict__ kv_c", cy);
        param(&params, s, decl, cg_arg_act(op->out[o++]));
        snprintf(decl, sizeof decl, "%s *__restrict__ k_pe", cy);
        param(&params, s, decl, cg_arg_act(op->out[o++]));
    }
    if (att) {
        param(&params, s, "const int *__restrict__ positions", cg_arg_input(IR_INPUT_POSITIONS));
        param(&params, s, "const int *__restrict__ slots", cg_arg_input(IR_INPUT_SLOTS));
        param(&params, s, "const int *__restrict__ block_table",
              cg_arg_input(IR_INPUT_BLOCK_TABLE));
        param(&params, s, "int max_blocks", cg_arg_config(IR_CONFIG_MAX_BLOCKS));
        snprintf(decl, sizeof decl, "%s *__restrict__ kvpool", cg_ctype(tp));
        param(&params, s, decl, cg_arg_kv(att, 0));
        snprintf(decl, sizeof decl, "%s *__restrict__ pepool", cg_ctype(tp));
        param(&params, s, decl, cg_arg_kv(att, 1));
    }
    if (kv)
        param(&params, s, "float eps", cg_arg_f32(eps));
    if (qa) {
        snprintf(decl, sizeof decl, "const %s *__restrict__ kv_b", cg_ctype(part.dw));
        param(&params, s, decl, cg_arg_act(qa->in[1]));
        snprintf(decl, sizeof decl, "%s *__restrict__ y", cg_ctype(part.dy));
        param(&params, s, decl, cg_arg_act(qa->out[0]));
    }
    if (is_new && !params.oom) {
        moec_buf *b = &c->src;
        char sym[300];
        snprintf(sym, sizeof sym, "%s_inv_freq", name);
        moec_buf_printf(b, "%s", HELPERS);
        cg_rope_emit_table(b, &rt, sym);
        /* the unused sections' pointers, so that one body serves every form */
        moec_buf_printf(b,
                        "// %s%s (codegen/mla_prologue.c), first for %%%s\n"
                        "extern \"C\" __global__ void __launch_bounds__(%u) %s(%s)\n{\n",
                        ir_op_name(op->kind), qa ? " and the mla_qabsorb after it" : "", who,
                        threads, name, params.data);
        if (qa) {
            /* blocks [0, QA_BLOCKS) run the absorption (bx: its head, by:
               its column group), the rest the prologue (bx: the token, by:
               the role) */
            moec_buf_printf(b,
                            "    constexpr unsigned QA_BLOCKS = %uu, QA_GX = %uu, NTOK = %uu;\n"
                            "    const bool qa_part = blockIdx.x < QA_BLOCKS;\n"
                            "    const unsigned vb = qa_part ? blockIdx.x : blockIdx.x - QA_BLOCKS;\n"
                            "    const int bx = (int)(qa_part ? vb %% QA_GX : vb %% NTOK), "
                            "by = (int)(qa_part ? vb / QA_GX : vb / NTOK);\n"
                            "    if (qa_part) {\n",
                            part.blocks, part.grid_x, (unsigned)c->T);
            cg_mla_qabsorb_emit_part(b, c, qa);
            moec_buf_printf(b, "        return;\n    }\n    moec_pdl_enter();\n");
        } else {
            moec_buf_printf(b, "    const int bx = blockIdx.x, by = blockIdx.y;\n");
        }
        moec_buf_printf(b, "    typedef %s TX;\n    typedef %s TY;\n    typedef %s TP;\n", cx, cy,
                        cg_ctype(att ? tp : ty));
        if (!heads)
            moec_buf_printf(b, "    TY *q_nope = nullptr, *q_pe = nullptr;\n"
                               "    (void)q_nope;\n    (void)q_pe;\n");
        if (!latent)
            moec_buf_printf(b, "    const %s *q_w = nullptr;\n    TY *q_a = nullptr;\n"
                               "    (void)q_w;\n    (void)q_a;\n", cw);
        if (!kv)
            moec_buf_printf(b, "    const TY *kv_w = nullptr;\n    TY *kv_c = nullptr, *k_pe = "
                               "nullptr;\n    const float eps = 0.0f;\n"
                               "    (void)kv_w;\n    (void)kv_c;\n    (void)k_pe;\n    (void)eps;\n");
        if (!att)
            moec_buf_printf(b, "    const int *positions = nullptr, *slots = nullptr, "
                               "*block_table = nullptr;\n    const int max_blocks = 0;\n"
                               "    TP *kvpool = nullptr, *pepool = nullptr;\n"
                               "    (void)positions;\n    (void)slots;\n    (void)block_table;\n"
                               "    (void)max_blocks;\n    (void)kvpool;\n    (void)pepool;\n");
        /* vector widths that keep every row's sections aligned */
        long long vn = heads ? cg_vec_width(gcd(gcd(N, DN + DR), DN)) : 1;
        long long vq = latent ? cg_vec_width(gcd(N, QR)) : 1;
        long long vr = kv ? cg_vec_width(gcd(gcd(N, KO), R)) : 1;
        moec_buf_printf(b,
                        "    constexpr int H = %lld, DN = %lld, DR = %lld, R = %lld, QR = %lld, "
                        "N = %lld, KO = %lld, NQG = %lld, HG = %lld, VN = %lld, VQ = %lld, "
                        "VR = %lld, BS = %d;\n"
                        "    constexpr bool HEADS = %s, LATENT = %s, KV = %s, CACHE = %s, "
                        "NEOX = %s, NOPE = %s;\n"
                        "    constexpr float AF = %af;\n"
                        "    const float *inv_freq = %s;\n"
                        "    (void)BS;\n    (void)R;\n    (void)QR;\n    (void)KO;\n"
                        "    (void)VN;\n    (void)VQ;\n    (void)VR;\n    (void)HG;\n%s}\n\n",
                        H ? H : 1, DN ? DN : 1, DR, R ? R : 1, QR ? QR : 1, N, KO, nqg,
                        hg ? hg : 1, vn, vq, vr, att ? bs : 1, heads ? "true" : "false",
                        latent ? "true" : "false", kv ? "true" : "false",
                        att ? "true" : "false", neox ? "true" : "false", nope ? "true" : "false",
                        (double)rt.attn_factor, sym, BODY);
    }
    cg_rope_free(&rt);
    int oom = params.oom;
    moec_buf_free(&params);
    if (oom)
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: no memory", ir_op_name(op->kind), who);
    return MOEC_OK;
}
