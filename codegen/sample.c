/* sample.c — the device sampler, the step after the argmax in every
 * bucket: each row of the f32 logits whose parameter row (IR_INPUT_SAMPLE_ROWS,
 * ir/ir_sample.h, written by the host before each step) is on gets its
 * token drawn here, with its log probability, so that a decode loop reads
 * back T ids and T floats instead of rows of logits, whatever its requests'
 * sampling settings. The algorithm is ir_sample.h's; engine/sample.c is its
 * CPU twin, and the two draw the same token bit for bit: every float
 * operation below is an explicit _rn intrinsic (nothing fused), every sum
 * of weights an integer.
 *
 * One block per row, as FlashInfer samples without sorting: the penalties
 * are applied in place (the raw logits kept in the penalty entries and put
 * back at the end), a pass finds the penalized row's largest value, top_k
 * and top_p each find their threshold by a 4-pass radix select over the
 * logits' order-preserving keys (histograms of counts, or of weights, in
 * shared memory), and ties at a threshold and the draw itself are found in
 * id order from per-tile sums (tiles of 32 * EPL ids, a warp each). Rows
 * whose parameter row is off return at once: greedy requests keep the
 * argmax's id. */
#include <stdio.h>

#include "codegen/cg.h"
#include "err.h"
#include "ir/ir_sample.h"

/* Definitions every bucket's sampler shares (guarded: the codegen tests put
 * several buckets in one program). */
