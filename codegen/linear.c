/* linear.c — a dense linear y[T, N] = alpha * x[T, K] w[N, K]^T (+ b).
 *
 * Buckets of up to GEMV_MAX_T tokens get a generated kernel: the step
 * streams the weight once, and for a handful of rows cuBLASLt's GEMM
 * kernels read it well below the copy bandwidth (H100, 2026-11-22: the 135
 * decode GEMMs of a DeepSeek-V2-Lite step at batch 1 took 1.7 ms for 1.6
 * GB; at 8 rows cuBLASLt stays ahead). A block owns a few weight rows, its
 * warps split K with 16-byte loads, fp32 accumulation; the epilogue
 * applies alpha and the bias. fp8 weights in fragment tiles
 * (ir_weight_tiled, the default's IR_FP8_TILES_LINEAR) take its tile form
 * instead (GEMV_TL_BODY: a block a 16-row tile). With act silu_mul (pass
 * fuse_silu_mul_linear) x is [T, 2K], gate then up: the kernel computes
 * silu(gate) * up while it loads x, rounded as the silu_mul result was
 * stored; a GEMM bucket runs the silu_mul kernel into scratch first.
 *
 * bf16 weights of up to MMA_BF16_MAX_T tokens run a tensor-core kernel
 * (emit_mma; x the 8-column operand of m16n8k16 products, K split over
 * the block's warps and, on sm_90, a cluster's blocks): cuBLASLt read
 * V2-Lite's and Qwen3-30B's 8-token linears at 1.4 to 2.4 TB/s. Past it,
 * up to MOEC_LINEAR_TC_MAX_T tokens (default none: TC_BF16_MAX_T), they
 * run the staged kernel fp8 weights run (codegen/fp8_tc.c): a block copies
 * its tokens' x (or computes h of act silu_mul) into shared memory once.
 *
 * Larger buckets are one cuBLASLt step. cuBLASLt is column-major: row-major
 * y is C (m = N, n = T, ldc = N); row-major w [N, K] is a K x N column-major
 * matrix, transposed (lda = K); row-major x [T, K] is K x T (ldb = K).
 * MOEC_GEMV_MAX_T (0 to 16) moves the boundary, for comparisons. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "codegen/cg.h"
#include "codegen/fp8_tc.h"
#include "codegen/moe_routed.h"
#include "err.h"

/* A numeric attribute whether written as an int or a float. */
static double num_attr(const ir_op *op, const char *key, double dflt)
{
    const ir_attr *a = ir_op_attr(op, key);
    if (a && a->kind == IR_ATTR_FLOAT)
        return a->f;
    return a && a->kind == IR_ATTR_INT ? (double)a->i : dflt;
}

#define GEMV_MAX_T 4
#define GEMV_WARPS 8

/* Each block owns RB weight rows; its NW warps split K (warp w takes the
 * 32 * VE wide chunks w, w + NW, ...), each lane's 16-byte loads of the RB
 * rows in flight together; the warps' partial sums meet in shared memory.
 * RB follows N so that even the router's 64 rows make 64 blocks. */
static const char GEMV_BODY[] =
    "    constexpr int KSTEP = 32 * VE, NSTEP = (K + KSTEP - 1) / KSTEP;\n"
    "    __shared__ float part[NW][RB * T];\n"
    "    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n"
    "    const long long n0 = (long long)blockIdx.x * RB;\n"
    "    float acc[RB][T];\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < RB; r++)\n"
    "#pragma unroll\n"
    "        for (int t = 0; t < T; t++)\n"
    "            acc[r][t] = 0.0f;\n"
    "    const TW *wr = w + n0 * K;\n"
    "#pragma unroll 2\n"
    "    for (int s = warp; s < NSTEP; s += NW) {\n"
    "        const int k = s * KSTEP + lane * VE;\n"
    "        if (K % KSTEP != 0 && k >= K)\n"
    "            break;\n"
    "        float wv[RB][VE];\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < RB; r++)\n"
    "            if (N % RB == 0 || n0 + r < N) {\n"
    "                ldv<VE>(wr + (long long)r * K + k, wv[r]);\n"
    "                if constexpr (W8) {\n"
    "                    /* the code times its block's scale, as the interpreter dequantizes */\n"
    "                    const float sc = ws[(n0 + r) / SBN * SC + k / SBK];\n"
    "#pragma unroll\n"
    "                    for (int j = 0; j < VE; j++)\n"
    "                        wv[r][j] *= sc;\n"
    "                }\n"
    "            }\n"
    "#pragma unroll\n"
    "        for (int t = 0; t < T; t++) {\n"
    "            float xv[VE];\n"
    "            if constexpr (ACT) /* silu(gate) * up, rounded as the silu_mul result was stored */\n"
    "                ldv_silu_mul<VE, TH>(x + (long long)t * 2 * K + k,\n"
    "                                     x + (long long)t * 2 * K + K + k, xv);\n"
    "            else\n"
    "                ldv<VE>(x + (long long)t * K + k, xv);\n"
    "#pragma unroll\n"
    "            for (int r = 0; r < RB; r++)\n"
    "                if (N % RB == 0 || n0 + r < N)\n"
    "#pragma unroll\n"
    "                    for (int j = 0; j < VE; j++)\n"
    "                        acc[r][t] += wv[r][j] * xv[j];\n"
    "        }\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < RB; r++)\n"
    "#pragma unroll\n"
    "        for (int t = 0; t < T; t++) {\n"
    "            const float v = warp_sum(acc[r][t]);\n"
    "            if (lane == 0)\n"
    "                part[warp][r * T + t] = v;\n"
    "        }\n"
    "    __syncthreads();\n"
    "    for (int i = threadIdx.x; i < RB * T; i += NW * 32) {\n"
    "        const int r = i / T, t = i % T;\n"
    "        if (N % RB != 0 && n0 + r >= N)\n"
    "            continue;\n"
    "        float v = 0.0f;\n"
    "#pragma unroll\n"
    "        for (int q = 0; q < NW; q++)\n"
    "            v += part[q][i];\n"
    "        v *= alpha;\n"
    "        if constexpr (HAS_BIAS)\n"
    "            v += ld(bias + n0 + r);\n"
    "        st(y + (long long)t * N + n0 + r, v);\n"
    "    }\n";

/* Before the wait (cg_emit_prefetch): the block's RB rows (fewer in the
 * last block) and, of an fp8 weight, their block scales' rows. */
