/* mla_attention.c — MLA decode attention over the compressed paged cache
 * (docs/IR.md, mla_attention): the cache holds only kv_c [r] and k_pe [dr]
 * per position; logits are scale * (q_c . kv_c[p] + q_pe . k_pe[p]) and the
 * values are kv_c[p] itself. Two kernels: the cache write of this step's
 * rows (none for padding tokens), then attention. Every head of a token
 * reads the same cache rows, so one block takes one token and a group of
 * heads: each tile of positions is read from the cache once into shared
 * memory and serves all the block's heads, first for the scores (one thread
 * per (head, position)), then for the output (each thread owns a few heads
 * by a few channels), with an online softmax in fp32 in between. */
#include <stdio.h>

#include "codegen/cg.h"
#include "err.h"

#define MLA_THREADS 256
#define MLA_SMEM_MAX (46 * 1024)
/* Blocks that keep an H100's 132 SMs busy, and the most splits of a sequence. */
#define MLA_TARGET_BLOCKS 264
#define MLA_MAX_SPLITS 64

static const char WRITE_BODY[] =
    "    const int t = blockIdx.x;\n"
    "    const int s = slots[t], p = pos[t];\n"
    "    if (s < 0 || p < 0 || p / BS >= max_blocks)\n"
    "        return;\n"
    "    const long long row = (long long)block_table[(long long)s * max_blocks + p / BS] * BS + p % BS;\n"
    "    for (int i = threadIdx.x; i < R / VR; i += blockDim.x)\n"
    "        cpv<VR>(kvpool + row * R + i * VR, kv_c + (long long)t * R + i * VR);\n"
    "    for (int i = threadIdx.x; i < DR / VD; i += blockDim.x)\n"
    "        cpv<VD>(pepool + row * DR + i * VD, k_pe + (long long)t * DR + i * VD);\n";

