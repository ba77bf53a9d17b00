/* argmax.c — the last step of every bucket: the greedy token of each row of
 * the f32 logits (ties to the lower index) into IR_INPUT_SAMPLED, so that a
 * decode loop reads back T ints instead of T * vocab floats. One block per
 * token row, float4 loads when the vocabulary allows. A row holding a NaN or
 * an infinity gets IR_SAMPLED_NONFINITE (-1) instead of an id: the argmax
 * reads every logit anyway, so this is where a broken checkpoint or an
 * overflow is caught, and the host reports it rather than decoding garbage. */
#include <stdio.h>

#include "codegen/cg.h"
#include "err.h"

static const char ARGMAX_BODY[] =
    "    const float *row = logits + (long long)blockIdx.x * V;\n"
    "    float best = MOEC_NEG_INF;\n"
    "    int bi = V;\n"
    "    /* a NaN or an infinity: its exponent bits are all ones */\n"
    "    auto nonfinite = [](float x) -> unsigned {\n"
    "        return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;\n"
    "    };\n"
    "    unsigned bad = 0;\n"
    "    if constexpr (V % 4 == 0) {\n"
    "        for (int i = threadIdx.x; i < V / 4; i += NT) {\n"
    "            float4 v = reinterpret_cast<const float4 *>(row)[i];\n"
    "            bad |= nonfinite(v.x) | nonfinite(v.y) | nonfinite(v.z) | nonfinite(v.w);\n"
    "            if (v.x > best || (v.x == best && 4 * i < bi)) { best = v.x; bi = 4 * i; }\n"
    "            if (v.y > best || (v.y == best && 4 * i + 1 < bi)) { best = v.y; bi = 4 * i + 1; }\n"
    "            if (v.z > best || (v.z == best && 4 * i + 2 < bi)) { best = v.z; bi = 4 * i + 2; }\n"
    "            if (v.w > best || (v.w == best && 4 * i + 3 < bi)) { best = v.w; bi = 4 * i + 3; }\n"
    "        }\n"
    "    } else {\n"
    "        for (int i = threadIdx.x; i < V; i += NT) {\n"
    "            float v = row[i];\n"
    "            bad |= nonfinite(v);\n"
    "            if (v > best || (v == best && i < bi)) { best = v; bi = i; }\n"
    "        }\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int o = 16; o > 0; o >>= 1) {\n"
    "        float ov = __shfl_xor_sync(0xffffffffu, best, o);\n"
    "        int oi = __shfl_xor_sync(0xffffffffu, bi, o);\n"
    "        if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }\n"
    "    }\n"
    "    __shared__ float s_v[NT / 32];\n"
    "    __shared__ int s_i[NT / 32];\n"
    "    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n"
    "    if (lane == 0) { s_v[warp] = best; s_i[warp] = bi; }\n"
    "    const int row_bad = __syncthreads_or(bad);\n"
    "    if (warp == 0) {\n"
    "        best = lane < NT / 32 ? s_v[lane] : MOEC_NEG_INF;\n"
    "        bi = lane < NT / 32 ? s_i[lane] : V;\n"
    "#pragma unroll\n"
    "        for (int o = 16; o > 0; o >>= 1) {\n"
    "            float ov = __shfl_xor_sync(0xffffffffu, best, o);\n"
    "            int oi = __shfl_xor_sync(0xffffffffu, bi, o);\n"
    "            if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }\n"
    "        }\n"
    "        /* a row of finite values always has an id: every one beats -inf */\n"
    "        if (lane == 0)\n"
    "            sampled[blockIdx.x] = row_bad ? NONFINITE_ID : bi;\n"
    "    }\n";

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
    char name[96];
    snprintf(name, sizeof name, "argmax_v%lld_t%d", V, c->T);
    int is_new = 0;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "argmax of %%%s: no memory", logits->name);
    if (is_new) {
        moec_buf_printf(&c->src,
                      "// argmax: greedy token per row, ties to the lower index (codegen/argmax.c, "
                      "cg_emit_argmax)\n"
                      "extern \"C\" __global__ void __launch_bounds__(%d) %s(const float *__restrict__ "
                      "logits, int *__restrict__ sampled)\n{\n"
                      "    constexpr int V = %lld, NT = %d;\n"
                      "    constexpr int NONFINITE_ID = %d;\n",
                      nt, name, V, nt, IR_SAMPLED_NONFINITE);
        moec_buf_printf(&c->src, "%s}\n\n", ARGMAX_BODY);
    }
    ir_step *s = cg_step(c, IR_STEP_KERNEL, logits->def);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "argmax of %%%s: no memory", logits->name);
    s->kernel = k;
    s->grid[0] = (unsigned)c->T;
    s->block[0] = (unsigned)nt;
    s->n_args = 2;
    s->args[0] = cg_arg_act(logits);
    s->args[1] = cg_arg_input(IR_INPUT_SAMPLED);
    return MOEC_OK;
}