static const char GEMV_PREFETCH[] =
    "        const long long r0 = (long long)blockIdx.x * RB, nr = N - r0 < RB ? N - r0 : RB;\n"
    "        moec_prefetch_rows(w + r0 * K, nr, (long long)K * (long long)sizeof(TW), PF_CAP);\n"
    "        if constexpr (W8)\n"
    "            moec_prefetch_l2(ws + r0 / SBN * SC,\n"
    "                             (unsigned long long)((r0 + nr - 1) / SBN - r0 / SBN + 1) * SC * 4ull);\n";

/* Rows per block: enough blocks to fill the GPU twice over (264 on an
 * H100's 132 SMs), at most 8 rows (4 of fp8, whose 16-byte loads hold 16
 * elements: the same registers), and at most 32 accumulators a lane (rows
 * times the T tokens). */
static int gemv_rows_per_block(int64_t N, int fp8, int T)
{
    int rb = 1;
    while (rb < (fp8 ? 4 : 8) && 2 * rb * T <= 32 && N / (2 * rb) >= 264)
        rb *= 2;
    return rb;
}

/* An fp8 weight's vector width: the widest of 16 to 1 elements that
 * divides both K and the scale block's columns (so that a vector lies in
 * one block), at most max. */
static int fp8_vec_width(int64_t K, int64_t bk, int max)
{
    int ve = max;
    while (ve > 1 && (K % ve || bk % ve))
        ve /= 2;
    return ve;
}

/* The kernel-name suffix and the constants of weight w's block scales
 * and layout (TL: in fragment tiles, ir_weight_tiled; the tag then ends in
 * "_tl"): "" and W8 and TL false for a weight not kept in fp8. */
static void scale_consts(const cg_ctx *c, const ir_value *w, char *tag, size_t tcap,
                         char *decl, size_t dcap)
{
    if (cg_storage(c, w) != IR_DTYPE_F8E4M3) {
        snprintf(tag, tcap, "%s", "");
        snprintf(decl, dcap,
                 "    constexpr bool W8 = false, TL = false;\n"
                 "    constexpr long long SBN = 1, SBK = 1, SC = 1;\n"
                 "    const float *ws = nullptr;\n"
                 "    (void)ws;\n");
        return;
    }
    const int64_t *b = w->scale.block;
    int tl = cg_weight_tl(c, w);
    snprintf(tag, tcap, "_s%lldx%lld%s", (long long)b[0], (long long)b[1], tl ? "_tl" : "");
    snprintf(decl, dcap,
             "    constexpr bool W8 = true, TL = %s;\n"
             "    constexpr long long SBN = %lldLL, SBK = %lldLL, SC = %lldLL;\n",
             tl ? "true" : "false", (long long)b[0], (long long)b[1],
             (long long)((w->type.dims[1] + b[1] - 1) / b[1]));
}

/* The end of a linear kernel's name: the dtypes of x and y, the bias's
 * (after "_b"), and the weight's scale blocks (scale_consts's tag). */
static void io_suffix(const cg_ctx *c, const ir_op *op, const char *tag, char *buf, size_t cap)
{
    const ir_value *bias = op->n_in > 2 ? op->in[2] : NULL;
    snprintf(buf, cap, "%s_%s%s%s%s", ir_dtype_name(cg_storage(c, op->in[0])),
             ir_dtype_name(cg_storage(c, op->out[0])), bias ? "_b" : "",
             bias ? ir_dtype_name(cg_storage(c, bias)) : "", tag);
}

/* The few-token kernel over fp8 weights in fragment tiles (TL,
 * ir_weight_tiled), as the experts' tile-streaming form reads theirs
 * (codegen/moe_routed.c, GT_BODY): a block takes one 16-row tile (of S
 * blocks a tile, a cluster on sm_90, split S of its 64-wide chunks), each
 * of its NW warps a contiguous share of the block's chunks; lane (g, q) loads
 * the 16 codes of rows g and g + 8 at k 16q of a chunk (a warp 512
 * contiguous bytes a load), U chunks before their products, which it
 * takes with the T tokens' x there (h of act computed as it is read, as
 * GEMV_BODY does) and adds times the chunk's block scale (ir_weight_tiled
 * holds the scale blocks to whole tiles and chunks). The lanes of a quad
 * add up their k, the warps theirs in shared memory, and one thread a row
 * and token ends as GEMV_BODY does, adding the S blocks' sums of the
 * cluster from their shared memory (each block a share of the rows and
 * tokens). */
static const char GEMV_TL_BODY[] =
    "    constexpr int CH = K / 64;\n"
    "    /* the warps' sums: in dynamic shared memory, which the cluster's blocks read */\n"
    "    extern __shared__ __align__(16) unsigned char moec_smem[];\n"
    "    float(*red)[2][T][8] = reinterpret_cast<float(*)[2][T][8]>(moec_smem);\n"
    "    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;\n"
    "    const int split = (int)(blockIdx.x % S);\n"
    "    const long long n0 = (long long)(blockIdx.x / S) * 16;\n"
    "    const int s0 = split * CH / S, sn = (split + 1) * CH / S - s0;\n"
    "    const int c0 = s0 + warp * sn / NW, c1 = s0 + (warp + 1) * sn / NW;\n"
    "    const TW *wt = w + n0 * K + lane * 16;\n"
    "    const float *sr = ws + n0 / SBN * SC;\n"
    "    float a[2][T];\n"
    "#pragma unroll\n"
    "    for (int h = 0; h < 2; h++)\n"
    "#pragma unroll\n"
    "        for (int t = 0; t < T; t++)\n"
    "            a[h][t] = 0.0f;\n"
    "#pragma unroll 1\n"
    "    for (int cb = c0; cb < c1; cb += U) {\n"
    "        uint4 wv[U][2];\n"
    "        float sv[U];\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < U; u++) {\n"
    "            const int c = cb + u;\n"
    "#pragma unroll\n"
    "            for (int h = 0; h < 2; h++)\n"
    "                wv[u][h] = c < c1 ? moec_ldg16(wt + (long long)c * 1024 + h * 512)\n"
    "                                  : make_uint4(0u, 0u, 0u, 0u);\n"
    "            sv[u] = c < c1 ? sr[(long long)c * 64 / SBK] : 0.0f;\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < U; u++) {\n"
    "            if (cb + u >= c1)\n"
    "                continue;\n"
    "            const int k = (cb + u) * 64 + q * 16;\n"
    "            float wf[2][16];\n"
    "#pragma unroll\n"
    "            for (int h = 0; h < 2; h++)\n"
    "                moec_w16v<CVT8>(wv[u][h], wf[h], (const TW *)nullptr);\n"
    "#pragma unroll\n"
    "            for (int t = 0; t < T; t++) {\n"
    "                float xv[16];\n"
    "                if constexpr (ACT) /* h of x's gate and up halves, as GEMV_BODY */\n"
    "                    ldv_silu_mul<16, TH>(x + (long long)t * 2 * K + k,\n"
    "                                         x + (long long)t * 2 * K + K + k, xv);\n"
    "                else\n"
    "                    ldv<16>(x + (long long)t * K + k, xv);\n"
    "#pragma unroll\n"
    "                for (int h = 0; h < 2; h++) {\n"
    "                    float p = 0.0f;\n"
    "#pragma unroll\n"
    "                    for (int j = 0; j < 16; j++)\n"
    "                        p = fmaf(wf[h][j], xv[j], p);\n"
    "                    a[h][t] = fmaf(sv[u], p, a[h][t]);\n"
    "                }\n"
    "            }\n"
    "        }\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int h = 0; h < 2; h++)\n"
    "#pragma unroll\n"
    "        for (int t = 0; t < T; t++) {\n"
    "            float v = a[h][t];\n"
    "            v += __shfl_xor_sync(0xffffffffu, v, 1);\n"
    "            v += __shfl_xor_sync(0xffffffffu, v, 2);\n"
    "            if (q == 0)\n"
    "                red[warp][h][t][g] = v;\n"
    "        }\n"
    "    __syncthreads();\n"
    "    if constexpr (S > 1)\n"
    "        moec_cluster_sync();\n"
    "    for (int i = split * NW * 32 + threadIdx.x; i < 16 * T; i += S * NW * 32) {\n"
    "        const int r = i & 15, t = i >> 4;\n"
    "        float v = 0.0f;\n"
    "#pragma unroll\n"
    "        for (int k = 0; k < S; k++)\n"
    "#pragma unroll\n"
    "            for (int wq = 0; wq < NW; wq++)\n"
    "                v += S > 1 ? moec_ld_cluster(&red[wq][r >> 3][t][r & 7], (unsigned)k)\n"
    "                           : red[wq][r >> 3][t][r & 7];\n"
    "        v *= alpha;\n"
    "        if constexpr (HAS_BIAS)\n"
    "            v += ld(bias + n0 + r);\n"
    "        st(y + (long long)t * N + n0 + r, v);\n"
    "    }\n"
    "    if constexpr (S > 1)\n"
    "        moec_cluster_sync(); /* no block leaves while the others read it */\n";