static const char ATTN_BODY[] =
    "    constexpr int NW = NT / 32, RS = R + DR, RG = R / CS, ITEMS = (HB / HS) * RG;\n"
    "    constexpr int NI = (ITEMS + NT - 1) / NT;\n"
    "    __shared__ __align__(16) TQ q_s[HB][QLD];\n"
    "    __shared__ __align__(16) TS kv_s[PT][LDK];\n"
    "    __shared__ float sc_s[HB][PT + 1];\n"
    "    __shared__ float p_s[PT][HB];\n"
    "    __shared__ float alpha_s[HB], m_s[HB], l_s[HB];\n"
    "    __shared__ long long row_s[PT];\n"
    "    const int t = blockIdx.x, h0 = blockIdx.y * HB;\n"
    "    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;\n"
    "    const int s = slots[t], p = pos[t];\n"
    "    TO *o = out + ((long long)t * H + h0) * R;\n"
    "    if (s < 0 || p < 0 || p / BS >= max_blocks) {\n"
    "        if constexpr (NSPLIT == 1)\n"
    "            for (int i = tid; i < HB * R; i += NT)\n"
    "                st(o + i, 0.0f);\n"
    "        return;\n"
    "    }\n"
    "    for (int i = tid; i < HB * RS; i += NT) {\n"
    "        const int hh = i / RS, j = i % RS;\n"
    "        if (j < R)\n"
    "            q_s[hh][j] = q_c[((long long)t * H + h0 + hh) * R + j];\n"
    "        else\n"
    "            st(&q_s[hh][j], ld(q_pe + ((long long)t * H + h0 + hh) * DR + j - R));\n"
    "    }\n"
    "    if (tid < HB) {\n"
    "        m_s[tid] = MOEC_NEG_INF;\n"
    "        l_s[tid] = 0.0f;\n"
    "    }\n"
    "    float acc[NI][HS][CS];\n"
    "#pragma unroll\n"
    "    for (int ni = 0; ni < NI; ni++)\n"
    "#pragma unroll\n"
    "        for (int a = 0; a < HS; a++)\n"
    "#pragma unroll\n"
    "            for (int b = 0; b < CS; b++)\n"
    "                acc[ni][a][b] = 0.0f;\n"
    "    const int lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;\n"
    "    const int n_tiles = (p - lo + PT) / PT;\n"
    "    /* this block's share of the tiles when the sequence is split */\n"
    "    const int per = (n_tiles + NSPLIT - 1) / NSPLIT, first = blockIdx.z * per;\n"
    "    const int last = first + per < n_tiles ? first + per : n_tiles;\n"
    "    const int *bt = block_table + (long long)s * max_blocks;\n"
    "    for (int tile = first; tile < last; tile++) {\n"
    "        const int p0 = lo + tile * PT;\n"
    "        const int nv = p - p0 + 1 < PT ? p - p0 + 1 : PT;\n"
    "        if (tid < nv)\n"
    "            row_s[tid] = (long long)bt[(p0 + tid) / BS] * BS + (p0 + tid) % BS;\n"
    "        __syncthreads();\n"
    "        for (int i = tid; i < nv * (RS / VE); i += NT) {\n"
    "            const int r = i / (RS / VE), j = (i % (RS / VE)) * VE;\n"
    "            if (j < R)\n"
    "                cpv<VE>(&kv_s[r][j], kvpool + row_s[r] * R + j);\n"
    "            else\n"
    "                cpv<VE>(&kv_s[r][j], pepool + row_s[r] * DR + (j - R));\n"
    "        }\n"
    "        __syncthreads();\n"
    "        for (int i = tid; i < HB * PT; i += NT) {\n"
    "            const int hh = i / PT, pp = i % PT;\n"
    "            float sc = MOEC_NEG_INF;\n"
    "            if (pp < nv) {\n"
    "                float dot = 0.0f;\n"
    "                for (int j = 0; j < RS; j += VE) {\n"
    "                    float a[VE], b[VE];\n"
    "                    ldv<VE>(&q_s[hh][j], a);\n"
    "                    ldv<VE>(&kv_s[pp][j], b);\n"
    "#pragma unroll\n"
    "                    for (int e = 0; e < VE; e++)\n"
    "                        dot += a[e] * b[e];\n"
    "                }\n"
    "                sc = dot * scale;\n"
    "            }\n"
    "            sc_s[hh][pp] = sc;\n"
    "        }\n"
    "        __syncthreads();\n"
    "        for (int hh = warp; hh < HB; hh += NW) {\n"
    "            const float v = lane < PT ? sc_s[hh][lane] : MOEC_NEG_INF;\n"
    "            const float mold = m_s[hh];\n"
    "            const float mnew = fmaxf(mold, warp_max(v));\n"
    "            const float pr = lane < nv ? expf(v - mnew) : 0.0f;\n"
    "            const float lsum = warp_sum(pr);\n"
    "            if (lane < PT)\n"
    "                p_s[lane][hh] = pr;\n"
    "            if (lane == 0) {\n"
    "                const float alpha = expf(mold - mnew);\n"
    "                alpha_s[hh] = alpha;\n"
    "                l_s[hh] = l_s[hh] * alpha + lsum;\n"
    "                m_s[hh] = mnew;\n"
    "            }\n"
    "        }\n"
    "        __syncthreads();\n"
    "#pragma unroll\n"
    "        for (int ni = 0; ni < NI; ni++) {\n"
    "            const int item = tid + ni * NT;\n"
    "            if (ITEMS % NT != 0 && item >= ITEMS)\n"
    "                continue;\n"
    "            const int c0 = (item % RG) * CS, hb = (item / RG) * HS;\n"
    "#pragma unroll\n"
    "            for (int a = 0; a < HS; a++) {\n"
    "                const float al = alpha_s[hb + a];\n"
    "#pragma unroll\n"
    "                for (int b = 0; b < CS; b++)\n"
    "                    acc[ni][a][b] *= al;\n"
    "            }\n"
    "            for (int pp = 0; pp < nv; pp++) {\n"
    "                float kv[CS];\n"
    "                ldv<CS>(&kv_s[pp][c0], kv);\n"
    "#pragma unroll\n"
    "                for (int a = 0; a < HS; a++) {\n"
    "                    const float pr = p_s[pp][hb + a];\n"
    "#pragma unroll\n"
    "                    for (int b = 0; b < CS; b++)\n"
    "                        acc[ni][a][b] += pr * kv[b];\n"
    "                }\n"
    "            }\n"
    "        }\n"
    "        __syncthreads();\n"
    "    }\n"
    "    __syncthreads();\n"
    "    /* split: this block's softmax state (m, l) and unnormalised output */\n"
    "    const long long part = ((long long)t * H + h0) * NSPLIT + blockIdx.z;\n"
    "    if constexpr (NSPLIT > 1) {\n"
    "        if (tid < HB) {\n"
    "            part_ml[(part + (long long)tid * NSPLIT) * 2] = m_s[tid];\n"
    "            part_ml[(part + (long long)tid * NSPLIT) * 2 + 1] = l_s[tid];\n"
    "        }\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int ni = 0; ni < NI; ni++) {\n"
    "        const int item = tid + ni * NT;\n"
    "        if (ITEMS % NT != 0 && item >= ITEMS)\n"
    "            continue;\n"
    "        const int c0 = (item % RG) * CS, hb = (item / RG) * HS;\n"
    "#pragma unroll\n"
    "        for (int a = 0; a < HS; a++) {\n"
    "            if constexpr (NSPLIT > 1) {\n"
    "                stv<CS>(part_o + (part + (long long)(hb + a) * NSPLIT) * R + c0, acc[ni][a]);\n"
    "            } else {\n"
    "                const float l = l_s[hb + a];\n"
    "                float y[CS];\n"
    "#pragma unroll\n"
    "                for (int b = 0; b < CS; b++)\n"
    "                    y[b] = acc[ni][a][b] / l;\n"
    "                stv<CS>(o + (long long)(hb + a) * R + c0, y);\n"
    "            }\n"
    "        }\n"
    "    }\n";