static const char SAMPLE_DEFS[] =
    "#ifndef MOEC_SAMPLE_DEFS\n"
    "#define MOEC_SAMPLE_DEFS\n"
    "struct moec_sample_row {\n"
    "    int mode, logprob;\n"
    "    float temperature, inv_temp;\n"
    "    int top_k;\n"
    "    unsigned top_p, min_p_lo, min_p_hi;\n"
    "    float repetition, presence, frequency;\n"
    "    unsigned seed_lo, seed_hi, counter;\n"
    "    int pen_first, pen_count;\n"
    "};\n"
    "struct moec_sample_pen {\n"
    "    int id, count;\n"
    "    float raw;\n"
    "};\n"
    "static_assert(sizeof(moec_sample_row) == 4 * MOEC_SAMPLE_ROW_WORDS, \"ir_sample_row\");\n"
    "static_assert(sizeof(moec_sample_pen) == 4 * MOEC_SAMPLE_PEN_WORDS, \"ir_sample_pen\");\n"
    "\n"
    "/* floor(e^x * 2^40) for a scaled logit x <= 0, 0 below X_MIN: the float\n"
    "   operations of engine/sample.c's moec_sample_weight, none fused */\n"
    "__device__ __forceinline__ unsigned long long moec_sample_weight(float x)\n"
    "{\n"
    "    if (!(x >= MOEC_SAMPLE_X_MIN))\n"
    "        return 0ull;\n"
    "    const float k = rintf(__fmul_rn(x, MOEC_SAMPLE_LOG2E));\n"
    "    const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(k, MOEC_SAMPLE_LN2_HI)),\n"
    "                              __fmul_rn(k, MOEC_SAMPLE_LN2_LO));\n"
    "    float p = MOEC_SAMPLE_C6;\n"
    "    p = __fadd_rn(__fmul_rn(p, r), MOEC_SAMPLE_C5);\n"
    "    p = __fadd_rn(__fmul_rn(p, r), MOEC_SAMPLE_C4);\n"
    "    p = __fadd_rn(__fmul_rn(p, r), MOEC_SAMPLE_C3);\n"
    "    p = __fadd_rn(__fmul_rn(p, r), MOEC_SAMPLE_C2);\n"
    "    p = __fadd_rn(__fmul_rn(p, r), MOEC_SAMPLE_C1);\n"
    "    p = __fadd_rn(__fmul_rn(p, r), MOEC_SAMPLE_C0);\n"
    "    const float scale = __int_as_float((127 + MOEC_SAMPLE_WEIGHT_BITS + (int)k) << 23);\n"
    "    return __float2ull_rz(__fmul_rn(p, scale));\n"
    "}\n"
    "\n"
    "/* the logits' order as unsigned keys: a larger float, a larger key (-0 as +0) */\n"
    "__device__ __forceinline__ unsigned moec_sample_key(float v)\n"
    "{\n"
    "    unsigned b = __float_as_uint(v);\n"
    "    if (b == 0x80000000u)\n"
    "        b = 0u;\n"
    "    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ unsigned long long moec_mix64(unsigned long long z)\n"
    "{\n"
    "    z = (z ^ (z >> 30)) * MOEC_SAMPLE_MIX1;\n"
    "    z = (z ^ (z >> 27)) * MOEC_SAMPLE_MIX2;\n"
    "    return z ^ (z >> 31);\n"
    "}\n"
    "\n"
    "/* the row's random word: splitmix64 of (seed, counter) */\n"
    "__device__ __forceinline__ unsigned long long moec_sample_random(const moec_sample_row &p)\n"
    "{\n"
    "    const unsigned long long seed = (unsigned long long)p.seed_hi << 32 | p.seed_lo;\n"
    "    return moec_mix64(moec_mix64(seed + MOEC_SAMPLE_GOLDEN) +\n"
    "                      ((unsigned long long)p.counter + 1ull) * MOEC_SAMPLE_GOLDEN);\n"
    "}\n"
    "\n"
    "/* the inclusive prefix of v over a warp's lanes in order */\n"
    "__device__ __forceinline__ unsigned long long moec_warp_scan(unsigned long long v)\n"
    "{\n"
    "    const int lane = threadIdx.x & 31;\n"
    "#pragma unroll\n"
    "    for (int o = 1; o < 32; o <<= 1) {\n"
    "        const unsigned long long x = __shfl_up_sync(0xffffffffu, v, o);\n"
    "        if (lane >= o)\n"
    "            v += x;\n"
    "    }\n"
    "    return v;\n"
    "}\n"
    "\n"
    "/* the exclusive prefix of v over the block's threads in order; *total the sum */\n"
    "template <int NT>\n"
    "__device__ __forceinline__ unsigned long long moec_block_scan(unsigned long long v,\n"
    "                                                              unsigned long long *total)\n"
    "{\n"
    "    __shared__ unsigned long long s_w[NT / 32];\n"
    "    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n"
    "    const unsigned long long inc = moec_warp_scan(v);\n"
    "    if (lane == 31)\n"
    "        s_w[warp] = inc;\n"
    "    __syncthreads();\n"
    "    unsigned long long base = 0, all = 0;\n"
    "    for (int w = 0; w < NT / 32; w++) {\n"
    "        const unsigned long long x = s_w[w];\n"
    "        base += w < warp ? x : 0ull;\n"
    "        all += x;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    *total = all;\n"
    "    return base + inc - v;\n"
    "}\n"
    "\n"
    "/* Per tile of 32 * EPL consecutive ids (a warp each, EPL ids a lane), the\n"
    "   sum of f(i, v, key) into s_tile; returns the row's sum. */\n"
    "template <int NT, int V, int EPL, int NTILES, class F>\n"
    "__device__ unsigned long long moec_tile_sums(const float *row, F f, unsigned long long *s_tile)\n"
    "{\n"
    "    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n"
    "    for (int t = warp; t < NTILES; t += NT / 32) {\n"
    "        const int base = t * 32 * EPL + lane * EPL;\n"
    "        unsigned long long s = 0;\n"
    "#pragma unroll\n"
    "        for (int e = 0; e < EPL; e++)\n"
    "            if (base + e < V) {\n"
    "                const float v = row[base + e];\n"
    "                s += f(base + e, v, moec_sample_key(v));\n"
    "            }\n"
    "#pragma unroll\n"
    "        for (int o = 16; o > 0; o >>= 1)\n"
    "            s += __shfl_xor_sync(0xffffffffu, s, o);\n"
    "        if (lane == 0)\n"
    "            s_tile[t] = s;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    unsigned long long mine = 0, total;\n"
    "    for (int t = threadIdx.x; t < NTILES; t += NT)\n"
    "        mine += s_tile[t];\n"
    "    moec_block_scan<NT>(mine, &total);\n"
    "    return total;\n"
    "}\n"
    "\n"
    "/* The first id, in id order, at which the running sum of f passes target\n"
    "   (target < the row's sum; s_tile from moec_tile_sums of the same f): the\n"
    "   tile by a scan of the tile sums, then the id by a warp's scan of it. */\n"
    "template <int NT, int V, int EPL, int NTILES, class F>\n"
    "__device__ int moec_locate(const float *row, F f, const unsigned long long *s_tile,\n"
    "                           unsigned long long target)\n"
    "{\n"
    "    __shared__ int s_tile_at, s_id;\n"
    "    __shared__ unsigned long long s_base;\n"
    "    constexpr int TPT = (NTILES + NT - 1) / NT; /* tiles a thread, consecutive */\n"
    "    const int t0 = threadIdx.x * TPT;\n"
    "    unsigned long long mine = 0, total;\n"
    "    for (int j = 0; j < TPT; j++)\n"
    "        mine += t0 + j < NTILES ? s_tile[t0 + j] : 0ull;\n"
    "    if (threadIdx.x == 0) {\n"
    "        s_tile_at = -1;\n"
    "        s_id = -1;\n"
    "    }\n"
    "    const unsigned long long before = moec_block_scan<NT>(mine, &total);\n"
    "    if (before <= target && target < before + mine) {\n"
    "        unsigned long long acc = before;\n"
    "        for (int j = 0; j < TPT && t0 + j < NTILES; j++) {\n"
    "            if (target < acc + s_tile[t0 + j]) {\n"
    "                s_tile_at = t0 + j;\n"
    "                s_base = acc;\n"
    "                break;\n"
    "            }\n"
    "            acc += s_tile[t0 + j];\n"
    "        }\n"
    "    }\n"
    "    __syncthreads();\n"
    "    const int t = s_tile_at;\n"
    "    if (threadIdx.x < 32 && t >= 0) {\n"
    "        const int lane = threadIdx.x, base = t * 32 * EPL + lane * EPL;\n"
    "        unsigned long long w[EPL], part = 0;\n"
    "#pragma unroll\n"
    "        for (int e = 0; e < EPL; e++) {\n"
    "            w[e] = 0ull;\n"
    "            if (base + e < V) {\n"
    "                const float v = row[base + e];\n"
    "                w[e] = f(base + e, v, moec_sample_key(v));\n"
    "            }\n"
    "            part += w[e];\n"
    "        }\n"
    "        unsigned long long acc = s_base + moec_warp_scan(part) - part;\n"
    "        if (acc <= target && target < acc + part)\n"
    "            for (int e = 0; e < EPL; e++) {\n"
    "                if (target < acc + w[e]) {\n"
    "                    s_id = base + e;\n"
    "                    break;\n"
    "                }\n"
    "                acc += w[e];\n"
    "            }\n"
    "    }\n"
    "    __syncthreads();\n"
    "    const int id = s_id;\n"
    "    __syncthreads();\n"
    "    return id;\n"
    "}\n"
    "\n"
    "/* Radix select over the keys, 8 bits a pass from the top: the key tau with\n"
    "   mass(key > tau) < need <= mass(key >= tau), mass the sum of f(i, v, key)\n"
    "   (a count, or a weight); need_of(total) gives need from the row's mass,\n"
    "   known after the first pass. *rem: need - mass(key > tau); *tie:\n"
    "   mass(key == tau). */\n"
    "template <int NT, int V, class F, class N>\n"
    "__device__ unsigned moec_radix_select(const float *row, F f, N need_of, unsigned long long *rem,\n"
    "                                      unsigned long long *tie, unsigned long long *s_hist)\n"
    "{\n"
    "    __shared__ unsigned s_digit;\n"
    "    __shared__ unsigned long long s_rem, s_tie;\n"
    "    unsigned prefix = 0, mask = 0;\n"
    "    unsigned long long need = 0;\n"
    "    for (int shift = 24; shift >= 0; shift -= 8) {\n"
    "        for (int b = threadIdx.x; b < 256; b += NT)\n"
    "            s_hist[b] = 0ull;\n"
    "        __syncthreads();\n"
    "        for (int i = threadIdx.x; i < V; i += NT) {\n"
    "            const float v = row[i];\n"
    "            const unsigned k = moec_sample_key(v);\n"
    "            if ((k & mask) != prefix)\n"
    "                continue;\n"
    "            const unsigned long long w = f(i, v, k);\n"
    "            if (w)\n"
    "                atomicAdd(&s_hist[(k >> shift) & 255u], w);\n"
    "        }\n"
    "        __syncthreads();\n"
    "        if (threadIdx.x < 32) {\n"
    "            /* lane l holds bins 255 - 8l down to 248 - 8l: the higher keys first */\n"
    "            const int lane = threadIdx.x;\n"
    "            unsigned long long part = 0;\n"
    "            for (int j = 0; j < 8; j++)\n"
    "                part += s_hist[255 - 8 * lane - j];\n"
    "            const unsigned long long inc = moec_warp_scan(part);\n"
    "            if (shift == 24)\n"
    "                need = need_of(__shfl_sync(0xffffffffu, inc, 31));\n"
    "            const unsigned long long excl = inc - part;\n"
    "            if (lane == 0) {\n"
    "                /* unreachable when need <= the row's mass; a defined answer anyway */\n"
    "                s_digit = 0u;\n"
    "                s_rem = need;\n"
    "                s_tie = 0ull;\n"
    "            }\n"
    "            __syncwarp();\n"
    "            if (excl < need && need <= inc) {\n"
    "                unsigned long long acc = excl;\n"
    "                for (int j = 0; j < 8; j++) {\n"
    "                    const int b = 255 - 8 * lane - j;\n"
    "                    if (need <= acc + s_hist[b]) {\n"
    "                        s_digit = (unsigned)b;\n"
    "                        s_rem = need - acc;\n"
    "                        s_tie = s_hist[b];\n"
    "                        break;\n"
    "                    }\n"
    "                    acc += s_hist[b];\n"
    "                }\n"
    "            }\n"
    "        }\n"
    "        __syncthreads();\n"
    "        prefix |= s_digit << shift;\n"
    "        mask |= 255u << shift;\n"
    "        need = s_rem;\n"
    "        *tie = s_tie;\n"
    "        __syncthreads();\n"
    "    }\n"
    "    *rem = need;\n"
    "    return prefix;\n"
    "}\n"
    "#endif\n\n";