/* Before the wait (cg_emit_prefetch): the tile form's share of its tile
 * (its split's chunks, up to PF_CAP bytes from the first) and the tile's
 * row of block scales. */
static const char GEMV_TL_PREFETCH[] =
    "        const long long t0 = (long long)(blockIdx.x / S) * 16, sp = blockIdx.x % S;\n"
    "        const long long b0 = sp * (K / 64) / S * 1024, b1 = (sp + 1) * (K / 64) / S * 1024;\n"
    "        moec_prefetch_rows(w + t0 * K + b0, 1, b1 - b0, PF_CAP);\n"
    "        moec_prefetch_l2(ws + t0 / SBN * SC, (unsigned long long)SC * 4ull);\n";

/* The tile form's warps a block and chunks in flight a warp
 * (MOEC_GEMV_TL_WARPS, MOEC_GEMV_TL_U), and its blocks a tile (sm_90: a
 * cluster; MOEC_GEMV_TL_S): the fewest that make GEMV_TL_BLOCKS blocks, at
 * most GEMV_TL_S_MAX, each block at least a chunk a warp (V2-Lite's
 * 2048-row weights: 2). (H200, 2026-11-30, fp8 V2-Lite, the linears in
 * tiles, ms a step at 1 / 2 / 4 tokens: 8 warps of 2 chunks, 2 blocks a
 * tile of 2048 rows, 1.477 / 1.855 / 2.588; one block 1.495 / 1.869 /
 * 2.593, four 1.591 / 2.222 / 3.158; 1 chunk 1.506 / 1.855 / 2.625; one
 * block a tile: 4 chunks 1.495 / 1.901 / 2.783, 8 chunks 1.522 / 1.981 /
 * 2.804, 16 warps 1.481 / 1.968 / 2.832, 4 warps 1.622 / 1.992 / 2.704;
 * the rows' kernel, GEMV_BODY, 1.438 / 1.986 / 2.966. In the kernel
 * timeline at one token, one block a tile and 4 chunks, o_proj took 5.25
 * us against 4.39 in rows, the shared down 8.42 against 7.40; the q/kv
 * projection 5.42 against 5.61 and the shared gate_up 8.46 against 8.98.)
 * Measured and taken out: each warp's first chunks loaded before the
 * programmatic wait (the experts' down does so), 1.472 / 1.843 / 2.770
 * against 1.474 / 1.848 / 2.584 (history at bd0346f, MOEC_GEMV_TL_PRE).
 * Also more splits where K is long, until a split takes at most C chunks
 * (MOEC_GEMV_TL_KCH; V2-Lite's dense down, 171 chunks a row, at 4 splits
 * for C = 48 instead of 2): 10.51 us against 10.64 in the kernel
 * timeline at one token, the step 1.397 / 1.801 / 2.549 ms at 1 / 2 / 4
 * tokens against 1.396 / 1.797 / 2.549; C = 24 (every 2048-wide K split
 * too) 1.418 / 1.981 / 2.758 (H200, 2026-12-01; history at 7b75d82). */
#define GEMV_TL_WARPS 8
#define GEMV_TL_U 2
#define GEMV_TL_BLOCKS 198
#define GEMV_TL_S_MAX 8

/* the tile form's splits of a weight of N rows and K columns */
static int gemv_tl_splits(const cg_ctx *c, int64_t N, int64_t K, int nw)
{
    if (cg_arch_num(c->opt) < 90)
        return 1;
    int want = cg_env_int("MOEC_GEMV_TL_S", 0, 0, GEMV_TL_S_MAX);
    int s = 1;
    while (!want && s < GEMV_TL_S_MAX && N / 16 * s < GEMV_TL_BLOCKS && K / 64 / (s + 1) >= nw)
        s++;
    return want ? (want > K / 64 ? (int)(K / 64) : want) : s;
}

/* Rows t0 .. t0 + tg - 1 of y = alpha x w^T (+ bias) by the generated
 * kernel (dtypes checked): GEMV_BODY, or over fp8 weights in fragment
 * tiles GEMV_TL_BODY. */