/* Merges the splits of each (token, head): out = sum_z o_z e^(m_z - M) /
 * sum_z l_z e^(m_z - M); padding tokens get zeros. */
static const char COMBINE_BODY[] =
    "    __shared__ float w_s[NSPLIT];\n"
    "    __shared__ float inv_s;\n"
    "    const int t = blockIdx.x, h = blockIdx.y, s = slots[t], p = pos[t];\n"
    "    TO *o = out + ((long long)t * H + h) * D;\n"
    "    if (s < 0 || p < 0 || p / BS >= max_blocks) {\n"
    "        for (int c = threadIdx.x; c < D; c += blockDim.x)\n"
    "            st(o + c, 0.0f);\n"
    "        return;\n"
    "    }\n"
    "    const long long part = ((long long)t * H + h) * NSPLIT;\n"
    "    if (threadIdx.x < 32) {\n"
    "        float mx = MOEC_NEG_INF;\n"
    "        for (int z = threadIdx.x; z < NSPLIT; z += 32)\n"
    "            mx = fmaxf(mx, part_ml[(part + z) * 2]);\n"
    "        mx = warp_max(mx);\n"
    "        float l = 0.0f;\n"
    "        for (int z = threadIdx.x; z < NSPLIT; z += 32) {\n"
    "            const float m = part_ml[(part + z) * 2];\n"
    "            const float w = m == MOEC_NEG_INF ? 0.0f : expf(m - mx);\n"
    "            w_s[z] = w;\n"
    "            l += w * part_ml[(part + z) * 2 + 1];\n"
    "        }\n"
    "        l = warp_sum(l);\n"
    "        if (threadIdx.x == 0)\n"
    "            inv_s = 1.0f / l;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    for (int c = threadIdx.x; c < D; c += blockDim.x) {\n"
    "        float a = 0.0f;\n"
    "        for (int z = 0; z < NSPLIT; z++)\n"
    "            if (w_s[z] != 0.0f)\n"
    "                a += part_o[(part + z) * D + c] * w_s[z];\n"
    "        st(o + c, a * inv_s);\n"
    "    }\n";

static int vec_of(long long n)
{
    return n % 8 == 0 ? 8 : n % 4 == 0 ? 4 : n % 2 == 0 ? 2 : 1;
}

static long long gcd(long long a, long long b) { return b ? gcd(b, a % b) : a; }

static long long round_up(long long n, long long m) { return (n + m - 1) / m * m; }