static const char SAMPLE_BODY[] =
    "    __shared__ unsigned long long s_tile[NTILES];\n"
    "    __shared__ unsigned long long s_hist[256];\n"
    "    __shared__ float s_v[NT / 32];\n"
    "    __shared__ int s_i[NT / 32];\n"
    "    const int r = blockIdx.x;\n"
    "    const moec_sample_row p = rows[r];\n"
    "    if (p.mode != 1)\n"
    "        return;\n"
    "    float *row = logits + (long long)r * V;\n"
    "    const int greedy = sampled[r];\n"
    "    if (greedy < 0) { /* the raw row is not finite: the argmax said so */\n"
    "        if (threadIdx.x == 0) {\n"
    "            drawn[r] = NONFINITE_ID;\n"
    "            logprobs[r] = 0.0f;\n"
    "        }\n"
    "        return;\n"
    "    }\n"
    "    /* the raw logits' log-sum-exp, for the log probability */\n"
    "    float lse = 0.0f;\n"
    "    if (p.logprob) {\n"
    "        const float mx = row[greedy];\n"
    "        float s = 0.0f;\n"
    "        for (int i = threadIdx.x; i < V; i += NT)\n"
    "            s += expf(row[i] - mx);\n"
    "        lse = mx + logf(block_sum(s));\n"
    "    }\n"
    "    /* penalties in place, each raw logit kept in its entry */\n"
    "    const bool rep = p.repetition != 1.0f, pf = p.presence != 0.0f || p.frequency != 0.0f;\n"
    "    for (int j = threadIdx.x; j < p.pen_count; j += NT) {\n"
    "        moec_sample_pen *e = &pens[p.pen_first + j];\n"
    "        const float raw = row[e->id];\n"
    "        float v = raw;\n"
    "        if (rep)\n"
    "            v = v > 0.0f ? __fdiv_rn(v, p.repetition) : __fmul_rn(v, p.repetition);\n"
    "        if (pf && e->count > 0)\n"
    "            v = __fsub_rn(v, __fadd_rn(p.presence, __fmul_rn(p.frequency, (float)e->count)));\n"
    "        e->raw = raw;\n"
    "        row[e->id] = v;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    /* the penalized row's largest value (the lowest id on ties); finite? */\n"
    "    float best = MOEC_NEG_INF;\n"
    "    int bi = V;\n"
    "    unsigned bad = 0;\n"
    "    for (int i = threadIdx.x; i < V; i += NT) {\n"
    "        const float v = row[i];\n"
    "        bad |= (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;\n"
    "        if (v > best || (v == best && i < bi)) { best = v; bi = i; }\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int o = 16; o > 0; o >>= 1) {\n"
    "        const float ov = __shfl_xor_sync(0xffffffffu, best, o);\n"
    "        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);\n"
    "        if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }\n"
    "    }\n"
    "    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n"
    "    if (lane == 0) { s_v[warp] = best; s_i[warp] = bi; }\n"
    "    const int row_bad = __syncthreads_or(bad);\n"
    "    best = MOEC_NEG_INF;\n"
    "    bi = V;\n"
    "    for (int w = 0; w < NT / 32; w++)\n"
    "        if (s_v[w] > best || (s_v[w] == best && s_i[w] < bi)) { best = s_v[w]; bi = s_i[w]; }\n"
    "    int tok = bi;\n"
    "    if (row_bad) {\n"
    "        tok = NONFINITE_ID;\n"
    "    } else if (p.temperature != 0.0f) {\n"
    "        const float vmax = best, inv_t = p.inv_temp;\n"
    "        auto weight = [&](float v) -> unsigned long long {\n"
    "            return moec_sample_weight(__fmul_rn(__fsub_rn(v, vmax), inv_t));\n"
    "        };\n"
    "        /* top_k: the top_k first-ranked (key, then id) */\n"
    "        unsigned tau_k = 0u;\n"
    "        int cut_k = V;\n"
    "        if (p.top_k > 0 && p.top_k < V) {\n"
    "            unsigned long long rem, tie;\n"
    "            const unsigned long long k = (unsigned long long)p.top_k;\n"
    "            tau_k = moec_radix_select<NT, V>(\n"
    "                row, [&](int, float, unsigned) -> unsigned long long { return 1ull; },\n"
    "                [&](unsigned long long) { return k; }, &rem, &tie, s_hist);\n"
    "            if (rem < tie) { /* the first rem ties in id order */\n"
    "                auto at = [&](int, float, unsigned key) -> unsigned long long {\n"
    "                    return key == tau_k ? 1ull : 0ull;\n"
    "                };\n"
    "                moec_tile_sums<NT, V, EPL, NTILES>(row, at, s_tile);\n"
    "                cut_k = moec_locate<NT, V, EPL, NTILES>(row, at, s_tile, rem - 1ull);\n"
    "            }\n"
    "        }\n"
    "        auto in_k = [&](int i, unsigned key) {\n"
    "            return key > tau_k || (key == tau_k && i <= cut_k);\n"
    "        };\n"
    "        /* top_p: of those, the fewest first-ranked whose weight reaches its share */\n"
    "        unsigned tau_p = 0u;\n"
    "        int cut_p = V;\n"
    "        if (p.top_p) {\n"
    "            unsigned long long rem, tie;\n"
    "            auto wk = [&](int i, float v, unsigned key) -> unsigned long long {\n"
    "                return in_k(i, key) ? weight(v) : 0ull;\n"
    "            };\n"
    "            const unsigned long long share = (unsigned long long)p.top_p << 32;\n"
    "            tau_p = moec_radix_select<NT, V>(\n"
    "                row, wk,\n"
    "                [&](unsigned long long z) {\n"
    "                    const unsigned long long need = __umul64hi(z, share);\n"
    "                    return need ? need : 1ull;\n"
    "                },\n"
    "                &rem, &tie, s_hist);\n"
    "            if (rem < tie) { /* ties share one weight: the first in id order */\n"
    "                auto at = [&](int i, float v, unsigned key) -> unsigned long long {\n"
    "                    return key == tau_p && in_k(i, key) ? weight(v) : 0ull;\n"
    "                };\n"
    "                moec_tile_sums<NT, V, EPL, NTILES>(row, at, s_tile);\n"
    "                cut_p = moec_locate<NT, V, EPL, NTILES>(row, at, s_tile, rem - 1ull);\n"
    "            }\n"
    "        }\n"
    "        /* min_p, then the draw: the first id whose running weight passes u */\n"
    "        const unsigned long long min_w = (unsigned long long)p.min_p_hi << 32 | p.min_p_lo;\n"
    "        auto kept = [&](int i, float v, unsigned key) -> unsigned long long {\n"
    "            if (!in_k(i, key) || !(key > tau_p || (key == tau_p && i <= cut_p)))\n"
    "                return 0ull;\n"
    "            const unsigned long long w = weight(v);\n"
    "            return w >= min_w ? w : 0ull;\n"
    "        };\n"
    "        const unsigned long long total = moec_tile_sums<NT, V, EPL, NTILES>(row, kept, s_tile);\n"
    "        const unsigned long long u = __umul64hi(moec_sample_random(p), total);\n"
    "        tok = moec_locate<NT, V, EPL, NTILES>(row, kept, s_tile, u);\n"
    "    }\n"
    "    /* the raw logits back */\n"
    "    __syncthreads();\n"
    "    for (int j = threadIdx.x; j < p.pen_count; j += NT) {\n"
    "        const moec_sample_pen e = pens[p.pen_first + j];\n"
    "        row[e.id] = e.raw;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    if (threadIdx.x == 0) {\n"
    "        drawn[r] = tok;\n"
    "        logprobs[r] = tok >= 0 && p.logprob ? row[tok] - lse : 0.0f;\n"
    "    }\n";