static moec_status emit_gemv(cg_ctx *c, const ir_op *op, int64_t N, int64_t K, double alpha,
                             int t0, int tg)
{
    const ir_value *x = op->in[0], *w = op->in[1], *y = op->out[0];
    const ir_value *bias = op->n_in > 2 ? op->in[2] : NULL;
    ir_dtype dw = cg_storage(c, w), dx = cg_storage(c, x), dy = cg_storage(c, y);
    ir_dtype db = bias ? cg_storage(c, bias) : IR_DTYPE_F32;
    /* act silu_mul: rows of 2K, h rounded to the compute dtype's storage */
    int act = ir_op_attr(op, "act") != NULL;
    ir_dtype dh = c->opt->compute_dtype;
    int fp8 = dw == IR_DTYPE_F8E4M3, tl = fp8 && cg_weight_tl(c, w);
    int ve = fp8 ? fp8_vec_width(K, w->scale.block[1], 16) : cg_vec_width(K);
    int rb = tl ? 16 : gemv_rows_per_block(N, fp8, tg);
    int nw = tl ? cg_env_int("MOEC_GEMV_TL_WARPS", GEMV_TL_WARPS, 1, 16) : GEMV_WARPS;
    int u = cg_env_int("MOEC_GEMV_TL_U", GEMV_TL_U, 1, 8);
    int sp = tl ? gemv_tl_splits(c, N, K, nw) : 1;
    char name[300], tag[40], decl[400], io[80], silu[32] = "", form[32] = "", cluster[48] = "";
    scale_consts(c, w, tag, sizeof tag, decl, sizeof decl);
    io_suffix(c, op, tag, io, sizeof io);
    if (act)
        snprintf(silu, sizeof silu, "_silu_%s", ir_dtype_name(dh));
    if (tl)
        snprintf(form, sizeof form, "_w%d_u%d_s%d", nw, u, sp);
    if (sp > 1)
        snprintf(cluster, sizeof cluster, "__cluster_dims__(%d, 1, 1) ", sp);
    snprintf(name, sizeof name, "linear_gemv_n%lld_k%lld_rb%d%s_t%d%s_%s_%s", (long long)N,
             (long long)K, rb, form, tg, silu, ir_dtype_name(dw), io);
    int is_new = 0;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "linear %%%s: out of memory", y->name);
    if (is_new) {
        moec_buf_printf(&c->src,
                      "// linear: y = alpha x w^T (+ b) for a few rows (codegen/linear.c, "
                      "emit_gemv)\n"
                      "extern \"C\" __global__ void %s__launch_bounds__(%d) %s(const %s "
                      "*__restrict__ x, const %s *__restrict__ w, %sconst %s *__restrict__ bias, "
                      "float alpha, %s *__restrict__ y)\n{\n"
                      "    typedef %s TW;\n"
                      "    typedef %s TH;\n"
                      "    constexpr long long N = %lldLL;\n"
                      "    constexpr int K = %lld, T = %d, VE = %d, RB = %d, NW = %d, U = %d, "
                      "S = %d;\n"
                      "    constexpr bool HAS_BIAS = %s, ACT = %s, CVT8 = %s;\n%s",
                      cluster, nw * 32, name, cg_ctype(dx), cg_ctype(dw),
                      fp8 ? "const float *__restrict__ ws, " : "", cg_ctype(db), cg_ctype(dy),
                      cg_ctype(dw), cg_ctype(dh), (long long)N, (long long)K, tg, ve, rb, nw, u, sp,
                      bias ? "true" : "false", act ? "true" : "false",
                      cg_arch_num(c->opt) >= 89 ? "true" : "false", decl);
        cg_emit_prefetch(&c->src, cg_prefetch_bytes(c), tl ? GEMV_TL_PREFETCH : GEMV_PREFETCH);
        moec_buf_printf(&c->src, "%s}\n\n", tl ? GEMV_TL_BODY : GEMV_BODY);
    }
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "linear %%%s: out of memory", y->name);
    s->kernel = k;
    s->grid[0] = (unsigned)((N + rb - 1) / rb * sp);
    s->block[0] = (unsigned)nw * 32;
    /* (MOEC_SIDE_PAD_FIRST=1: only the GEMV that reads the fork's value,
       beside the top-k, for A/B runs) */
    int first = x->kind == IR_VALUE_OP && x->def && x->def->kind == IR_OP_FORK;
    s->smem = s->stream == 1 && (first || !cg_env_int("MOEC_SIDE_PAD_FIRST", 0, 0, 1))
                  ? cg_side_smem_pad(c, dw)
                  : 0;
    if (tl && s->smem < (unsigned)(nw * 2 * tg * 8 * 4))
        s->smem = (unsigned)(nw * 2 * tg * 8 * 4); /* GEMV_TL_BODY's red */
    int n = 0;
    s->args[n] = cg_arg_act(x);
    s->args[n++].i = (int64_t)t0 * (act ? 2 : 1) * K * (int64_t)ir_dtype_size(dx);
    s->args[n++] = cg_arg_act(w);
    if (fp8)
        s->args[n++] = cg_arg_scales(w);
    s->args[n++] = bias ? cg_arg_act(bias) : cg_arg_act(w); /* unread without a bias */
    s->args[n++] = cg_arg_f32(alpha);
    s->args[n] = cg_arg_act(y);
    s->args[n++].i = (int64_t)t0 * N * (int64_t)ir_dtype_size(dy);
    s->n_args = n;
    return MOEC_OK;
}

/* The weight on tensor cores (bf16 x; bf16 w, or fp8 w whose e4m3 codes
 * widen to bf16 in registers, exactly): a block owns RT tiles of 16 weight
 * rows; its NW warps, and those of the other KS - 1 blocks of its cluster
 * (which share its rows), split K in 32-wide chunks (chunk s to warp
 * s % (NW KS) of them), each chunk two m16n8k16 products per tile and 8
 * tokens: the weight as the A operand, x as B (its fragments loaded once
 * for the RT tiles), in the lane permutation of the MoE kernels
 * (codegen/moe_routed.c: a lane's 8 elements of a row stand for the k
 * columns its fragments need, alike on both operands). An fp8 chunk's
 * products start from zero and are added times the chunk's block scale (a
 * tile's 16 rows share a row block, the 32 columns a column block); bf16
 * ones go straight into the sums. With ACT (bf16 only) x is [T, 2K] and
 * each fragment h = silu(gate) * up, rounded to bf16 as the silu_mul
 * kernel stores it. The warps' sums meet in shared memory, the blocks' in
 * the cluster's (distributed shared memory), each in a fixed order.
 * MMA_PRE, where emitted, loads the warp's first U chunks of weights
 * before the programmatic wait (they do not depend on the kernel before). */
