/* argmax.c — the last step of every bucket: the greedy token of each row of
 * the f32 logits (ties to the lower index) into IR_INPUT_SAMPLED, so that a
 * decode loop reads back T ints instead of T * vocab floats. One block per
 * token row, float4 loads when the vocabulary allows. A row holding a NaN or
 * an infinity gets IR_SAMPLED_NONFINITE (-1) instead of an id: the argmax
 * reads every logit anyway, so this is where a broken checkpoint or an
 * overflow is caught, and the host reports it rather than decoding garbage. */
#include <stdio.h>
#include <string.h>

#include "codegen/cg.h"
#include "err.h"

/* Blocks per row (a cluster) for large vocabularies on sm_90, 8 by default:
   the one-block argmax of 102400 logits added 8.8 us to a V2-Lite step at
   batch 1 (H100, 2026-11-25 timeline), where 8 blocks measured level (2.314
   against 2.318 ms at batch 1, 13.820 against 13.779 at 64, one call;
   gpu_sample passes with 8); on the H200 8 blocks took 7 and 11 us off a
   Qwen3-30B step at batch 1 (151936 logits; 2026-11-29, two calls).
   MOEC_ARGMAX_CL=1|2|4 for A/B runs. */
#define ARGMAX_CL 8

/* CL blocks per row (a cluster on sm_90 for large vocabularies, else 1):
 * block `part` of a row scans CH logits from part * CH (a multiple of 4, so
 * float4 loads stay aligned), then block 0 of the cluster merges the
 * blocks' results from their shared memory. */
static const char ARGMAX_BODY[] =
    "    const int r = blockIdx.x / CL, part = blockIdx.x % CL;\n"
    "    constexpr int CH = ((V + CL - 1) / CL + 3) / 4 * 4;\n"
    "    const int lo = part * CH, hi = V < lo + CH ? V : lo + CH;\n"
    "    const float *row = logits + (long long)r * V;\n"
    "    float best = MOEC_NEG_INF;\n"
    "    int bi = V;\n"
    "    /* a NaN or an infinity: its exponent bits are all ones */\n"
    "    auto nonfinite = [](float x) -> unsigned {\n"
    "        return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;\n"
    "    };\n"
    "    unsigned bad = 0;\n"
    "    if constexpr (V % 4 == 0) {\n"
    "        for (int i = lo / 4 + threadIdx.x; i < hi / 4; i += NT) {\n"
    "            float4 v = reinterpret_cast<const float4 *>(row)[i];\n"
    "            bad |= nonfinite(v.x) | nonfinite(v.y) | nonfinite(v.z) | nonfinite(v.w);\n"
    "            if (v.x > best || (v.x == best && 4 * i < bi)) { best = v.x; bi = 4 * i; }\n"
    "            if (v.y > best || (v.y == best && 4 * i + 1 < bi)) { best = v.y; bi = 4 * i + 1; }\n"
    "            if (v.z > best || (v.z == best && 4 * i + 2 < bi)) { best = v.z; bi = 4 * i + 2; }\n"
    "            if (v.w > best || (v.w == best && 4 * i + 3 < bi)) { best = v.w; bi = 4 * i + 3; }\n"
    "        }\n"
    "    } else {\n"
    "        for (int i = lo + threadIdx.x; i < hi; i += NT) {\n"
    "            float v = row[i];\n"
    "            bad |= nonfinite(v);\n"
    "            if (v > best || (v == best && i < bi)) { best = v; bi = i; }\n"
    "        }\n"
    "    }\n"
    "    /* (value, index) pairs: the larger value, ties to the lower index */\n"
    "    auto merge = [&](float ov, int oi) {\n"
    "        if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }\n"
    "    };\n"
    "#pragma unroll\n"
    "    for (int o = 16; o > 0; o >>= 1)\n"
    "        merge(__shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, bi, o));\n"
    "    __shared__ float s_v[NT / 32];\n"
    "    __shared__ int s_i[NT / 32];\n"
    "    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n"
    "    if (lane == 0) { s_v[warp] = best; s_i[warp] = bi; }\n"
    "    int row_bad = __syncthreads_or(bad);\n"
    "    if (warp == 0) {\n"
    "        best = lane < NT / 32 ? s_v[lane] : MOEC_NEG_INF;\n"
    "        bi = lane < NT / 32 ? s_i[lane] : V;\n"
    "#pragma unroll\n"
    "        for (int o = 16; o > 0; o >>= 1)\n"
    "            merge(__shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, bi, o));\n"
    "    }\n"
    "    if constexpr (CL > 1) {\n"
    "        /* the cluster's blocks' results (value, index bits, flag) */\n"
    "        __shared__ float s_res[3];\n"
    "        if (threadIdx.x == 0) {\n"
    "            s_res[0] = best;\n"
    "            s_res[1] = __int_as_float(bi);\n"
    "            s_res[2] = __int_as_float(row_bad);\n"
    "        }\n"
    "        moec_cluster_sync();\n"
    "        if (part == 0 && warp == 0) {\n"
    "            best = lane < CL ? moec_ld_cluster(&s_res[0], (unsigned)lane) : MOEC_NEG_INF;\n"
    "            bi = lane < CL ? __float_as_int(moec_ld_cluster(&s_res[1], (unsigned)lane)) : V;\n"
    "            row_bad = __any_sync(0xffffffffu,\n"
    "                                 lane < CL && __float_as_int(moec_ld_cluster(&s_res[2], (unsigned)lane)));\n"
    "#pragma unroll\n"
    "            for (int o = 16; o > 0; o >>= 1)\n"
    "                merge(__shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, bi, o));\n"
    "        }\n"
    "        moec_cluster_sync(); /* no block leaves while block 0 reads it */\n"
    "    }\n"
    "    /* a row of finite values always has an id: every one beats -inf */\n"
    "    if (part == 0 && threadIdx.x == 0)\n"
    "        sampled[r] = row_bad ? NONFINITE_ID : bi;\n";