/* The constants of ir_sample.h as the generated source's macros. */
static void emit_constants(moec_buf *b)
{
    moec_buf_printf(b,
                    "#ifndef MOEC_SAMPLE_CONSTANTS\n"
                    "#define MOEC_SAMPLE_CONSTANTS\n"
                    "#define MOEC_SAMPLE_ROW_WORDS %d\n"
                    "#define MOEC_SAMPLE_PEN_WORDS %d\n"
                    "#define MOEC_SAMPLE_WEIGHT_BITS %d\n"
                    "#define MOEC_SAMPLE_X_MIN (%af)\n"
                    "#define MOEC_SAMPLE_LOG2E %af\n"
                    "#define MOEC_SAMPLE_LN2_HI %af\n"
                    "#define MOEC_SAMPLE_LN2_LO %af\n",
                    IR_SAMPLE_ROW_WORDS, IR_SAMPLE_PEN_WORDS, IR_SAMPLE_WEIGHT_BITS,
                    (double)IR_SAMPLE_X_MIN, (double)IR_SAMPLE_LOG2E, (double)IR_SAMPLE_LN2_HI,
                    (double)IR_SAMPLE_LN2_LO);
    const float c[IR_SAMPLE_EXP_DEGREE + 1] = {IR_SAMPLE_EXP_C0, IR_SAMPLE_EXP_C1,
                                               IR_SAMPLE_EXP_C2, IR_SAMPLE_EXP_C3,
                                               IR_SAMPLE_EXP_C4, IR_SAMPLE_EXP_C5,
                                               IR_SAMPLE_EXP_C6};
    for (int i = 0; i <= IR_SAMPLE_EXP_DEGREE; i++)
        moec_buf_printf(b, "#define MOEC_SAMPLE_C%d %af\n", i, (double)c[i]);
    moec_buf_printf(b,
                    "#define MOEC_SAMPLE_GOLDEN 0x%llxull\n"
                    "#define MOEC_SAMPLE_MIX1 0x%llxull\n"
                    "#define MOEC_SAMPLE_MIX2 0x%llxull\n"
                    "#endif\n",
                    (unsigned long long)IR_SAMPLE_GOLDEN, (unsigned long long)IR_SAMPLE_MIX1,
                    (unsigned long long)IR_SAMPLE_MIX2);
}