static const char MMA_HEAD[] =
    "    constexpr int NSTEP = K / 32, E = RT * NT * 4 * 32;\n"
    "    /* the warps' partial sums; with KS splits also the block's, which the\n"
    "       cluster reads: then in the dynamic shared memory */\n"
    "    __shared__ float part_st[KS > 1 ? 1 : NW * E];\n"
    "    extern __shared__ __align__(16) unsigned char moec_smem[];\n"
    "    float *const part = KS > 1 ? reinterpret_cast<float *>(moec_smem) : part_st;\n"
    "    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;\n"
    "    /* the cluster's KS blocks split K: global warp gw of GW takes chunks gw, gw + GW, ... */\n"
    "    constexpr int GW = NW * KS;\n"
    "    const int split = blockIdx.x % KS, gw = split * NW + warp;\n"
    "    const long long n0 = (long long)(blockIdx.x / KS) * 16 * RT;\n"
    "    const TW *w0[RT], *w1[RT];\n"
    "    [[maybe_unused]] const float *sr[RT];\n"
    "#pragma unroll\n"
    "    for (int rt = 0; rt < RT; rt++) {\n"
    "        /* rows past N read row N - 1 and are never stored */\n"
    "        const long long a = n0 + 16 * rt + g, b = a + 8;\n"
    "        w0[rt] = w + (a < N ? a : N - 1) * K + q * 8;\n"
    "        w1[rt] = w + (b < N ? b : N - 1) * K + q * 8;\n"
    "        if constexpr (W8)\n"
    "            sr[rt] = ws + (n0 + 16 * rt < N ? n0 + 16 * rt : N - 1) / SBN * SC;\n"
    "    }\n"
    "    uint4 wa[U][RT][2];\n"
    "    [[maybe_unused]] float sc[U][RT];\n"
    "    /* the U chunks from s0 (every GW-th) of the block's weight rows */\n"
    "    auto load_w = [&](int s0) {\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < U; u++) {\n"
    "            if (s0 + u * GW >= NSTEP)\n"
    "                break;\n"
    "            const long long k = (long long)(s0 + u * GW) * 32;\n"
    "#pragma unroll\n"
    "            for (int rt = 0; rt < RT; rt++) {\n"
    "                wa[u][rt][0] = moec_ld8(w0[rt] + k);\n"
    "                wa[u][rt][1] = moec_ld8(w1[rt] + k);\n"
    "                if constexpr (W8)\n"
    "                    sc[u][rt] = sr[rt][k / SBK];\n"
    "            }\n"
    "        }\n"
    "    };\n";
static const char MMA_PRE[] = "    load_w(gw);\n    moec_pdl_enter();\n";
static const char MMA_BODY[] =
    "    const TX *xr[NT];\n"
    "#pragma unroll\n"
    "    for (int t = 0; t < NT; t++) {\n"
    "        const int tok = t * 8 + g < T ? t * 8 + g : T - 1;\n"
    "        xr[t] = x + (long long)tok * (ACT ? 2 : 1) * K + q * 8;\n"
    "    }\n"
    "    float acc[RT][NT][4];\n"
    "#pragma unroll\n"
    "    for (int rt = 0; rt < RT; rt++)\n"
    "#pragma unroll\n"
    "        for (int t = 0; t < NT; t++)\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < 4; i++)\n"
    "                acc[rt][t][i] = 0.0f;\n"
    "#pragma unroll 1\n"
    "    for (int s0 = gw; s0 < NSTEP; s0 += GW * U) {\n"
    "        if (!PRE || s0 != gw)\n"
    "            load_w(s0);\n"
    "        uint4 xb[U][NT];\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < U; u++) {\n"
    "            if (s0 + u * GW >= NSTEP)\n"
    "                break;\n"
    "            const long long k = (long long)(s0 + u * GW) * 32;\n"
    "#pragma unroll\n"
    "            for (int t = 0; t < NT; t++) {\n"
    "                if constexpr (ACT) {\n"
    "                    /* silu(gate) * up, rounded to bf16 as the silu_mul result is stored */\n"
    "                    xb[u][t] = moec_silu_mul8(*reinterpret_cast<const uint4 *>(xr[t] + k),\n"
    "                                              *reinterpret_cast<const uint4 *>(xr[t] + K + k));\n"
    "                } else {\n"
    "                    xb[u][t] = *reinterpret_cast<const uint4 *>(xr[t] + k);\n"
    "                }\n"
    "            }\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < U; u++) {\n"
    "            if (s0 + u * GW >= NSTEP)\n"
    "                break;\n"
    "#pragma unroll\n"
    "            for (int rt = 0; rt < RT; rt++)\n"
    "#pragma unroll\n"
    "                for (int t = 0; t < NT; t++) {\n"
    "                    const uint4 a0 = wa[u][rt][0], a1 = wa[u][rt][1], bx = xb[u][t];\n"
    "                    if constexpr (W8) {\n"
    "                        float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};\n"
    "                        moec_mma_bf16(p, a0.x, a1.x, a0.y, a1.y, bx.x, bx.y);\n"
    "                        moec_mma_bf16(p, a0.z, a1.z, a0.w, a1.w, bx.z, bx.w);\n"
    "#pragma unroll\n"
    "                        for (int i = 0; i < 4; i++)\n"
    "                            acc[rt][t][i] += sc[u][rt] * p[i];\n"
    "                    } else {\n"
    "                        moec_mma_bf16(acc[rt][t], a0.x, a1.x, a0.y, a1.y, bx.x, bx.y);\n"
    "                        moec_mma_bf16(acc[rt][t], a0.z, a1.z, a0.w, a1.w, bx.z, bx.w);\n"
    "                    }\n"
    "                }\n"
    "        }\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int rt = 0; rt < RT; rt++)\n"
    "#pragma unroll\n"
    "        for (int t = 0; t < NT; t++)\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < 4; i++)\n"
    "                part[warp * E + ((rt * NT + t) * 4 + i) * 32 + lane] = acc[rt][t][i];\n"
    "    __syncthreads();\n"
    "    /* acc[rt][t][i] of lane (g, q): row 16 rt + g + 8 (i / 2), token t * 8 + 2q + i % 2 */\n"
    "    auto put = [&](int idx, float v) {\n"
    "        const int ti = idx / 32, l = idx % 32, rt = ti / (NT * 4), t = ti / 4 % NT, i = ti % 4;\n"
    "        const long long row = n0 + 16 * rt + (l >> 2) + 8 * (i / 2);\n"
    "        const int tok = t * 8 + 2 * (l & 3) + i % 2;\n"
    "        if (row >= N || tok >= T)\n"
    "            return;\n"
    "        v *= alpha;\n"
    "        if constexpr (HAS_BIAS)\n"
    "            v += ld(bias + row);\n"
    "        st(y + (long long)tok * N + row, v);\n"
    "    };\n"
    "    /* the block's warps' sums, in warp order; with KS splits, each block's\n"
    "       in its shared memory, and each block adds up a share of them in\n"
    "       split order */\n"
    "    float *const red = part + NW * E;\n"
    "    for (int idx = threadIdx.x; idx < E; idx += NW * 32) {\n"
    "        float v = 0.0f;\n"
    "#pragma unroll\n"
    "        for (int w2 = 0; w2 < NW; w2++)\n"
    "            v += part[w2 * E + idx];\n"
    "        if constexpr (KS == 1)\n"
    "            put(idx, v);\n"
    "        else\n"
    "            red[idx] = v;\n"
    "    }\n"
    "    if constexpr (KS > 1) {\n"
    "        moec_cluster_sync();\n"
    "        __syncthreads(); /* the cluster barrier orders this block's part too; said\n"
    "                            again for tools that know only the block barrier */\n"
    "        for (int idx = split * NW * 32 + threadIdx.x; idx < E; idx += KS * NW * 32) {\n"
    "            float v = 0.0f;\n"
    "#pragma unroll\n"
    "            for (int k = 0; k < KS; k++)\n"
    "                v += moec_ld_cluster(red + idx, (unsigned)k);\n"
    "            put(idx, v);\n"
    "        }\n"
    "        moec_cluster_sync(); /* no block leaves while the others read it */\n"
    "    }\n";