moec_status cg_emit_argmax(cg_ctx *c, const ir_value *logits)
{
    const ir_type *ty = &logits->type;
    if (ty->rank != 2 || ty->dims[0] != IR_DIM_T || ty->dims[1] < 1 || ty->dims[1] >= (1LL << 31))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "argmax of %%%s: logits must be [T, vocab]",
                        logits->name);
    if (cg_storage(c, logits) != IR_DTYPE_F32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "argmax of %%%s: logits must be stored as f32",
                        logits->name);
    long long V = ty->dims[1];
    int nt = V >= 32768 ? 1024 : V >= 2048 ? 256 : 32;
    /* ARGMAX_CL blocks per row (a cluster) for large vocabularies on sm_90 */
    int cl = V >= 32768 && cg_arch_num(c->opt) >= 90 ? cg_env_int("MOEC_ARGMAX_CL", ARGMAX_CL, 1, 8)
                                                     : 1;
    cl = cl >= 8 ? 8 : cl >= 4 ? 4 : cl >= 2 ? 2 : 1;
    char dims[40] = "";
    if (cl > 1)
        snprintf(dims, sizeof dims, "__cluster_dims__(%d, 1, 1) ", cl);
    char name[96];
    snprintf(name, sizeof name, "argmax_v%lld_t%d%s", V, c->T, cl > 1 ? "_cl" : "");
    if (cl > 1)
        snprintf(name + strlen(name), sizeof name - strlen(name), "%d", cl);
    int is_new = 0;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "argmax of %%%s: no memory", logits->name);
    if (is_new) {
        moec_buf_printf(&c->src,
                      "// argmax: greedy token per row, ties to the lower index (codegen/argmax.c, "
                      "cg_emit_argmax)\n"
                      "extern \"C\" __global__ void %s__launch_bounds__(%d) %s(const float *__restrict__ "
                      "logits, int *__restrict__ sampled)\n{\n"
                      "    constexpr int V = %lld, NT = %d, CL = %d;\n"
                      "    constexpr int NONFINITE_ID = %d;\n",
                      dims,
                      nt, name, V, nt, cl, IR_SAMPLED_NONFINITE);
        moec_buf_printf(&c->src, "%s}\n\n", ARGMAX_BODY);
    }
    ir_step *s = cg_step(c, IR_STEP_KERNEL, logits->def);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "argmax of %%%s: no memory", logits->name);
    s->kernel = k;
    s->grid[0] = (unsigned)(c->T * cl);
    s->block[0] = (unsigned)nt;
    s->n_args = 2;
    s->args[0] = cg_arg_act(logits);
    s->args[1] = cg_arg_input(IR_INPUT_SAMPLED);
    return MOEC_OK;
}