moec_status cg_emit_sample(cg_ctx *c, const ir_value *logits)
{
    const ir_type *ty = &logits->type;
    if (ty->rank != 2 || ty->dims[0] != IR_DIM_T || ty->dims[1] < 1 ||
        ty->dims[1] > IR_SAMPLE_VOCAB_MAX)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "sampler of %%%s: logits must be [T, vocab] with at most %d ids",
                        logits->name, IR_SAMPLE_VOCAB_MAX);
    if (cg_storage(c, logits) != IR_DTYPE_F32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "sampler of %%%s: logits must be stored as f32",
                        logits->name);
    long long V = ty->dims[1];
    int nt = V >= 32768 ? 1024 : V >= 2048 ? 256 : 32;
    /* tiles of 32 * EPL ids: at most 4096 of them (32 KiB of sums) */
    long long epl = (V + 32LL * 4096 - 1) / (32LL * 4096);
    if (epl < 4)
        epl = 4;
    long long ntiles = (V + 32 * epl - 1) / (32 * epl);
    char name[96];
    snprintf(name, sizeof name, "sample_v%lld_t%d", V, c->T);
    int is_new = 0;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "sampler of %%%s: no memory", logits->name);
    if (is_new) {
        emit_constants(&c->src);
        moec_buf_printf(&c->src, "%s", SAMPLE_DEFS);
        moec_buf_printf(
            &c->src,
            "// sample: each row whose parameter row is on gets its token drawn, with its log "
            "probability (codegen/sample.c, cg_emit_sample)\n"
            "extern \"C\" __global__ void __launch_bounds__(%d) %s(float *logits, const int "
            "*__restrict__ sampled, const moec_sample_row *__restrict__ rows, moec_sample_pen "
            "*pens, int *__restrict__ drawn, float *__restrict__ logprobs)\n{\n"
            "    constexpr int V = %lld, NT = %d, EPL = %lld, NTILES = %lld;\n"
            "    constexpr int NONFINITE_ID = %d;\n",
            nt, name, V, nt, epl, ntiles, IR_SAMPLED_NONFINITE);
        moec_buf_printf(&c->src, "%s}\n\n", SAMPLE_BODY);
    }
    ir_step *s = cg_step(c, IR_STEP_KERNEL, logits->def);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "sampler of %%%s: no memory", logits->name);
    s->kernel = k;
    s->grid[0] = (unsigned)c->T;
    s->block[0] = (unsigned)nt;
    s->n_args = 6;
    s->args[0] = cg_arg_act(logits);
    s->args[1] = cg_arg_input(IR_INPUT_SAMPLED);
    s->args[2] = cg_arg_input(IR_INPUT_SAMPLE_ROWS);
    s->args[3] = cg_arg_input(IR_INPUT_SAMPLE_PENS);
    s->args[4] = cg_arg_input(IR_INPUT_SAMPLE_TOKENS);
    s->args[5] = cg_arg_input(IR_INPUT_SAMPLE_LOGPROBS);
    return MOEC_OK;
}

int cg_has_sampler(const ir_module *m)
{
    const ir_type *ty = m->n_outputs == 1 ? &m->outputs[0]->type : NULL;
    return ty && ty->rank == 2 && ty->dims[1] >= 1 && ty->dims[1] <= IR_SAMPLE_VOCAB_MAX;
}