/* The fp8 form's warps a block. */
#define MMA_WARPS 4
/* The bf16 form's (MOEC_LINEAR_MMA_WARPS): more warps split K, so that
 * each holds its share's loads in flight at once; and the most tokens it
 * takes instead of cuBLASLt (MOEC_LINEAR_MMA_MAX_T, up to 64; 0: cuBLASLt
 * past the few-token kernel). (H200, 2026-11-29, whole steps at context
 * 1024 against cuBLASLt in the same call: V2-Lite at 8 tokens 5.338 /
 * 5.429 ms and 5.365 / 5.410, Qwen3-30B 7.911 / 8.126 and 7.907 / 8.037;
 * but at 16 tokens V2-Lite 8.026 / 7.561, and with it up to 64, 10.664 /
 * 9.607 at 32 and 13.080 / 10.577 at 64: 8.) */
#define MMA_BF16_WARPS 8
#define MMA_BF16_MAX_T 8
/* The bf16 form's K splits at most (MOEC_LINEAR_MMA_KS; sm_90: a cluster
 * of that many blocks sums their shares in distributed shared memory),
 * and the blocks that give each of an H100's or H200's SMs one. */
#define MMA_BF16_KS 8
#define MMA_FILL_BLOCKS 132
/* The most tokens a bf16 linear past the tensor-core kernel above takes
 * the staged one (codegen/fp8_tc.c: x, or h of act silu_mul, in shared
 * memory once a block) instead of cuBLASLt (MOEC_LINEAR_TC_MAX_T, up to
 * 64; 0: cuBLASLt). Off: in whole V2-Lite steps at context 1024 (H200,
 * 2026-11-29, against cuBLASLt in the same call) it was level at 16 tokens
 * (7.620 / 7.602 ms) and slower at 32 (9.927 / 9.374) and 64 (11.794 /
 * 10.280). Its blocks of 4 warps, two an SM, leave most warp slots empty
 * (Nsight Compute: 6-14% active) and each warp's x fragments from shared
 * memory keep it waiting: q_proj with kv_a at 32 tokens 10.2 us against
 * cuBLASLt's 7.3, the lm_head 191 against 108. */
#define TC_BF16_MAX_T 0

/* The tiles a warp of the kernel's 16 rows: two share their x fragments
 * once x would be read more than twice over (T >= 32), as long as that
 * leaves 264 blocks (two per H100 SM); 0 where the nw warps' partial sums
 * (part[NW][RT * NT * 4][32] floats) pass the 48 KB of static shared
 * memory even with one (T > 192 at 4 warps). */
static int mma_rt(const cg_ctx *c, int64_t N, int nw)
{
    int nt = (c->T + 7) / 8, rt = nt >= 4 && N / 32 >= 264 ? 2 : 1;
    for (; rt >= 1; rt--)
        if ((size_t)nw * (size_t)(rt * nt * 4 * 32) * sizeof(float) <= 48 * 1024)
            return rt;
    return 0;
}

/* Whether the fp8 weight w of a linear with input x runs on tensor cores:
 * bf16 x, 32-wide k chunks inside the column blocks, 16-row tiles inside
 * the row blocks, the warps' partial sums within 48 KB. */
static int mma_fits(const cg_ctx *c, const ir_value *x, const ir_value *w)
{
    int64_t K = w->type.dims[1];
    return cg_storage(c, x) == IR_DTYPE_BF16 && K % 32 == 0 && w->scale.block[1] % 32 == 0 &&
           w->scale.block[0] % 16 == 0 && mma_rt(c, w->type.dims[0], MMA_WARPS) > 0;
}

/* The bf16 form's warps a block, where the linear (bf16 x, w and a result
 * not i32; with act silu_mul, a bf16 compute dtype: h rounded as the
 * silu_mul kernel stores it) takes it in this bucket; 0 where not: past
 * the few-token bound up to MOEC_LINEAR_MMA_MAX_T tokens, sm_80 on, K a
 * multiple of 32. */
static int mma_bf16_warps(const cg_ctx *c, const ir_op *op, int gemv_max)
{
    const ir_value *x = op->in[0], *w = op->in[1];
    int nw = cg_env_int("MOEC_LINEAR_MMA_WARPS", MMA_BF16_WARPS, 1, 16);
    if (c->T <= gemv_max || c->T > cg_env_int("MOEC_LINEAR_MMA_MAX_T", MMA_BF16_MAX_T, 0, 64) ||
        cg_arch_num(c->opt) < 80 || cg_storage(c, x) != IR_DTYPE_BF16 ||
        (ir_op_attr(op, "act") && c->opt->compute_dtype != IR_DTYPE_BF16) ||
        cg_storage(c, w) != IR_DTYPE_BF16 || cg_storage(c, op->out[0]) == IR_DTYPE_I32 ||
        (op->n_in > 2 && cg_storage(c, op->in[2]) == IR_DTYPE_I32) || w->type.dims[1] % 32 ||
        mma_rt(c, w->type.dims[0], nw) == 0)
        return 0;
    return nw;
}