/* Shared memory of the attention kernel for hb heads and pt positions. */
static long long attn_smem(long long hb, long long pt, long long qld, long long ldk, long long qsz,
                           long long esz)
{
    return hb * qld * qsz + pt * ldk * esz + hb * (pt + 1) * 4 + pt * hb * 4 + 3 * hb * 4 + pt * 8;
}

moec_status cg_emit_mla_attention(cg_ctx *c, const ir_op *op)
{
    const char *who = op->out[0]->name;
    const ir_value *qc = op->in[0], *qpe = op->in[1], *kvc = op->in[2], *kpe = op->in[3];
    if (op->n_in != 5 || qc->type.rank != 3 || qpe->type.rank != 3 || kvc->type.rank != 2 ||
        kpe->type.rank != 3)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "mla_attention %%%s: wants q_c [T, H, r], q_pe [T, H, dr], kv_c [T, r], "
                        "k_pe [T, 1, dr], pos",
                        who);
    long long H = qc->type.dims[1], R = qc->type.dims[2], DR = qpe->type.dims[2];
    if (qpe->type.dims[1] != H || kvc->type.dims[1] != R || kpe->type.dims[1] != 1 ||
        kpe->type.dims[2] != DR || H < 1 || R < 1 || DR < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "mla_attention %%%s: shapes of q_c, q_pe, kv_c, k_pe disagree", who);
    ir_dtype dt = c->opt->compute_dtype, qdt = cg_storage(c, qc), pdt = cg_storage(c, qpe),
             cdt = cg_storage(c, kvc), edt = cg_storage(c, kpe), odt = cg_storage(c, op->out[0]);
    if (qdt == IR_DTYPE_I32 || pdt == IR_DTYPE_I32 || cdt == IR_DTYPE_I32 || edt == IR_DTYPE_I32 ||
        odt == IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "mla_attention %%%s: operands must be float", who);
    int bs = c->opt->kv_block_size;
    if (bs < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "mla_attention %%%s: kv_block_size %d", who, bs);
    long long esz = (long long)ir_dtype_size(dt), qsz = (long long)ir_dtype_size(qdt);
    long long RS = R + DR;
    int ve = vec_of(gcd(R, DR));
    long long qld = round_up(RS, 16 / qsz), ldk = round_up(RS, 16 / esz) + 16 / esz;
    /* heads per block: the largest divisor of H up to 16; then positions per
       tile, then fewer heads, until shared memory fits */
    int hb = 0;
    for (int d = (int)(H < 16 ? H : 16); d >= 1; d--)
        if (H % d == 0) {
            hb = d;
            break;
        }
    int pt = 32;
    while (attn_smem(hb, pt, qld, ldk, qsz, esz) > MLA_SMEM_MAX) {
        if (pt > 8) {
            pt /= 2;
            continue;
        }
        int d = hb - 1;
        while (d >= 1 && H % d)
            d--;
        if (d < 1)
            return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                            "mla_attention %%%s: r %lld + dr %lld do not fit shared memory", who, R,
                            DR);
        hb = d;
    }
    int cs = vec_of(R);
    /* heads per thread: as many as keep the accumulators at 32 registers and
       all threads busy */
    int hs = 1;
    for (int d = hb; d >= 1; d--)
        if (hb % d == 0 && d * cs <= 32 && (hb / d) * (R / cs) >= MLA_THREADS) {
            hs = d;
            break;
        }
    long long items = (hb / hs) * (R / cs);
    if ((items + MLA_THREADS - 1) / MLA_THREADS * hs * cs > 64)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "mla_attention %%%s: r %lld needs more accumulators than registers hold", who,
                        R);
    /* split the sequence when the bucket's blocks cannot fill the GPU */
    long long blocks = (long long)c->T * (H / hb);
    int ns = (int)((MLA_TARGET_BLOCKS + blocks - 1) / blocks);
    if (ns > MLA_MAX_SPLITS)
        ns = MLA_MAX_SPLITS;
    const char *ts = cg_ctype(dt);
    char tag[64];
    if (cdt == dt && edt == dt)
        snprintf(tag, sizeof tag, "%s", ir_dtype_name(dt));
    else
        snprintf(tag, sizeof tag, "%s_%s_%s", ir_dtype_name(dt), ir_dtype_name(cdt),
                 ir_dtype_name(edt));

    char wname[256];
    snprintf(wname, sizeof wname, "mla_kv_write_r%lld_dr%lld_bs%d_t%d_%s", R, DR, bs, c->T, tag);
    int is_new = 0;
    int kw = cg_kernel(c, wname, &is_new);
    if (kw < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "mla_attention %%%s: no memory", who);
    if (is_new) {
        cg_buf_printf(&c->src,
                      "// mla_attention: cache write of kv_c and k_pe (codegen/mla_attention.c, "
                      "cg_emit_mla_attention)\n"
                      "extern \"C\" __global__ void __launch_bounds__(128) %s(const %s *__restrict__ "
                      "kv_c, const %s *__restrict__ k_pe, const int *__restrict__ pos, const int "
                      "*__restrict__ slots, const int *__restrict__ block_table, int max_blocks, %s "
                      "*__restrict__ kvpool, %s *__restrict__ pepool)\n{\n"
                      "    constexpr int R = %lld, DR = %lld, BS = %d, VR = %d, VD = %d;\n",
                      wname, cg_ctype(cdt), cg_ctype(edt), ts, ts, R, DR, bs, vec_of(R), vec_of(DR));
        cg_buf_printf(&c->src, "%s}\n\n", WRITE_BODY);
    }
    rt_step *s = cg_step(c, RT_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "mla_attention %%%s: no memory", who);
    s->kernel = kw;
    s->grid[0] = (unsigned)c->T;
    s->block[0] = 128;
    s->n_args = 8;
    s->args[0] = cg_arg_act(kvc);
    s->args[1] = cg_arg_act(kpe);
    s->args[2] = cg_arg_input(RT_INPUT_POSITIONS);
    s->args[3] = cg_arg_input(RT_INPUT_SLOTS);
    s->args[4] = cg_arg_input(RT_INPUT_BLOCK_TABLE);
    s->args[5] = cg_arg_config(RT_CONFIG_MAX_BLOCKS);
    s->args[6] = cg_arg_kv(op, 0);
    s->args[7] = cg_arg_kv(op, 1);

    char aname[256];
    if (qdt == dt && pdt == dt && odt == dt)
        snprintf(tag, sizeof tag, "%s", ir_dtype_name(dt));
    else
        snprintf(tag, sizeof tag, "%s_%s_%s_%s", ir_dtype_name(dt), ir_dtype_name(qdt),
                 ir_dtype_name(pdt), ir_dtype_name(odt));
    snprintf(aname, sizeof aname, "mla_attn_h%lld_r%lld_dr%lld_hb%d_pt%d_hs%d_ns%d_bs%d_t%d_%s", H,
             R, DR, hb, pt, hs, ns, bs, c->T, tag);
    int ka = cg_kernel(c, aname, &is_new);
    if (ka < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "mla_attention %%%s: no memory", who);
    if (is_new) {
        cg_buf_printf(&c->src,
                      "// mla_attention: attention over the compressed cache, one block per token "
                      "and head group (codegen/mla_attention.c, cg_emit_mla_attention)\n"
                      "extern \"C\" __global__ void __launch_bounds__(%d) %s(const %s *__restrict__ "
                      "q_c, const %s *__restrict__ q_pe, const int *__restrict__ pos, const int "
                      "*__restrict__ slots, const int *__restrict__ block_table, int max_blocks, const "
                      "%s *__restrict__ kvpool, const %s *__restrict__ pepool, %s *__restrict__ out, "
                      "float scale, int window%s)\n{\n"
                      "    typedef %s TQ;\n    typedef %s TS;\n    typedef %s TO;\n"
                      "    constexpr int H = %lld, R = %lld, DR = %lld, HB = %d, PT = %d, HS = %d, "
                      "CS = %d, VE = %d, QLD = %lld, LDK = %lld, BS = %d, NT = %d, NSPLIT = %d;\n",
                      MLA_THREADS, aname, cg_ctype(qdt), cg_ctype(pdt), ts, ts, cg_ctype(odt),
                      ns > 1 ? ", float *__restrict__ part_ml, float *__restrict__ part_o" : "",
                      cg_ctype(qdt), ts, cg_ctype(odt), H, R, DR, hb, pt, hs, cs, ve, qld, ldk, bs,
                      MLA_THREADS, ns);
        if (ns == 1)
            cg_buf_printf(&c->src, "    float *part_ml = nullptr, *part_o = nullptr;\n"
                                   "    (void)part_ml;\n    (void)part_o;\n");
        cg_buf_printf(&c->src, "%s}\n\n", ATTN_BODY);
    }
    s = cg_step(c, RT_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "mla_attention %%%s: no memory", who);
    s->kernel = ka;
    s->grid[0] = (unsigned)c->T;
    s->grid[1] = (unsigned)(H / hb);
    s->grid[2] = (unsigned)ns;
    s->block[0] = MLA_THREADS;
    s->n_args = ns > 1 ? 13 : 11;
    s->args[0] = cg_arg_act(qc);
    s->args[1] = cg_arg_act(qpe);
    s->args[2] = cg_arg_input(RT_INPUT_POSITIONS);
    s->args[3] = cg_arg_input(RT_INPUT_SLOTS);
    s->args[4] = cg_arg_input(RT_INPUT_BLOCK_TABLE);
    s->args[5] = cg_arg_config(RT_CONFIG_MAX_BLOCKS);
    s->args[6] = cg_arg_kv(op, 0);
    s->args[7] = cg_arg_kv(op, 1);
    s->args[8] = cg_arg_act(op->out[0]);
    s->args[9] = cg_arg_f32(ir_op_attr_float(op, "scale", 1.0));
    s->args[10] = cg_arg_i32(ir_op_attr_int(op, "window", 0));
    if (ns == 1)
        return MOEC_OK;

    /* the splits' partial results, merged by a third kernel */
    size_t off_ml = cg_scratch(c, (size_t)c->T * (size_t)H * (size_t)ns * 2 * 4);
    size_t off_o = cg_scratch(c, (size_t)c->T * (size_t)H * (size_t)ns * (size_t)R * 4);
    s->args[11] = cg_arg_scratch(off_ml);
    s->args[12] = cg_arg_scratch(off_o);
    char cname[256];
    snprintf(cname, sizeof cname, "mla_combine_h%lld_r%lld_ns%d_bs%d_t%d_%s", H, R, ns, bs, c->T,
             ir_dtype_name(odt));
    int kc = cg_kernel(c, cname, &is_new);
    if (kc < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "mla_attention %%%s: no memory", who);
    if (is_new) {
        cg_buf_printf(&c->src,
                      "// mla_attention: merge of the sequence splits (codegen/mla_attention.c, "
                      "cg_emit_mla_attention)\n"
                      "extern \"C\" __global__ void __launch_bounds__(128) %s(const int *__restrict__ "
                      "pos, const int *__restrict__ slots, int max_blocks, const float *__restrict__ "
                      "part_ml, const float *__restrict__ part_o, %s *__restrict__ out)\n{\n"
                      "    typedef %s TO;\n"
                      "    constexpr int H = %lld, D = %lld, BS = %d, NSPLIT = %d;\n",
                      cname, cg_ctype(odt), cg_ctype(odt), H, R, bs, ns);
        cg_buf_printf(&c->src, "%s}\n\n", COMBINE_BODY);
    }
    s = cg_step(c, RT_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "mla_attention %%%s: no memory", who);
    s->kernel = kc;
    s->grid[0] = (unsigned)c->T;
    s->grid[1] = (unsigned)H;
    s->block[0] = 128;
    s->n_args = 6;
    s->args[0] = cg_arg_input(RT_INPUT_POSITIONS);
    s->args[1] = cg_arg_input(RT_INPUT_SLOTS);
    s->args[2] = cg_arg_config(RT_CONFIG_MAX_BLOCKS);
    s->args[3] = cg_arg_scratch(off_ml);
    s->args[4] = cg_arg_scratch(off_o);
    s->args[5] = cg_arg_act(op->out[0]);
    return MOEC_OK;
}