/* The bf16 form's K splits (sm_90): enough that each warp's chunks are
 * one round of U loads, and that the row tiles times the splits give
 * every SM a block (a few-row linear such as a router: otherwise a
 * handful of blocks), at most MOEC_LINEAR_MMA_KS and one chunk a warp. */
static int mma_splits(const cg_ctx *c, int64_t N, int64_t K, int nw, int rt, int u)
{
    int max = cg_arch_num(c->opt) >= 90 ? cg_env_int("MOEC_LINEAR_MMA_KS", MMA_BF16_KS, 1, 8) : 1;
    long long steps = K / 32, tiles = (N + 16 * rt - 1) / (16 * rt);
    long long ks = (steps + (long long)nw * u - 1) / ((long long)nw * u);
    long long fill = (MMA_FILL_BLOCKS + tiles - 1) / tiles;
    ks = ks > fill ? ks : fill;
    ks = ks > max ? max : ks;
    while (ks > 1 && ks * nw > steps)
        ks--;
    return (int)ks;
}

/* y = alpha x w^T (+ bias) on tensor cores, all T rows: an fp8 w (4
 * warps a block) or a bf16 one (nw, its weights' first chunks loaded
 * before the wait, K split over a cluster, act silu_mul taken). */
static moec_status emit_mma(cg_ctx *c, const ir_op *op, int64_t N, int64_t K, double alpha, int nw)
{
    const ir_value *x = op->in[0], *w = op->in[1], *y = op->out[0];
    const ir_value *bias = op->n_in > 2 ? op->in[2] : NULL;
    ir_dtype dx = cg_storage(c, x), dy = cg_storage(c, y), dw = cg_storage(c, w);
    ir_dtype db = bias ? cg_storage(c, bias) : IR_DTYPE_F32;
    int fp8 = dw == IR_DTYPE_F8E4M3, nt = (c->T + 7) / 8, rt = mma_rt(c, N, nw);
    int act = ir_op_attr(op, "act") != NULL;
    /* chunks in flight: 8 tiles' worth in fp8; bf16 keeps 8 chunks up to
       16 tokens, then fewer as its x fragments grow */
    int u = fp8 ? 8 / (nt * rt) : 16 / (nt * rt) > 8 ? 8 : 16 / (nt * rt);
    u = u < 1 ? 1 : u;
    int ks = fp8 ? 1 : mma_splits(c, N, K, nw, rt, u);
    char name[300], tag[40], decl[400], io[80], cluster[48] = "";
    scale_consts(c, w, tag, sizeof tag, decl, sizeof decl);
    io_suffix(c, op, tag, io, sizeof io);
    char splits[16] = "";
    if (ks > 1) {
        snprintf(splits, sizeof splits, "_s%d", ks);
        snprintf(cluster, sizeof cluster, "__cluster_dims__(%d, 1, 1) ", ks);
    }
    snprintf(name, sizeof name, "linear_mma_n%lld_k%lld_t%d_w%d_rt%d_u%d%s%s_%s_%s", (long long)N,
             (long long)K, c->T, nw, rt, u, splits, act ? "_silu" : "",
             fp8 ? "f8e4m3" : ir_dtype_name(dw), io);
    int is_new = 0;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "linear %%%s: out of memory", y->name);
    if (is_new)
        moec_buf_printf(&c->src,
                      "// linear: y = alpha x w^T (+ b), w on tensor cores (codegen/linear.c, "
                      "emit_mma)\n"
                      "extern \"C\" __global__ void %s__launch_bounds__(%d) %s(const %s *__restrict__ x, "
                      "const %s *__restrict__ w, %sconst %s *__restrict__ bias, float alpha, "
                      "%s *__restrict__ y)\n{\n"
                      "    typedef %s TX;\n"
                      "    typedef %s TW;\n"
                      "    constexpr long long N = %lldLL;\n"
                      "    constexpr int K = %lld, T = %d, NT = %d, NW = %d, RT = %d, U = %d, KS = %d;\n"
                      "    constexpr bool HAS_BIAS = %s, PRE = %s, ACT = %s;\n%s%s%s%s}\n\n",
                      cluster, nw * 32, name, cg_ctype(dx), cg_ctype(dw),
                      fp8 ? "const float *__restrict__ ws, " : "", cg_ctype(db), cg_ctype(dy),
                      cg_ctype(dx), cg_ctype(dw), (long long)N, (long long)K, c->T, nt, nw, rt, u,
                      ks, bias ? "true" : "false", fp8 ? "false" : "true", act ? "true" : "false",
                      decl, MMA_HEAD, fp8 ? "" : MMA_PRE, MMA_BODY);
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "linear %%%s: out of memory", y->name);
    s->kernel = k;
    s->grid[0] = (unsigned)((N + 16 * rt - 1) / (16 * rt) * ks);
    s->block[0] = nw * 32;
    s->smem = ks > 1 ? (unsigned)((nw + 1) * rt * nt * 4 * 32 * sizeof(float)) : 0;
    cg_mma_linear_args(s, op, alpha, fp8);
    return MOEC_OK;
}

/* The staged tensor-core kernel (codegen/fp8_tc.c), fp8 or bf16 w. */
static moec_status emit_tc(cg_ctx *c, const ir_op *op, double alpha)
{
    char tag[40], decl[400], io[80];
    scale_consts(c, op->in[1], tag, sizeof tag, decl, sizeof decl);
    io_suffix(c, op, tag, io, sizeof io);
    return cg_tc_linear(c, op, alpha, io, decl);
}

/* A linear of an fp8 weight (block-scaled, read as fp8: no cuBLASLt step
 * takes bf16 activations with it): the few-rows kernel up to the gemv
 * bound, beyond it the tensor-core kernel that stages x in shared memory
 * (codegen/fp8_tc.c) where the shapes allow (CG_FP8_TC: in every bucket;
 * CG_FP8_OLD: never, the first tensor-core kernel instead, which reads
 * rows: not for a weight in tiles), else the few-rows kernel over groups
 * of rows. */
static moec_status emit_fp8(cg_ctx *c, const ir_op *op, int64_t N, int64_t K, double alpha,
                            int gemv_max)
{
    const ir_value *x = op->in[0], *w = op->in[1];
    if (w->scale.block[0] < 1 || w->scale.block[1] < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "linear %%%s: fp8 weight %%%s has no block scales",
                        op->out[0]->name, w->name);
    int mode = c->opt->fp8_kernel;
    if (ir_op_attr(op, "act")) {
        /* the few-token kernel and the staged one compute h as they load
           x; the other fp8 kernels read x as the op's input (the pass fuses
           an fp8 weight only where the staged kernel's conditions hold,
           fuse_silu_mul_linear) */
        if (c->T <= gemv_max && mode != CG_FP8_TC)
            return emit_gemv(c, op, N, K, alpha, 0, c->T);
        if (mode != CG_FP8_OLD && cg_tc_linear_fits(c, op))
            return emit_tc(c, op, alpha);
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "linear %%%s: act silu_mul with fp8 weight %%%s at %d tokens (the "
                        "few-token kernel up to %d tokens, or the staged kernel where its shapes "
                        "fit; without MOEC_FUSE_SILU_FP8=1 the silu_mul keeps a kernel of its "
                        "own)",
                        op->out[0]->name, w->name, c->T, mode == CG_FP8_TC ? 0 : gemv_max);
    }
    if (c->T <= gemv_max && mode != CG_FP8_TC)
        return emit_gemv(c, op, N, K, alpha, 0, c->T);
    if (mode != CG_FP8_OLD && cg_tc_linear_fits(c, op))
        return emit_tc(c, op, alpha);
    if (c->T <= gemv_max)
        return emit_gemv(c, op, N, K, alpha, 0, c->T);
    /* the first tensor-core kernel reads rows; tiles take the few-token
       kernel's tile form over groups of tokens instead */
    if (!cg_weight_tl(c, w) && mma_fits(c, x, w))
        return emit_mma(c, op, N, K, alpha, MMA_WARPS);
    int step = gemv_max > 0 ? gemv_max : GEMV_MAX_T;
    for (int t0 = 0; t0 < c->T; t0 += step)
        MOEC_TRY(emit_gemv(c, op, N, K, alpha, t0, c->T - t0 < step ? c->T - t0 : step));
    return MOEC_OK;
}

moec_status cg_emit_linear(cg_ctx *c, const ir_op *op)
{
    const ir_value *x = op->in[0], *w = op->in[1], *y = op->out[0];
    const ir_value *bias = op->n_in > 2 ? op->in[2] : NULL;
    const char *act = ir_op_attr_str(op, "act", NULL);
    if (act && strcmp(act, "silu_mul"))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "linear %%%s: act \"%s\" is not \"silu_mul\"",
                        y->name, act);
    if (x->type.rank != 2 || w->type.rank != 2 || w->type.dims[0] == IR_DIM_T ||
        x->type.dims[1] != (act ? 2 : 1) * w->type.dims[1] || y->type.rank != 2 ||
        y->type.dims[1] != w->type.dims[0] ||
        (bias && ir_type_numel(&bias->type, 1) != w->type.dims[0]))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "linear %%%s: wants x [T, K] ([T, 2K] with act), w [N, K], b [N] and a "
                        "result [T, N]",
                        y->name);
    if (cg_linear_in_topk(c, op))
        return MOEC_OK; /* the router: its top-k kernel computes the logits */
    int64_t N = w->type.dims[0], K = w->type.dims[1];
    double alpha = num_attr(op, "alpha", 1.0);
    if (!isfinite(alpha))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "linear %%%s: alpha %g is not finite", y->name,
                        alpha);
    if (bias && alpha != 1.0)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "linear %%%s: alpha %g with a bias (%%%s): the GEMM step adds its bias "
                        "after alpha, the IR before",
                        y->name, alpha, bias->name);
    if (N > INT32_MAX || K > INT32_MAX)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "linear %%%s: %lld x %lld is too large for one GEMM",
                        y->name, (long long)N, (long long)K);
    ir_dtype da = cg_storage(c, w), db = cg_storage(c, x), dc = cg_storage(c, y);
    int gemv_max = cg_env_int("MOEC_GEMV_MAX_T", GEMV_MAX_T, 0, 16);
    if (da == IR_DTYPE_F8E4M3 && db != IR_DTYPE_I32 && dc != IR_DTYPE_I32 &&
        (!bias || cg_storage(c, bias) != IR_DTYPE_I32))
        return emit_fp8(c, op, N, K, alpha, gemv_max);
    if (da != db)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "linear %%%s: weight %%%s is stored %s but its input %%%s %s; "
                        "cuBLASLt wants one input type",
                        y->name, w->name, ir_dtype_name(da), x->name, ir_dtype_name(db));
    if (da == IR_DTYPE_I32 || dc == IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "linear %%%s: integer operands", y->name);
    if (c->T <= gemv_max && (!bias || cg_storage(c, bias) != IR_DTYPE_I32))
        return emit_gemv(c, op, N, K, alpha, 0, c->T);
    int nw = mma_bf16_warps(c, op, gemv_max);
    if (nw)
        return emit_mma(c, op, N, K, alpha, nw);
    if (c->T > gemv_max && c->T <= cg_env_int("MOEC_LINEAR_TC_MAX_T", TC_BF16_MAX_T, 0, 64) &&
        (!bias || cg_storage(c, bias) != IR_DTYPE_I32) && cg_tc_linear_fits(c, op))
        return emit_tc(c, op, alpha);
    /* act: silu_mul into scratch (the compute dtype, as its result was
       stored), the GEMM's input */
    ir_arg xb = cg_arg_act(x);
    if (act) {
        db = c->opt->compute_dtype;
        if (da != db)
            return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                            "linear %%%s: weight %%%s is stored %s but silu_mul's result %s",
                            y->name, w->name, ir_dtype_name(da), ir_dtype_name(db));
        xb = cg_arg_scratch(cg_scratch(c, (size_t)c->T * (size_t)K * ir_dtype_size(db)));
        MOEC_TRY(cg_emit_silu_mul(c, op, x, K, db, xb));
    }
    ir_step *s = cg_step(c, IR_STEP_GEMM, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "linear %%%s: out of memory", y->name);
    ir_gemm *g = &s->gemm;
    g->trans_a = 1;
    g->trans_b = 0;
    g->m = (int)N;
    g->n = c->T;
    g->k = (int)K;
    g->batch = 1;
    g->lda = K;
    g->ldb = K;
    g->ldc = N;
    g->type_a = da;
    g->type_b = db;
    g->type_c = dc;
    g->alpha = (float)alpha;
    g->a = cg_arg_act(w);
    g->b = xb;
    g->c = cg_arg_act(y);
    if (bias) {
        ir_dtype dbias = cg_storage(c, bias);
        if (dbias != IR_DTYPE_F32 && dbias != dc)
            return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                            "linear %%%s: bias %%%s is stored %s; the GEMM wants f32 or %s",
                            y->name, bias->name, ir_dtype_name(dbias), ir_dtype_name(dc));
        g->has_bias = 1;
        g->bias = cg_arg_act(bias);
        g->type_bias = dbias;
    }
    return MOEC_OK;
}
