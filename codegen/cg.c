/* cg.c — the code generator's shared machinery (cg.h): the text buffer, the
 * per-bucket kernel and step tables every emitter appends to, symbolic
 * launch arguments, storage dtypes, the prologue every generated program
 * starts with, and the dispatch from op kind to its emitter. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cg.h"
#include "err.h"

#ifndef MOEC_CUDA_ARCH_DEFAULT
#define MOEC_CUDA_ARCH_DEFAULT "sm_90"
#endif

void cg_options_default(cg_options *o)
{
    memset(o, 0, sizeof *o);
    o->compute_dtype = IR_DTYPE_BF16;
    snprintf(o->arch, sizeof o->arch, "%s", MOEC_CUDA_ARCH_DEFAULT);
    o->kv_block_size = 64;
    o->n_buckets = ir_buckets_default(o->buckets);
    o->fp8_tiles = cg_env_int("MOEC_FP8_TILES", IR_FP8_TILES_GATE_UP | IR_FP8_TILES_LINEAR, 0,
                              IR_FP8_TILES_MAX);
}

int cg_kernel(cg_ctx *c, const char *name, int *is_new)
{
    for (int i = 0; i < c->n_kernels; i++)
        if (!strcmp(c->kernel_names[i], name)) {
            *is_new = 0;
            return i;
        }
    if (c->n_kernels == c->kernels_cap) {
        int cap = c->kernels_cap ? 2 * c->kernels_cap : 32;
        char **p = realloc(c->kernel_names, sizeof *p * (size_t)cap);
        if (!p)
            return -1;
        c->kernel_names = p;
        c->kernels_cap = cap;
    }
    char *copy = strdup(name);
    if (!copy)
        return -1;
    c->kernel_names[c->n_kernels] = copy;
    *is_new = 1;
    return c->n_kernels++;
}

ir_step *cg_step(cg_ctx *c, ir_step_kind kind, const ir_op *op)
{
    if (c->n_steps == c->steps_cap) {
        int cap = c->steps_cap ? 2 * c->steps_cap : 128;
        ir_step *p = realloc(c->steps, sizeof *p * (size_t)cap);
        if (!p)
            return NULL;
        c->steps = p;
        c->steps_cap = cap;
    }
    ir_step *s = &c->steps[c->n_steps++];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->stream = op ? op->stream : 0;
    s->op_id = op ? op->id : -1;
    s->kernel = -1;
    for (int i = 0; i < 3; i++)
        s->grid[i] = s->block[i] = 1;
    return s;
}

size_t cg_scratch(cg_ctx *c, size_t bytes)
{
    int s = c->stream == 1;
    size_t off = (c->scratch_cur[s] + 15) / 16 * 16;
    c->scratch_cur[s] = off + bytes;
    if (c->scratch_cur[s] > c->scratch_max[s])
        c->scratch_max[s] = c->scratch_cur[s];
    c->scratch_bytes = c->scratch_max[1] ? (c->scratch_max[0] + 15) / 16 * 16 + c->scratch_max[1]
                                         : c->scratch_max[0];
    return off;
}

void cg_scratch_place_streams(cg_ctx *c)
{
    size_t base = (c->scratch_max[0] + 15) / 16 * 16;
    for (int i = 0; i < c->n_steps; i++) {
        ir_step *s = &c->steps[i];
        if (s->stream != 1)
            continue;
        for (int a = 0; a < s->n_args; a++)
            if (s->args[a].kind == IR_ARG_SCRATCH)
                s->args[a].i += (int64_t)base;
        if (s->kind == IR_STEP_GEMM) {
            /* a GEMM's operands may be scratch too (the act linear's input) */
            ir_arg *g[4] = {&s->gemm.a, &s->gemm.b, &s->gemm.c, &s->gemm.bias};
            for (int k = 0; k < 4; k++)
                if (g[k]->kind == IR_ARG_SCRATCH)
                    g[k]->i += (int64_t)base;
        }
    }
}

/* Operands may be module inputs (the step inputs) or weights as well as
 * activations: each becomes the argument kind that locates it. */
ir_arg cg_arg_act(const ir_value *v)
{
    if (v->kind == IR_VALUE_WEIGHT)
        return cg_arg_weight(v);
    if (v->kind == IR_VALUE_INPUT && !strcmp(v->name, "tokens"))
        return cg_arg_input(IR_INPUT_TOKENS);
    if (v->kind == IR_VALUE_INPUT && !strcmp(v->name, "positions"))
        return cg_arg_input(IR_INPUT_POSITIONS);
    ir_arg a = {IR_ARG_ACT, v->id, 0, 0};
    return a;
}

ir_arg cg_arg_weight(const ir_value *v)
{
    ir_arg a = {IR_ARG_WEIGHT, v->id, 0, 0};
    return a;
}

ir_arg cg_arg_scales(const ir_value *w)
{
    ir_arg a = {IR_ARG_WEIGHT, w->id, (int64_t)ir_weight_scale_offset(w), 0};
    return a;
}

ir_arg cg_arg_kv(const ir_op *attention_op, int pool)
{
    ir_arg a = {IR_ARG_KV, attention_op->id, pool, 0};
    return a;
}

int cg_read_after(const ir_module *m, const ir_value *v, int op_id)
{
    for (int i = 0; i < m->n_outputs; i++)
        if (m->outputs[i] == v)
            return 1;
    for (int k = op_id + 1; k < m->n_ops; k++)
        for (int i = 0; i < m->ops[k]->n_in; i++)
            if (m->ops[k]->in[i] == v)
                return 1;
    return 0;
}

int cg_acts_overlap(const cg_ctx *c, const ir_value *a, const ir_value *b)
{
    if (a->kind != IR_VALUE_OP || b->kind != IR_VALUE_OP || a->mem_offset < 0 || b->mem_offset < 0)
        return 0;
    int64_t na = ir_type_numel(&a->type, 1) * (int64_t)ir_dtype_size(cg_storage(c, a)),
            nb = ir_type_numel(&b->type, 1) * (int64_t)ir_dtype_size(cg_storage(c, b));
    return a->mem_offset < b->mem_offset + nb && b->mem_offset < a->mem_offset + na;
}

const ir_op *cg_cache_reader(const ir_module *m, const ir_op *pro, ir_op_kind kind, int first,
                             const ir_value *a, const ir_value *b)
{
    const ir_op *found = NULL;
    for (int i = pro->id + 1; i < m->n_ops; i++) {
        const ir_op *op = m->ops[i];
        if (op->kind != kind || op->n_in <= first + (b != NULL) || op->in[first] != a ||
            (b && op->in[first + 1] != b))
            continue;
        if (found || op->stream != pro->stream)
            return NULL;
        found = op;
    }
    return found;
}

void cg_step_cache_args(ir_step *s, const ir_op *att, int n_pools)
{
    s->args[s->n_args++] = cg_arg_input(IR_INPUT_POSITIONS);
    s->args[s->n_args++] = cg_arg_input(IR_INPUT_SLOTS);
    s->args[s->n_args++] = cg_arg_input(IR_INPUT_BLOCK_TABLE);
    s->args[s->n_args++] = cg_arg_config(IR_CONFIG_MAX_BLOCKS);
    for (int i = 0; i < n_pools; i++)
        s->args[s->n_args++] = cg_arg_kv(att, i);
}

void cg_cache_params(moec_buf *b, const char *pool_type, const char *const *pools, int n_pools)
{
    moec_buf_printf(b, ", const int *__restrict__ positions, const int *__restrict__ slots, "
                       "const int *__restrict__ block_table, int max_blocks");
    for (int i = 0; i < n_pools; i++)
        moec_buf_printf(b, ", %s *__restrict__ %s", pool_type, pools[i]);
}

void cg_cache_none(moec_buf *b, const char *pool_type, const char *const *pools, int n_pools)
{
    moec_buf_printf(b, "    const int *positions = nullptr, *slots = nullptr, *block_table = "
                       "nullptr;\n    const int max_blocks = 0;\n"
                       "    (void)positions;\n    (void)slots;\n    (void)block_table;\n"
                       "    (void)max_blocks;\n");
    for (int i = 0; i < n_pools; i++)
        moec_buf_printf(b, "    %s *%s = nullptr;\n    (void)%s;\n", pool_type, pools[i],
                        pools[i]);
}

ir_arg cg_arg_input(ir_input which)
{
    ir_arg a = {IR_ARG_INPUT, (int)which, 0, 0};
    return a;
}

ir_arg cg_arg_config(ir_config which)
{
    ir_arg a = {IR_ARG_CONFIG, (int)which, 0, 0};
    return a;
}

ir_arg cg_arg_scratch(size_t offset)
{
    ir_arg a = {IR_ARG_SCRATCH, 0, (int64_t)offset, 0};
    return a;
}

ir_arg cg_arg_i32(int64_t v)
{
    ir_arg a = {IR_ARG_I32, 0, v, 0};
    return a;
}

ir_arg cg_arg_f32(double v)
{
    ir_arg a = {IR_ARG_F32, 0, 0, v};
    return a;
}

ir_dtype cg_storage(const cg_ctx *c, const ir_value *v)
{
    return ir_value_storage_dtype(c->m, v, c->opt->compute_dtype);
}

const char *cg_ctype(ir_dtype dt)
{
    switch (dt) {
    case IR_DTYPE_F32: return "float";
    case IR_DTYPE_BF16: return "__nv_bfloat16";
    case IR_DTYPE_F16: return "__half";
    case IR_DTYPE_I32: return "int";
    case IR_DTYPE_F8E4M3: return "__nv_fp8_e4m3";
    case IR_DTYPE_COUNT: break;
    }
    return "void";
}

/* The helpers every kernel may use. ld/st convert one element to and from
 * fp32; ldv/stv move N consecutive elements with the widest aligned loads
 * (16 bytes when N * sizeof(T) allows: callers guarantee the alignment;
 * fp8 codes widened four at a time);
 * cpv copies N elements, bit for bit when the types agree. Block
 * reductions need blockDim.x to be a multiple of 32. */
static const char PROLOGUE[] =
    "// moec generated CUDA C: prologue (codegen/cg.c), then one kernel per specialization\n"
    "#include <cuda_bf16.h>\n"
    "#include <cuda_fp16.h>\n"
    "#include <cuda_fp8.h>\n"
    "\n"
    "#define MOEC_NEG_INF __int_as_float(0xff800000)\n"
    "#define MOEC_LN2 0.6931471805599453f\n"
    "#define MOEC_LOG2E 1.4426950408889634f\n"
    "\n"
    "/* 2^x by the special function unit alone (ex2.approx.ftz: about 2 ulp,\n"
    "   subnormal results flushed to 0): softmax weights rounded to bf16 after */\n"
    "__device__ __forceinline__ float moec_ex2(float x)\n"
    "{\n"
    "    float y;\n"
    "    asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(y) : \"f\"(x));\n"
    "    return y;\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ float ld(const float *p) { return *p; }\n"
    "__device__ __forceinline__ float ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }\n"
    "__device__ __forceinline__ float ld(const __half *p) { return __half2float(*p); }\n"
    "__device__ __forceinline__ float ld(const __nv_fp8_e4m3 *p) { return float(*p); }\n"
    "__device__ __forceinline__ void st(float *p, float v) { *p = v; }\n"
    "__device__ __forceinline__ void st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16(v); }\n"
    "__device__ __forceinline__ void st(__half *p, float v) { *p = __float2half(v); }\n"
    "\n"
    "template <typename W, int N, typename T>\n"
    "__device__ __forceinline__ void moec_ldw(const T *p, float *v)\n"
    "{\n"
    "    constexpr int E = (int)(sizeof(W) / sizeof(T));\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < N / E; i++) {\n"
    "        W w = reinterpret_cast<const W *>(p)[i];\n"
    "        const T *e = reinterpret_cast<const T *>(&w);\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < E; j++)\n"
    "            v[i * E + j] = ld(e + j);\n"
    "    }\n"
    "}\n"
    "\n"
    "template <typename W, int N, typename T>\n"
    "__device__ __forceinline__ void moec_stw(T *p, const float *v)\n"
    "{\n"
    "    constexpr int E = (int)(sizeof(W) / sizeof(T));\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < N / E; i++) {\n"
    "        W w;\n"
    "        T *e = reinterpret_cast<T *>(&w);\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < E; j++)\n"
    "            st(e + j, v[i * E + j]);\n"
    "        reinterpret_cast<W *>(p)[i] = w;\n"
    "    }\n"
    "}\n"
    "\n"
    "template <typename W, int N, typename T>\n"
    "__device__ __forceinline__ void moec_cpw(T *y, const T *x)\n"
    "{\n"
    "    constexpr int E = (int)(sizeof(W) / sizeof(T));\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < N / E; i++)\n"
    "        reinterpret_cast<W *>(y)[i] = reinterpret_cast<const W *>(x)[i];\n"
    "}\n"
    "\n"
    "template <int N, typename T> __device__ __forceinline__ void ldv(const T *p, float *v)\n"
    "{\n"
    "    constexpr int B = N * (int)sizeof(T);\n"
    "    if constexpr (B % 16 == 0) moec_ldw<uint4, N>(p, v);\n"
    "    else if constexpr (B % 8 == 0) moec_ldw<uint2, N>(p, v);\n"
    "    else if constexpr (B % 4 == 0 && sizeof(T) <= 4) moec_ldw<unsigned int, N>(p, v);\n"
    "    else moec_ldw<T, N>(p, v);\n"
    "}\n"
    "\n"
    "/* N elements of h = silu(gate) * up from gate at g and up at u, each rounded to\n"
    "   TH as the silu_mul kernel stores its result (the few-token linear's act) */\n"
    "template <int N, typename TH, typename T>\n"
    "__device__ __forceinline__ void ldv_silu_mul(const T *g, const T *u, float *v)\n"
    "{\n"
    "    float uv[N];\n"
    "    ldv<N>(g, v);\n"
    "    ldv<N>(u, uv);\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < N; j++) {\n"
    "        TH hq;\n"
    "        st(&hq, v[j] / (1.0f + expf(-v[j])) * uv[j]);\n"
    "        v[j] = ld(&hq);\n"
    "    }\n"
    "}\n"
    "\n"
    "/* The element offset of (row n, column k) of a weight of KD columns: row-major,\n"
    "   or with TL in fragment tiles (ir/ir_plan.h, ir_tile_offset: 16-row tiles, 64-wide\n"
    "   chunks of 1 KiB, lane (g, q)'s 16 codes of rows g and g + 8 at k 16q in lane\n"
    "   order), where the 16 codes from a multiple of 16 lie together */\n"
    "template <bool TL, long long KD>\n"
    "__device__ __forceinline__ long long moec_woff(long long n, long long k)\n"
    "{\n"
    "    if constexpr (TL)\n"
    "        return (n >> 4) * 16 * KD + (k >> 6) * 1024 + ((n >> 3) & 1) * 512 +\n"
    "               ((n & 7) * 4 + ((k >> 4) & 3)) * 16 + (k & 15);\n"
    "    else\n"
    "        return n * KD + k;\n"
    "}\n"
    "\n"
    "/* fp8 weights (e4m3, exact in fp16 and in fp32): four codes of a word at a time */\n"
    "__device__ __forceinline__ void moec_e4m3x4(unsigned c, float *v)\n"
    "{\n"
    "    const float2 a = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(c & 0xffffu), __NV_E4M3)));\n"
    "    const float2 b = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(c >> 16), __NV_E4M3)));\n"
    "    v[0] = a.x;\n"
    "    v[1] = a.y;\n"
    "    v[2] = b.x;\n"
    "    v[3] = b.y;\n"
    "}\n"
    "\n"
    "template <int N> __device__ __forceinline__ void ldv(const __nv_fp8_e4m3 *p, float *v)\n"
    "{\n"
    "    if constexpr (N % 16 == 0) {\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < N / 16; i++) {\n"
    "            const uint4 w = reinterpret_cast<const uint4 *>(p)[i];\n"
    "            moec_e4m3x4(w.x, v + 16 * i);\n"
    "            moec_e4m3x4(w.y, v + 16 * i + 4);\n"
    "            moec_e4m3x4(w.z, v + 16 * i + 8);\n"
    "            moec_e4m3x4(w.w, v + 16 * i + 12);\n"
    "        }\n"
    "    } else if constexpr (N % 8 == 0) {\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < N / 8; i++) {\n"
    "            const uint2 w = reinterpret_cast<const uint2 *>(p)[i];\n"
    "            moec_e4m3x4(w.x, v + 8 * i);\n"
    "            moec_e4m3x4(w.y, v + 8 * i + 4);\n"
    "        }\n"
    "    } else if constexpr (N % 4 == 0) {\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < N / 4; i++)\n"
    "            moec_e4m3x4(reinterpret_cast<const unsigned *>(p)[i], v + 4 * i);\n"
    "    } else {\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < N; i++)\n"
    "            v[i] = ld(p + i);\n"
    "    }\n"
    "}\n"
    "\n"
    "template <int N, typename T> __device__ __forceinline__ void stv(T *p, const float *v)\n"
    "{\n"
    "    constexpr int B = N * (int)sizeof(T);\n"
    "    if constexpr (B % 16 == 0) moec_stw<uint4, N>(p, v);\n"
    "    else if constexpr (B % 8 == 0) moec_stw<uint2, N>(p, v);\n"
    "    else if constexpr (B % 4 == 0 && sizeof(T) <= 4) moec_stw<unsigned int, N>(p, v);\n"
    "    else moec_stw<T, N>(p, v);\n"
    "}\n"
    "\n"
    "template <int N, typename T> __device__ __forceinline__ void cpv(T *y, const T *x)\n"
    "{\n"
    "    constexpr int B = N * (int)sizeof(T);\n"
    "    if constexpr (B % 16 == 0) moec_cpw<uint4, N>(y, x);\n"
    "    else if constexpr (B % 8 == 0) moec_cpw<uint2, N>(y, x);\n"
    "    else if constexpr (B % 4 == 0 && sizeof(T) <= 4) moec_cpw<unsigned int, N>(y, x);\n"
    "    else moec_cpw<T, N>(y, x);\n"
    "}\n"
    "\n"
    "template <int N, typename To, typename Ti> __device__ __forceinline__ void cpv(To *y, const Ti *x)\n"
    "{\n"
    "    float v[N];\n"
    "    ldv<N>(x, v);\n"
    "    stv<N>(y, v);\n"
    "}\n"
    "\n"
    "/* c += a b: one m16n8k16 tensor-core product, bf16 in, fp32 accumulators\n"
    "   (a: 4 registers of the 16x16 row-major tile, b: 2 of the 16x8 column-major\n"
    "   tile, c: 4 of the 16x8 result, in the PTX ISA's fragment layouts) */\n"
    "__device__ __forceinline__ void moec_mma_bf16(float *c, unsigned a0, unsigned a1, unsigned a2,\n"
    "                                              unsigned a3, unsigned b0, unsigned b1)\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, \"\n"
    "                 \"{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\\n\"\n"
    "                 : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3])\n"
    "                 : \"r\"(a0), \"r\"(a1), \"r\"(a2), \"r\"(a3), \"r\"(b0), \"r\"(b1));\n"
    "#endif\n"
    "}\n"
    "\n"
    "/* ldmatrix: N (2 or 4) 8x8 bf16 matrices of shared memory into r, in the\n"
    "   fragment layout of moec_mma_bf16's operands (T: each transposed); lanes\n"
    "   8m .. 8m + 7 give the addresses of matrix m's rows, 16-byte aligned\n"
    "   (moec_ldmatrix_s: as shared-window addresses) */\n"
    "template <int N, bool T>\n"
    "__device__ __forceinline__ void moec_ldmatrix_s(unsigned *r, unsigned a)\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    static_assert(N == 2 || N == 4, \"two or four matrices\");\n"
    "    if constexpr (N == 4 && T)\n"
    "        asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\\n\"\n"
    "                     : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(a));\n"
    "    else if constexpr (N == 4)\n"
    "        asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\\n\"\n"
    "                     : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(a));\n"
    "    else if constexpr (T)\n"
    "        asm volatile(\"ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\\n\"\n"
    "                     : \"=r\"(r[0]), \"=r\"(r[1]) : \"r\"(a));\n"
    "    else\n"
    "        asm volatile(\"ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\\n\"\n"
    "                     : \"=r\"(r[0]), \"=r\"(r[1]) : \"r\"(a));\n"
    "#endif\n"
    "}\n"
    "\n"
    "template <int N, bool T>\n"
    "__device__ __forceinline__ void moec_ldmatrix(unsigned *r, const __nv_bfloat16 *p)\n"
    "{\n"
    "    moec_ldmatrix_s<N, T>(r, (unsigned)__cvta_generic_to_shared(p));\n"
    "}\n"
    "\n"
    "/* The gate_up GEMMs' end on tensor cores: h = silu(gate) * up from a 16-row\n"
    "   tile's fragments of gate (ag) and up (au) for 8 slots (slots: their ids,\n"
    "   padding -1, skipped): fragments 0, 1 are row n0 + g, slots 2q and 2q + 1\n"
    "   of lane (g, q); 2, 3 row n0 + g + 8 */\n"
    "template <typename TH>\n"
    "__device__ __forceinline__ void moec_silu_mul_frag(TH *hbuf, const int *slots, long long nd,\n"
    "                                                   int n0, const float *ag, const float *au)\n"
    "{\n"
    "    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < 2; j++) {\n"
    "        const int slot = slots[2 * q + j];\n"
    "        if (slot < 0)\n"
    "            continue;\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < 2; r++) {\n"
    "            const float gv = ag[2 * r + j], uv = au[2 * r + j];\n"
    "            st(hbuf + slot * nd + n0 + g + 8 * r, gv / (1.0f + expf(-gv)) * uv);\n"
    "        }\n"
    "    }\n"
    "}\n"
    "\n"
    "/* The down GEMMs' end on tensor cores: y rows of 8 slots from a 16-row tile's\n"
    "   fragments (as moec_silu_mul_frag's, rows from row0), each times scale and\n"
    "   its slot's router weight when MULW */\n"
    "template <bool MULW, typename TY, typename TW>\n"
    "__device__ __forceinline__ void moec_down_frag(TY *y, const int *slots, long long nd,\n"
    "                                               long long row0, const float *acc, float scale,\n"
    "                                               const TW *wts)\n"
    "{\n"
    "    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < 2; j++) {\n"
    "        const int slot = slots[2 * q + j];\n"
    "        if (slot < 0)\n"
    "            continue;\n"
    "        const float f = MULW ? scale * ld(wts + slot) : 1.0f;\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < 2; r++)\n"
    "            st(y + slot * nd + row0 + g + 8 * r, acc[2 * r + j] * f);\n"
    "    }\n"
    "}\n"
    "\n"
    "/* two floats as a bf16 pair (round to nearest even), a in the low half */\n"
    "__device__ __forceinline__ unsigned moec_pack_bf16(float a, float b)\n"
    "{\n"
    "    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);\n"
    "    return *reinterpret_cast<const unsigned *>(&v);\n"
    "}\n"
    "\n"
    "/* 8 consecutive weights as the 4 bf16 pairs of a tensor-core fragment: bf16\n"
    "   weights as they are, fp8 (e4m3) codes widened exactly */\n"
    "__device__ __forceinline__ uint4 moec_ld8(const __nv_bfloat16 *p)\n"
    "{\n"
    "    return *reinterpret_cast<const uint4 *>(p);\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ uint4 moec_ld8(const __nv_fp8_e4m3 *p)\n"
    "{\n"
    "    const uint2 c = *reinterpret_cast<const uint2 *>(p);\n"
    "    float f[8];\n"
    "    moec_e4m3x4(c.x, f);\n"
    "    moec_e4m3x4(c.y, f + 4);\n"
    "    return make_uint4(moec_pack_bf16(f[0], f[1]), moec_pack_bf16(f[2], f[3]),\n"
    "                      moec_pack_bf16(f[4], f[5]), moec_pack_bf16(f[6], f[7]));\n"
    "}\n"
    "\n"
    "/* fp8 weights on tensor cores with the activations staged in shared memory\n"
    "   (codegen/fp8_tc.h). moec_e4m3x4_bf16: 4 e4m3 codes (a word, code 0 the\n"
    "   lowest byte) widened exactly to 2 bf16 pairs, lo holding codes 0 and 1, hi\n"
    "   2 and 3, with integer and bf16x2 operations only (no conversion unit): a\n"
    "   code's sign, exponent and mantissa bits moved to where bf16 keeps them are\n"
    "   a bf16 of its value times 2^-120 (a subnormal code a bf16 subnormal), and\n"
    "   times 2^120 (fma with -0, subnormals kept) the value. The NaN codes 0x7f\n"
    "   and 0xff, which quantizers never write, widen to +-480. */\n"
    "__device__ __forceinline__ unsigned moec_bf16x2_exp120(unsigned v)\n"
    "{\n"
    "    unsigned r = 0;\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    asm(\"fma.rn.bf16x2 %0, %1, %2, %3;\" : \"=r\"(r) : \"r\"(v), \"r\"(0x7b807b80u), \"r\"(0x80008000u));\n"
    "#endif\n"
    "    return r;\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ void moec_e4m3x4_bf16(unsigned w, unsigned &lo, unsigned &hi)\n"
    "{\n"
    "    const unsigned a = __byte_perm(w, 0u, 0x1404), b = __byte_perm(w, 0u, 0x3424);\n"
    "    lo = moec_bf16x2_exp120((a & 0x80008000u) | ((a >> 4) & 0x07f007f0u));\n"
    "    hi = moec_bf16x2_exp120((b & 0x80008000u) | ((b >> 4) & 0x07f007f0u));\n"
    "}\n"
    "\n"
    "/* 16 bytes of a weight stream (read once: not kept in L1) */\n"
    "__device__ __forceinline__ uint4 moec_ldg16(const void *p)\n"
    "{\n"
    "    uint4 v;\n"
    "    asm(\"ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\"\n"
    "        : \"=r\"(v.x), \"=r\"(v.y), \"=r\"(v.z), \"=r\"(v.w) : \"l\"(p));\n"
    "    return v;\n"
    "}\n"
    "\n"
    "/* The 16 bytes of a weight vector (moec_ldg16) widened to fp32, the last\n"
    "   argument naming the element type: 4 f32, 8 bf16 (a shift or a mask\n"
    "   each), 8 f16, or 16 e4m3 codes (moec_e4m3x4_bf16, then bf16 to fp32:\n"
    "   integer and bf16x2 operations, no conversion unit; sm_80 and later) */\n"
    "__device__ __forceinline__ void moec_w16(const uint4 &w, float *v, const float *)\n"
    "{\n"
    "    v[0] = __uint_as_float(w.x);\n"
    "    v[1] = __uint_as_float(w.y);\n"
    "    v[2] = __uint_as_float(w.z);\n"
    "    v[3] = __uint_as_float(w.w);\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ void moec_w16(const uint4 &w, float *v, const __nv_bfloat16 *)\n"
    "{\n"
    "    const unsigned u[4] = {w.x, w.y, w.z, w.w};\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < 4; i++) {\n"
    "        v[2 * i] = __uint_as_float(u[i] << 16);\n"
    "        v[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);\n"
    "    }\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ void moec_w16(const uint4 &w, float *v, const __half *)\n"
    "{\n"
    "    const unsigned u[4] = {w.x, w.y, w.z, w.w};\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < 4; i++) {\n"
    "        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&u[i]));\n"
    "        v[2 * i] = f.x;\n"
    "        v[2 * i + 1] = f.y;\n"
    "    }\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ void moec_w16(const uint4 &w, float *v, const __nv_fp8_e4m3 *)\n"
    "{\n"
    "    const unsigned u[4] = {w.x, w.y, w.z, w.w};\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < 4; i++) {\n"
    "        unsigned lo, hi;\n"
    "        moec_e4m3x4_bf16(u[i], lo, hi);\n"
    "        v[4 * i] = __uint_as_float(lo << 16);\n"
    "        v[4 * i + 1] = __uint_as_float(lo & 0xffff0000u);\n"
    "        v[4 * i + 2] = __uint_as_float(hi << 16);\n"
    "        v[4 * i + 3] = __uint_as_float(hi & 0xffff0000u);\n"
    "    }\n"
    "}\n"
    "\n"
    "/* moec_w16, with CVT the e4m3 codes widened by the conversion unit (cvt to\n"
    "   f16 pairs, then to fp32: exact; sm_89 and later, where the codegen asks\n"
    "   for it) */\n"
    "template <bool CVT, typename T>\n"
    "__device__ __forceinline__ void moec_w16v(const uint4 &w, float *v, const T *t)\n"
    "{\n"
    "    moec_w16(w, v, t);\n"
    "}\n"
    "\n"
    "template <>\n"
    "__device__ __forceinline__ void moec_w16v<true, __nv_fp8_e4m3>(const uint4 &w, float *v, const __nv_fp8_e4m3 *)\n"
    "{\n"
    "    moec_e4m3x4(w.x, v);\n"
    "    moec_e4m3x4(w.y, v + 4);\n"
    "    moec_e4m3x4(w.z, v + 8);\n"
    "    moec_e4m3x4(w.w, v + 12);\n"
    "}\n"
    "\n"
    "/* h = silu(gate) * up of 8 bf16 elements (16 bytes of each), rounded to\n"
    "   bf16 as the silu_mul kernel stores it */\n"
    "__device__ __forceinline__ uint4 moec_silu_mul8(const uint4 &g, const uint4 &u)\n"
    "{\n"
    "    float gf[8], uf[8];\n"
    "    moec_w16(g, gf, static_cast<const __nv_bfloat16 *>(nullptr));\n"
    "    moec_w16(u, uf, static_cast<const __nv_bfloat16 *>(nullptr));\n"
    "    unsigned hp[4];\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < 4; j++)\n"
    "        hp[j] = moec_pack_bf16(gf[2 * j] / (1.0f + expf(-gf[2 * j])) * uf[2 * j],\n"
    "                               gf[2 * j + 1] / (1.0f + expf(-gf[2 * j + 1])) * uf[2 * j + 1]);\n"
    "    return make_uint4(hp[0], hp[1], hp[2], hp[3]);\n"
    "}\n"
    "\n"
    "/* 16 bytes from global to shared memory without registers (cp.async), or 16\n"
    "   zero bytes when !valid (nothing read); moec_cp_wait: this thread's copies\n"
    "   landed (a barrier then shows them to the block) */\n"
    "__device__ __forceinline__ void moec_cp16(void *s, const void *g, bool valid)\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    const unsigned a = (unsigned)__cvta_generic_to_shared(s);\n"
    "    asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\\n\" ::\"r\"(a), \"l\"(g),\n"
    "                 \"r\"(valid ? 16 : 0) : \"memory\");\n"
    "#endif\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ void moec_cp_wait()\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    asm volatile(\"cp.async.wait_all;\\n\" ::: \"memory\");\n"
    "#endif\n"
    "}\n"
    "\n"
    "/* cp.async groups: moec_cp_commit closes this thread's copies issued since\n"
    "   the last one into a group; moec_cp_wait_group<N> waits until at most N of\n"
    "   its groups are still in flight */\n"
    "__device__ __forceinline__ void moec_cp_commit()\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    asm volatile(\"cp.async.commit_group;\\n\" ::: \"memory\");\n"
    "#endif\n"
    "}\n"
    "\n"
    "template <int N> __device__ __forceinline__ void moec_cp_wait_group()\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    asm volatile(\"cp.async.wait_group %0;\\n\" ::\"n\"(N) : \"memory\");\n"
    "#endif\n"
    "}\n"
    "\n"
    "/* Bulk copies (sm_90's TMA, cp.async.bulk) into shared memory, completing on\n"
    "   an mbarrier: moec_mbar_init (count arrivals a phase; then\n"
    "   moec_mbar_init_fence and a barrier before any use), moec_bulk_g2s (n\n"
    "   bytes, 16-byte aligned, a multiple of 16) after moec_mbar_arrive_tx\n"
    "   announced the bytes and arrived, moec_mbar_arrive (no bytes),\n"
    "   moec_mbar_wait (until phase `parity` completed), moec_fence_async\n"
    "   (this thread's generic writes to shared memory ordered before later\n"
    "   bulk copies to it) */\n"
    "__device__ __forceinline__ unsigned moec_smem_addr(const void *p)\n"
    "{\n"
    "    return (unsigned)__cvta_generic_to_shared(p);\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ void moec_mbar_init(unsigned long long *bar, unsigned count)\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\\n\" ::\"r\"(moec_smem_addr(bar)),\n"
    "                 \"r\"(count) : \"memory\");\n"
    "#endif\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ void moec_mbar_init_fence()\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"fence.mbarrier_init.release.cluster;\\n\" ::: \"memory\");\n"
    "#endif\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ void moec_mbar_arrive_tx(unsigned long long *bar, unsigned bytes)\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n\" ::\"r\"(\n"
    "                     moec_smem_addr(bar)), \"r\"(bytes) : \"memory\");\n"
    "#endif\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ void moec_mbar_arrive(unsigned long long *bar)\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"mbarrier.arrive.shared::cta.b64 _, [%0];\\n\" ::\"r\"(moec_smem_addr(bar))\n"
    "                 : \"memory\");\n"
    "#endif\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ void moec_mbar_wait(unsigned long long *bar, unsigned parity)\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"{\\n\"\n"
    "                 \".reg .pred done;\\n\"\n"
    "                 \"MOEC_MBAR_WAIT_%=:\\n\"\n"
    "                 \"mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\\n\"\n"
    "                 \"@!done bra MOEC_MBAR_WAIT_%=;\\n\"\n"
    "                 \"}\\n\" ::\"r\"(moec_smem_addr(bar)), \"r\"(parity) : \"memory\");\n"
    "#endif\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ void moec_bulk_g2s(void *dst, const void *src, unsigned bytes,\n"
    "                                              unsigned long long *bar)\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], \"\n"
    "                 \"%2, [%3];\\n\" ::\"r\"(moec_smem_addr(dst)), \"l\"(src), \"r\"(bytes),\n"
    "                 \"r\"(moec_smem_addr(bar)) : \"memory\");\n"
    "#endif\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ void moec_fence_async()\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"fence.proxy.async.shared::cta;\\n\" ::: \"memory\");\n"
    "#endif\n"
    "}\n"
    "\n"
    "/* Thread block clusters (sm_90): every thread of every block of the cluster\n"
    "   arrives, the shared memory writes before it seen by the reads after it;\n"
    "   moec_ld_cluster reads p's float in the shared memory of the cluster's block\n"
    "   `rank`, moec_st_cluster writes 32 bits there (seen after the next sync) */\n"
    "__device__ __forceinline__ void moec_cluster_sync()\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"barrier.cluster.arrive.release.aligned;\\n\"\n"
    "                 \"barrier.cluster.wait.acquire.aligned;\\n\" ::: \"memory\");\n"
    "#endif\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ float moec_ld_cluster(const float *p, unsigned rank)\n"
    "{\n"
    "    float v = 0.0f;\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    const unsigned a = (unsigned)__cvta_generic_to_shared(p);\n"
    "    unsigned r;\n"
    "    asm volatile(\"mapa.shared::cluster.u32 %0, %1, %2;\\n\" : \"=r\"(r) : \"r\"(a), \"r\"(rank));\n"
    "    asm volatile(\"ld.shared::cluster.f32 %0, [%1];\\n\" : \"=f\"(v) : \"r\"(r) : \"memory\");\n"
    "#endif\n"
    "    return v;\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ void moec_st_cluster(void *p, unsigned bits, unsigned rank)\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    const unsigned a = (unsigned)__cvta_generic_to_shared(p);\n"
    "    unsigned r;\n"
    "    asm volatile(\"mapa.shared::cluster.u32 %0, %1, %2;\\n\" : \"=r\"(r) : \"r\"(a), \"r\"(rank));\n"
    "    asm volatile(\"st.shared::cluster.b32 [%0], %1;\\n\" ::\"r\"(r), \"r\"(bits) : \"memory\");\n"
    "#endif\n"
    "}\n"
    "\n"
    "/* x's 16 staged bf16 elements at p (shared memory) as 8 pairs */\n"
    "__device__ __forceinline__ void moec_x16(const __nv_bfloat16 *p, unsigned (&bw)[8])\n"
    "{\n"
    "    const uint4 b0 = *reinterpret_cast<const uint4 *>(p);\n"
    "    const uint4 b1 = *reinterpret_cast<const uint4 *>(p + 8);\n"
    "    bw[0] = b0.x, bw[1] = b0.y, bw[2] = b0.z, bw[3] = b0.w;\n"
    "    bw[4] = b1.x, bw[5] = b1.y, bw[6] = b1.z, bw[7] = b1.w;\n"
    "}\n"
    "\n"
    "/* acc[r][t] += tile r of 16 fp8 weight rows times token tile t of x over a\n"
    "   64-wide k chunk, times the tile's block scale sc[r], on m16n8k16 products.\n"
    "   Lane (g, q) holds in wa[r][0] and wa[r][1] the 16 codes of the tile's rows\n"
    "   g and g + 8 at k 16q .. 16q + 15 of the chunk, and xl points at x's token g\n"
    "   of tile 0 at the same k in shared memory (token rows XS elements apart).\n"
    "   The sum over k does not care how k is ordered as long as both operands\n"
    "   agree: product j takes each lane's word j of codes (k 16q + 4j .. + 3)\n"
    "   and x's elements there, the first pair for the fragments' k 2q, 2q + 1,\n"
    "   the second for 2q + 8, 2q + 9. */\n"
    "template <int RT, int NT, int XS>\n"
    "__device__ __forceinline__ void moec_tc_chunk(float (&acc)[RT][NT][4], const uint4 (&wa)[RT][2],\n"
    "                                              const float (&sc)[RT], const __nv_bfloat16 *xl)\n"
    "{\n"
    "    unsigned a[RT][4][4];\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < RT; r++) {\n"
    "        const unsigned w0[4] = {wa[r][0].x, wa[r][0].y, wa[r][0].z, wa[r][0].w};\n"
    "        const unsigned w1[4] = {wa[r][1].x, wa[r][1].y, wa[r][1].z, wa[r][1].w};\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < 4; j++) {\n"
    "            moec_e4m3x4_bf16(w0[j], a[r][j][0], a[r][j][2]);\n"
    "            moec_e4m3x4_bf16(w1[j], a[r][j][1], a[r][j][3]);\n"
    "        }\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int t = 0; t < NT; t++) {\n"
    "        unsigned bw[8];\n"
    "        moec_x16(xl + t * 8 * XS, bw);\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < RT; r++) {\n"
    "            float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < 4; j++)\n"
    "                moec_mma_bf16(p, a[r][j][0], a[r][j][1], a[r][j][2], a[r][j][3], bw[2 * j],\n"
    "                              bw[2 * j + 1]);\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < 4; i++)\n"
    "                acc[r][t][i] += sc[r] * p[i];\n"
    "        }\n"
    "    }\n"
    "}\n"
    "\n"
    "/* The same over 64 bf16 weights a row (no scale: sc unread): lane (g, q)\n"
    "   holds in wa[r][0..1] its row g at k 16q .. 16q + 15 (8 pairs) and in\n"
    "   wa[r][2..3] row g + 8; product j takes pairs 2j and 2j + 1 of each, in\n"
    "   the order moec_tc_chunk's fp8 form gives its widened codes. */\n"
    "template <int RT, int NT, int XS>\n"
    "__device__ __forceinline__ void moec_tc_chunk(float (&acc)[RT][NT][4], const uint4 (&wa)[RT][4],\n"
    "                                              const float (&)[RT], const __nv_bfloat16 *xl)\n"
    "{\n"
    "#pragma unroll\n"
    "    for (int t = 0; t < NT; t++) {\n"
    "        unsigned bw[8];\n"
    "        moec_x16(xl + t * 8 * XS, bw);\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < RT; r++) {\n"
    "            const unsigned w0[8] = {wa[r][0].x, wa[r][0].y, wa[r][0].z, wa[r][0].w,\n"
    "                                    wa[r][1].x, wa[r][1].y, wa[r][1].z, wa[r][1].w};\n"
    "            const unsigned w1[8] = {wa[r][2].x, wa[r][2].y, wa[r][2].z, wa[r][2].w,\n"
    "                                    wa[r][3].x, wa[r][3].y, wa[r][3].z, wa[r][3].w};\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < 4; j++)\n"
    "                moec_mma_bf16(acc[r][t], w0[2 * j], w1[2 * j], w0[2 * j + 1], w1[2 * j + 1],\n"
    "                              bw[2 * j], bw[2 * j + 1]);\n"
    "        }\n"
    "    }\n"
    "}\n"
    "\n"
    "/* Programmatic dependent launch (sm_90): every kernel first waits for the\n"
    "   kernel before it to finish and its writes to be visible, then lets the\n"
    "   next one be scheduled, so that the next launch overlaps this kernel's\n"
    "   run (moec_pdl_enter); moec_pdl_wait only waits, the next kernel then\n"
    "   launched as this one's blocks exit; without the launch attribute both\n"
    "   are no-ops. */\n"
    "__device__ __forceinline__ void moec_pdl_wait()\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"griddepcontrol.wait;\\n\" ::: \"memory\");\n"
    "#endif\n"
    "}\n"
    "\n"
    "/* The trigger alone, first thing in a kernel that MOEC_PDL_EARLY names: the\n"
    "   next kernel may then be scheduled while this one still waits (its own\n"
    "   wait still waits for this grid to complete). */\n"
    "__device__ __forceinline__ void moec_pdl_trigger()\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"griddepcontrol.launch_dependents;\\n\" ::: \"memory\");\n"
    "#endif\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ void moec_pdl_enter()\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"griddepcontrol.wait;\\n\" ::: \"memory\");\n"
    "    asm volatile(\"griddepcontrol.launch_dependents;\\n\" ::: \"memory\");\n"
    "#endif\n"
    "}\n"
    "\n"
    "/* Asks L2 for bytes bytes from p (sm_90's bulk prefetch; the 16-byte\n"
    "   aligned part of the range, at most 4 MiB at a time): what a kernel\n"
    "   issues for the weights it is about to stream, before its\n"
    "   moec_pdl_enter, while the kernel before it still runs. A hint only: it\n"
    "   neither waits nor faults, so only ranges the kernel reads itself. */\n"
    "__device__ __forceinline__ void moec_prefetch_l2(const void *p, unsigned long long bytes)\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    unsigned long long a = ((unsigned long long)p + 15ull) & ~15ull;\n"
    "    const unsigned long long e = ((unsigned long long)p + bytes) & ~15ull;\n"
    "    while (a < e) {\n"
    "        const unsigned n = (unsigned)(e - a < (4ull << 20) ? e - a : (4ull << 20));\n"
    "        unsigned long long g;\n"
    "        asm(\"cvta.to.global.u64 %0, %1;\" : \"=l\"(g) : \"l\"(a));\n"
    "        asm volatile(\"cp.async.bulk.prefetch.L2.global [%0], %1;\\n\" :: \"l\"(g), \"r\"(n) : \"memory\");\n"
    "        a += n;\n"
    "    }\n"
    "#endif\n"
    "}\n"
    "\n"
    "/* The L2 prefetch of a block's weight slice: rows rows of row_bytes bytes,\n"
    "   contiguous from p, at most cap bytes in all: the whole slice where it\n"
    "   fits, else the same first bytes of every row (the kernels' warps walk\n"
    "   a slice's rows together, columns in order). */\n"
    "__device__ __forceinline__ void moec_prefetch_rows(const void *p, long long rows,\n"
    "                                                   long long row_bytes, long long cap)\n"
    "{\n"
    "    if (rows <= 0 || row_bytes <= 0 || cap <= 0)\n"
    "        return;\n"
    "    if (rows * row_bytes <= cap) {\n"
    "        moec_prefetch_l2(p, (unsigned long long)(rows * row_bytes));\n"
    "        return;\n"
    "    }\n"
    "    const long long each = cap / rows < row_bytes ? cap / rows : row_bytes;\n"
    "    for (long long r = 0; r < rows && each > 0; r++)\n"
    "        moec_prefetch_l2(static_cast<const char *>(p) + r * row_bytes,\n"
    "                         (unsigned long long)each);\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ float warp_sum(float v)\n"
    "{\n"
    "#pragma unroll\n"
    "    for (int o = 16; o > 0; o >>= 1)\n"
    "        v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "    return v;\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ float warp_max(float v)\n"
    "{\n"
    "#pragma unroll\n"
    "    for (int o = 16; o > 0; o >>= 1)\n"
    "        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "    return v;\n"
    "}\n"
    "\n"
    "/* An int as a type: a generic lambda's constant argument, one variant of\n"
    "   a kernel's body each value (codegen/attention.c). */\n"
    "template <int N> struct moec_ic {\n"
    "    static constexpr int value = N;\n"
    "};\n"
    "\n"
    "/* The warp's arg-max: the index of the largest v over the lanes, ties to\n"
    "   the lower index; a lane without a candidate passes i = none (returned\n"
    "   only when no lane has one). v compares as a float (no NaN; -0 is read\n"
    "   as +0, its equal). Two warp reductions on sm_80 and later. */\n"
    "__device__ __forceinline__ int moec_warp_argmax(float v, int i, int none)\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    const unsigned b = __float_as_uint(v + 0.0f);\n"
    "    const unsigned key = i == none ? 0u : (b & 0x80000000u) ? ~b : b | 0x80000000u;\n"
    "    const unsigned mk = __reduce_max_sync(0xffffffffu, key);\n"
    "    return (int)__reduce_min_sync(0xffffffffu, key == mk ? (unsigned)i : (unsigned)none);\n"
    "#else\n"
    "#pragma unroll\n"
    "    for (int o = 16; o > 0; o >>= 1) {\n"
    "        const float ov = __shfl_xor_sync(0xffffffffu, v, o);\n"
    "        const int oi = __shfl_xor_sync(0xffffffffu, i, o);\n"
    "        if (oi != none && (i == none || ov > v || (ov == v && oi < i))) {\n"
    "            v = ov;\n"
    "            i = oi;\n"
    "        }\n"
    "    }\n"
    "    return i;\n"
    "#endif\n"
    "}\n"
    "\n"
    "template <bool MAX> __device__ __forceinline__ float moec_block_reduce(float v)\n"
    "{\n"
    "    __shared__ float part[32];\n"
    "    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n"
    "    const int n_warps = (blockDim.x + 31) >> 5;\n"
    "    const float none = MAX ? MOEC_NEG_INF : 0.0f;\n"
    "    v = MAX ? warp_max(v) : warp_sum(v);\n"
    "    __syncthreads();\n"
    "    if (lane == 0)\n"
    "        part[warp] = v;\n"
    "    __syncthreads();\n"
    "    if (warp == 0) {\n"
    "        v = lane < n_warps ? part[lane] : none;\n"
    "        v = MAX ? warp_max(v) : warp_sum(v);\n"
    "        if (lane == 0)\n"
    "            part[0] = v;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    return part[0];\n"
    "}\n"
    "\n"
    "/* The merge weights of the NSPLIT partial states of HB heads (m, l at\n"
    "   part_ml, from part), a warp a head: w[hh][z] = e^(m_z - M) for the\n"
    "   splits z < nz that hold positions, 0 for the rest up to NW, and\n"
    "   inv[hh] = 1 / sum_z l_z w_z; then the block's barrier. */\n"
    "template <int NSPLIT, int HB, int NW>\n"
    "__device__ __forceinline__ void moec_attn_merge_weights(const float *part_ml, long long part,\n"
    "                                                        float (*w)[NW], float *inv, int nz)\n"
    "{\n"
    "    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;\n"
    "    for (int hh = warp; hh < HB; hh += nw) {\n"
    "        const float *ml = part_ml + (part + (long long)hh * NSPLIT) * 2;\n"
    "        float mx = MOEC_NEG_INF;\n"
    "        for (int z = lane; z < nz; z += 32)\n"
    "            mx = fmaxf(mx, __ldcg(ml + 2 * z));\n"
    "        mx = warp_max(mx);\n"
    "        float l = 0.0f;\n"
    "        for (int z = lane; z < NW; z += 32) {\n"
    "            float wz = 0.0f;\n"
    "            if (z < nz) {\n"
    "                const float m = __ldcg(ml + 2 * z);\n"
    "                wz = m == MOEC_NEG_INF ? 0.0f : expf(m - mx);\n"
    "                l += wz * __ldcg(ml + 2 * z + 1);\n"
    "            }\n"
    "            w[hh][z] = wz;\n"
    "        }\n"
    "        l = warp_sum(l);\n"
    "        if (lane == 0)\n"
    "            inv[hh] = 1.0f / l;\n"
    "    }\n"
    "    __syncthreads();\n"
    "}\n"
    "\n"
    "/* The merge of split attention (codegen/attn_common.h), by a whole block:\n"
    "   the NSPLIT partial states of HB heads (m, l at part_ml, the\n"
    "   unnormalised output at part_o, indexed (token * H + head) * NSPLIT +\n"
    "   split, from part) into o [HB][D]: sum_z o_z e^(m_z - M) / sum_z l_z\n"
    "   e^(m_z - M). The weights first (a warp a head), then each thread a\n"
    "   vector of CV channels over the splits, eight splits' loads in flight\n"
    "   at a time; a split of weight 0 wrote no output (its slots may hold\n"
    "   anything) and is not read. With G > 1 the block (NT = G * HB * D / CV\n"
    "   threads) is G groups, group g taking splits g, g + G, ..., summed in\n"
    "   shared memory, so that one head's merge has G times the loads in\n"
    "   flight. Partial states are read through L2 (other blocks wrote them). */\n"
    "template <int NSPLIT, int HB, int D, int G, int NT, typename TO>\n"
    "__device__ __forceinline__ void moec_attn_merge(const float *part_ml, const float *part_o,\n"
    "                                                long long part, TO *o)\n"
    "{\n"
    "    constexpr int CV = D % 4 ? 1 : 4, NSPAD = (NSPLIT + 8 * G - 1) / (8 * G) * (8 * G);\n"
    "    static_assert(G == 1 || G * HB * (D / CV) == NT, \"a thread a vector in each group\");\n"
    "    __shared__ float merge_w[HB][NSPAD];\n"
    "    __shared__ float merge_inv[HB];\n"
    "    moec_attn_merge_weights<NSPLIT, HB, NSPAD>(part_ml, part, merge_w, merge_inv, NSPLIT);\n"
    "    /* splits g + G * (z0 + j) of vector i's head */\n"
    "    auto gather = [&](int i, int g, float (&a)[CV]) {\n"
    "        const int hh = i / D, c = i % D;\n"
    "        const float *po = part_o + (part + (long long)hh * NSPLIT) * D + c;\n"
    "#pragma unroll\n"
    "        for (int k = 0; k < CV; k++)\n"
    "            a[k] = 0.0f;\n"
    "        for (int z0 = 0; z0 < NSPAD / G; z0 += 8) {\n"
    "            float v[8][CV];\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < 8; j++) {\n"
    "                const int z = g + G * (z0 + j);\n"
    "                const bool use = merge_w[hh][z] != 0.0f;\n"
    "                if constexpr (CV == 4) {\n"
    "                    const float4 x = use ? __ldcg(reinterpret_cast<const float4 *>(po + (long long)z * D))\n"
    "                                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);\n"
    "                    v[j][0] = x.x;\n"
    "                    v[j][1] = x.y;\n"
    "                    v[j][2] = x.z;\n"
    "                    v[j][3] = x.w;\n"
    "                } else {\n"
    "                    v[j][0] = use ? __ldcg(po + (long long)z * D) : 0.0f;\n"
    "                }\n"
    "            }\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < 8; j++)\n"
    "#pragma unroll\n"
    "                for (int k = 0; k < CV; k++)\n"
    "                    a[k] += v[j][k] * merge_w[hh][g + G * (z0 + j)];\n"
    "        }\n"
    "    };\n"
    "    if constexpr (G == 1) {\n"
    "        for (int i = threadIdx.x * CV; i < HB * D; i += blockDim.x * CV) {\n"
    "            float a[CV];\n"
    "            gather(i, 0, a);\n"
    "#pragma unroll\n"
    "            for (int k = 0; k < CV; k++)\n"
    "                a[k] *= merge_inv[i / D];\n"
    "            stv<CV>(o + i, a);\n"
    "        }\n"
    "    } else {\n"
    "        __shared__ __align__(16) float merge_acc[G - 1][HB * D];\n"
    "        const int g = threadIdx.x / (NT / G), i = threadIdx.x % (NT / G) * CV;\n"
    "        float a[CV];\n"
    "        gather(i, g, a);\n"
    "        if (g > 0)\n"
    "            stv<CV>(&merge_acc[g - 1][i], a);\n"
    "        __syncthreads();\n"
    "        if (g == 0) {\n"
    "#pragma unroll\n"
    "            for (int q = 0; q < G - 1; q++) {\n"
    "                float b[CV];\n"
    "                ldv<CV>(&merge_acc[q][i], b);\n"
    "#pragma unroll\n"
    "                for (int k = 0; k < CV; k++)\n"
    "                    a[k] += b[k];\n"
    "            }\n"
    "#pragma unroll\n"
    "            for (int k = 0; k < CV; k++)\n"
    "                a[k] *= merge_inv[i / D];\n"
    "            stv<CV>(o + i, a);\n"
    "        }\n"
    "    }\n"
    "}\n"
    "\n"
    "/* A split attention kernel's last block merges: every block of the NSPLIT\n"
    "   splits of a token's HB heads calls this, all its threads, once its\n"
    "   partial states are written; each counts its arrival in cnt[ci], and\n"
    "   the one that arrives last sets the counter back to 0 for the next step\n"
    "   and merges the HB heads into o (moec_attn_merge). */\n"
    "template <int NSPLIT>\n"
    "__device__ __forceinline__ bool moec_attn_arrive_last(unsigned *cnt, long long ci)\n"
    "{\n"
    "    __shared__ unsigned merge_last;\n"
    "    __threadfence();\n"
    "    __syncthreads();\n"
    "    if (threadIdx.x == 0) {\n"
    "        const unsigned k = atomicAdd(cnt + ci, 1u);\n"
    "        merge_last = k == NSPLIT - 1;\n"
    "        if (k == NSPLIT - 1)\n"
    "            cnt[ci] = 0u;\n"
    "        __threadfence();\n"
    "    }\n"
    "    __syncthreads();\n"
    "    return merge_last;\n"
    "}\n"
    "\n"
    "template <int NSPLIT, int HB, int D, typename TO>\n"
    "__device__ __forceinline__ void moec_attn_arrive_merge(const float *part_ml, const float *part_o,\n"
    "                                                       long long part, TO *o, unsigned *cnt,\n"
    "                                                       long long ci)\n"
    "{\n"
    "    if (moec_attn_arrive_last<NSPLIT>(cnt, ci))\n"
    "        moec_attn_merge<NSPLIT, HB, D, 1, 0>(part_ml, part_o, part, o);\n"
    "}\n"
    "\n"
    "/* The last block's merge of only the splits that may hold positions,\n"
    "   [0, nz) (MOEC_ATTN_MERGE=3, GQA): the weights as moec_attn_merge's\n"
    "   (moec_attn_merge_weights),\n"
    "   then each of the block's NT threads takes its R vectors of CV\n"
    "   channels at once, eight splits' loads of all of them in flight at a\n"
    "   time, so that nine splits are two rounds of loads, not sixteen. */\n"
    "template <int NSPLIT, int HB, int D, int NT, typename TO>\n"
    "__device__ __forceinline__ void moec_attn_arrive_merge_live(const float *part_ml,\n"
    "                                                            const float *part_o, long long part,\n"
    "                                                            TO *o, unsigned *cnt, long long ci,\n"
    "                                                            int nz)\n"
    "{\n"
    "    if (!moec_attn_arrive_last<NSPLIT>(cnt, ci))\n"
    "        return;\n"
    "    constexpr int CV = D % 4 ? 1 : 4, NV = HB * D / CV, R = (NV + NT - 1) / NT;\n"
    "    __shared__ float live_w[HB][NSPLIT];\n"
    "    __shared__ float live_inv[HB];\n"
    "    nz = nz < NSPLIT ? nz : NSPLIT;\n"
    "    moec_attn_merge_weights<NSPLIT, HB, NSPLIT>(part_ml, part, live_w, live_inv, nz);\n"
    "    float a[R][CV];\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < R; r++)\n"
    "#pragma unroll\n"
    "        for (int k = 0; k < CV; k++)\n"
    "            a[r][k] = 0.0f;\n"
    "    for (int z0 = 0; z0 < nz; z0 += 8) {\n"
    "        float v[R][8][CV];\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < R; r++) {\n"
    "            const int iv = threadIdx.x + r * NT, hh = iv * CV / D, c = iv * CV % D;\n"
    "            const float *po = part_o + (part + (long long)(hh < HB ? hh : 0) * NSPLIT) * D + c;\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < 8; j++) {\n"
    "                const int z = z0 + j;\n"
    "                /* a split of weight 0 wrote no output: not read */\n"
    "                const bool use = iv < NV && z < nz && live_w[hh][z] != 0.0f;\n"
    "                if constexpr (CV == 4) {\n"
    "                    const float4 x = use ? __ldcg(reinterpret_cast<const float4 *>(po + (long long)z * D))\n"
    "                                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);\n"
    "                    v[r][j][0] = x.x;\n"
    "                    v[r][j][1] = x.y;\n"
    "                    v[r][j][2] = x.z;\n"
    "                    v[r][j][3] = x.w;\n"
    "                } else {\n"
    "                    v[r][j][0] = use ? __ldcg(po + (long long)z * D) : 0.0f;\n"
    "                }\n"
    "            }\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < R; r++) {\n"
    "            const int iv = threadIdx.x + r * NT, hh = iv * CV / D;\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < 8; j++) {\n"
    "                const float w = iv < NV && z0 + j < nz ? live_w[hh][z0 + j] : 0.0f;\n"
    "#pragma unroll\n"
    "                for (int k = 0; k < CV; k++)\n"
    "                    a[r][k] += v[r][j][k] * w;\n"
    "            }\n"
    "        }\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < R; r++) {\n"
    "        const int iv = threadIdx.x + r * NT;\n"
    "        if (iv >= NV)\n"
    "            continue;\n"
    "#pragma unroll\n"
    "        for (int k = 0; k < CV; k++)\n"
    "            a[r][k] *= live_inv[iv * CV / D];\n"
    "        stv<CV>(o + iv * CV, a[r]);\n"
    "    }\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ float block_sum(float v) { return moec_block_reduce<false>(v); }\n"
    "__device__ __forceinline__ float block_max(float v) { return moec_block_reduce<true>(v); }\n"
    "\n"
    "/* The sum of v over every thread of a 1-D cluster of CL blocks: each block's\n"
    "   sum (block_sum) sent into slot `rank` of every block's shared memory,\n"
    "   one cluster barrier, then the CL slots summed in rank order (the same\n"
    "   total in every block). Once a kernel: the slots are not reused, and no\n"
    "   block reads another's memory after the barrier. */\n"
    "template <int CL> __device__ __forceinline__ float moec_cluster_sum(float v)\n"
    "{\n"
    "    __shared__ float slot[CL];\n"
    "    v = block_sum(v);\n"
    "    if (threadIdx.x < CL)\n"
    "        moec_st_cluster(&slot[blockIdx.x % CL], __float_as_uint(v), threadIdx.x);\n"
    "    moec_cluster_sync();\n"
    "    float s = 0.0f;\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < CL; r++)\n"
    "        s += slot[r];\n"
    "    return s;\n"
    "}\n"
    "\n"
    "/* the paged-cache row of token t (pages of BS rows), or -1: padding tokens\n"
    "   (slot < 0) and positions past the block table have none */\n"
    "template <int BS>\n"
    "__device__ __forceinline__ long long moec_cache_row(const int *slots, const int *positions,\n"
    "                                                    const int *block_table, int max_blocks, int t)\n"
    "{\n"
    "    const int s = slots[t], p = positions[t];\n"
    "    if (s < 0 || p < 0 || p / BS >= max_blocks)\n"
    "        return -1;\n"
    "    return (long long)block_table[(long long)s * max_blocks + p / BS] * BS + p % BS;\n"
    "}\n"
    "\n"
    "/* the rotation of pair k at position p: its cos and sin scaled by af */\n"
    "__device__ __forceinline__ void moec_rope_cs(float p, const float *inv_freq, float af, int k,\n"
    "                                             float *cs, float *sn)\n"
    "{\n"
    "    sincosf(p * inv_freq[k], sn, cs);\n"
    "    *cs *= af;\n"
    "    *sn *= af;\n"
    "}\n"
    "\n"
    "/* pair k of a head r's first RD channels rotated by cs, sn: (k, k + RD/2)\n"
    "   neox, (2k, 2k+1) interleaved */\n"
    "template <int RD, bool NEOX>\n"
    "__device__ __forceinline__ void moec_rope_pair(float *r, int k, float cs, float sn)\n"
    "{\n"
    "    const int i0 = NEOX ? k : 2 * k, i1 = NEOX ? k + RD / 2 : 2 * k + 1;\n"
    "    const float x0 = r[i0], x1 = r[i1];\n"
    "    r[i0] = x0 * cs - x1 * sn;\n"
    "    r[i1] = x1 * cs + x0 * sn;\n"
    "}\n"
    "\n"
    "/* the first RD channels of a head r (fp32, in shared memory) rotated at\n"
    "   position p by a warp, each pair read and written by one lane */\n"
    "template <int RD, bool NEOX>\n"
    "__device__ __forceinline__ void moec_rope_row(float *r, int lane, float p, const float *inv_freq,\n"
    "                                              float af)\n"
    "{\n"
    "    for (int k = lane; k < RD / 2; k += 32) {\n"
    "        float sn, cs;\n"
    "        moec_rope_cs(p, inv_freq, af, k, &cs, &sn);\n"
    "        moec_rope_pair<RD, NEOX>(r, k, cs, sn);\n"
    "    }\n"
    "}\n"
    "\n";

void cg_emit_prologue(moec_buf *b) { moec_buf_printf(b, "%s", PROLOGUE); }

/* 1 when the kernel whose declaration runs from kern to open (its body's
 * brace) has a name that begins with one of the comma-separated prefixes
 * in `early` (MOEC_PDL_EARLY; '+' separates them too). */
static int pdl_early(const char *early, const char *kern, const char *open)
{
    /* the name: the identifier before the '(' of the parameters, whose ')'
       is the last before the brace */
    const char *paren = kern, *name;
    int depth = 0;
    for (const char *p = open; p > kern; p--) {
        if (*p == ')')
            depth++;
        else if (*p == '(' && --depth == 0) {
            paren = p;
            break;
        }
    }
    name = paren;
    while (name > kern && (isalnum((unsigned char)name[-1]) || name[-1] == '_'))
        name--;
    size_t nlen = (size_t)(paren - name);
    for (const char *e = early; *e;) {
        size_t len = strcspn(e, ",+");
        if (len && len <= nlen && !strncmp(name, e, len))
            return 1;
        e += len + (e[len] != 0);
    }
    return 0;
}

void cg_add_pdl_waits(moec_buf *b)
{
    static const char KERNEL[] = "extern \"C\" __global__", ENTER[] = "\n    moec_pdl_enter();",
                      WAIT[] = "\n    moec_pdl_wait();", TRIGGER[] = "\n    moec_pdl_trigger();";
    /* MOEC_PDL_EARLY=PREFIX[,PREFIX]: those kernels trigger the next one's
       launch before their wait (an A/B knob) */
    const char *early = getenv("MOEC_PDL_EARLY");
    if (!early)
        early = "";
    if (b->oom || !b->data)
        return;
    size_t n = 0;
    for (const char *p = strstr(b->data, KERNEL); p; p = strstr(p + 1, KERNEL))
        n++;
    moec_buf out = {0};
    const char *p = b->data;
    for (size_t k = 0; k < n; k++) {
        const char *kern = strstr(p, KERNEL), *open = kern ? strchr(kern, '{') : NULL;
        if (!open)
            break;
        /* a body that calls moec_pdl_enter itself (after prefetching its
           weights) keeps its own */
        const char *next = strstr(open, KERNEL), *own = strstr(open, ENTER),
                   *wait = strstr(open, WAIT);
        if (wait && (!own || wait < own))
            own = wait;
        int placed = own && (!next || own < next);
        moec_buf_printf(&out, "%.*s%s%s", (int)(open + 1 - p), p,
                        *early && pdl_early(early, kern, open) ? TRIGGER : "",
                        placed ? "" : ENTER);
        p = open + 1;
    }
    moec_buf_printf(&out, "%s", p);
    if (out.oom) {
        moec_buf_free(&out);
        b->oom = 1;
        return;
    }
    moec_buf_free(b);
    *b = out;
}

moec_status cg_emit_op(cg_ctx *c, const ir_op *op)
{
    moec_status st;
    switch (op->kind) {
    case IR_OP_EMBEDDING: st = cg_emit_embedding(c, op); break;
    case IR_OP_RMS_NORM: st = cg_emit_rms_norm(c, op); break;
    case IR_OP_ADD_RMS_NORM: st = cg_emit_add_rms_norm(c, op); break;
    case IR_OP_LINEAR: st = cg_emit_linear(c, op); break;
    case IR_OP_RESHAPE:
    case IR_OP_SLICE:
    case IR_OP_CONCAT:
    case IR_OP_EXPAND: st = cg_emit_copy(c, op); break;
    case IR_OP_ADD:
    case IR_OP_MUL:
    case IR_OP_SILU:
    case IR_OP_SIGMOID:
    case IR_OP_SILU_MUL: st = cg_emit_eltwise(c, op); break;
    case IR_OP_REDUCE_SUM: st = cg_emit_reduce_sum(c, op); break;
    case IR_OP_ROPE: st = cg_emit_rope(c, op); break;
    case IR_OP_ATTENTION: st = cg_emit_attention(c, op); break;
    case IR_OP_MLA_QABSORB:
    case IR_OP_MLA_VABSORB: st = cg_emit_mla_absorb(c, op); break;
    case IR_OP_MLA_ATTENTION: st = cg_emit_mla_attention(c, op); break;
    case IR_OP_MOE_TOPK: st = cg_emit_moe_topk(c, op); break;
    case IR_OP_MOE_ROUTED: st = cg_emit_moe_routed(c, op); break;
    case IR_OP_MOE_EXPERTS: st = cg_emit_moe_experts(c, op); break;
    case IR_OP_FORK:
    case IR_OP_JOIN: st = cg_emit_stream(c, op); break;
    case IR_OP_ALL_REDUCE:
    case IR_OP_ALL_GATHER:
    case IR_OP_REDUCE_SCATTER:
    case IR_OP_ALL_TO_ALL: st = cg_emit_collective(c, op); break;
    case IR_OP_LAYER_NORM: st = cg_emit_layer_norm(c, op); break;
    case IR_OP_DSA_TOPK: st = cg_emit_dsa_topk(c, op); break;
    case IR_OP_MLA_PROLOGUE:
    case IR_OP_MLA_PROLOGUE_KV:
    case IR_OP_MLA_PROLOGUE_Q: st = cg_emit_mla_prologue(c, op); break;
    case IR_OP_DSA_PROLOGUE_K: st = cg_emit_dsa_prologue_k(c, op); break;
    case IR_OP_ATTN_PROLOGUE: st = cg_emit_attn_prologue(c, op); break;
    default:
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "op %d (kind %d) has no CUDA code generator", op->id,
                        (int)op->kind);
    }
    if (st == MOEC_OK && c->src.oom)
        st = MOEC_ERR(MOEC_ERR_OOM, "out of memory generating the source of %%%s",
                      op->out[0]->name);
    if (st != MOEC_OK)
        moec_err_wrap(st, "codegen of %s %%%s (bucket T=%d)", ir_op_name(op->kind),
                      op->out[0]->name, c->T);
    return st;
}

long long cg_prefetch_bytes(const cg_ctx *c)
{
    if (c->T > cg_env_int("MOEC_PREFETCH_MAX_T", CG_PREFETCH_MAX_T, 0, 1 << 20))
        return 0;
    return 1024LL * cg_env_int("MOEC_PREFETCH_KB", CG_PREFETCH_KB, 0, CG_PREFETCH_KB_MAX);
}

void cg_emit_prefetch(moec_buf *b, long long pf, const char *lines)
{
    cg_emit_prefetch_to(b, pf, lines, 1);
}

void cg_emit_prefetch_to(moec_buf *b, long long pf, const char *lines, int enter)
{
    if (pf <= 0)
        return;
    moec_buf_printf(b,
                    "    /* before the wait, while the kernel before it runs: into L2 what this\n"
                    "       block will read of the weights or the cache (MOEC_PREFETCH_KB) */\n"
                    "    if (threadIdx.x == 0) {\n"
                    "        constexpr long long PF_CAP = %lldLL;\n"
                    "%s"
                    "    }\n"
                    "%s",
                    pf, lines, enter ? "    moec_pdl_enter();\n" : "");
}

int cg_env_int(const char *name, int dflt, int lo, int hi)
{
    const char *e = getenv(name);
    if (!e || !*e)
        return dflt;
    char *end = NULL;
    long v = strtol(e, &end, 10);
    return end && !*end && v >= lo && v <= hi ? (int)v : dflt;
}

int cg_arch_num(const cg_options *o)
{
    const char *a = o->arch;
    if (strncmp(a, "sm_", 3) || a[3] < '0' || a[3] > '9')
        return 0;
    return atoi(a + 3);
}

size_t cg_smem_max(const cg_options *o)
{
    int a = cg_arch_num(o);
    if (a >= 90)
        return 227 * 1024;
    return a == 80 || a == 87 ? 163 * 1024 : 99 * 1024;
}

/* The side stream's GEMV blocks an SM may hold (cg_side_smem_pad): at one
 * token they run beside the top-k kernel, which five of them (the most
 * their registers allow) slowed from ~5 to ~12 us a layer. (H100,
 * 2026-11-25, V2-Lite step at batch 1, ms: bf16 2.392 / 2.393 unpadded, at
 * 1 to 5 blocks 2.493, 2.317-2.321, 2.314-2.317, 2.349, 2.358 in two calls;
 * fp8 1.764-1.766 unpadded, 1.997, 1.806-1.809, 1.770-1.774, 1.732, 1.737.
 * The kernel timeline at 3: the top-k 7.8-9.5 us, the shared gate_up 16
 * us instead of 11.) */
#define SIDE_BPS 3
#define SIDE_BPS_FP8 4

size_t cg_side_smem_pad(const cg_ctx *c, ir_dtype w)
{
    int n = cg_env_int("MOEC_SIDE_BLOCKS_PER_SM", w == IR_DTYPE_F8E4M3 ? SIDE_BPS_FP8 : SIDE_BPS,
                       0, 32);
    if (n <= 0)
        return 0;
    /* the SM's shared memory (the most a block may take, and the 1 KiB the
       GPU keeps per block): n blocks of the pad fit, n + 1 do not */
    size_t sm = cg_smem_max(c->opt) + 1024;
    size_t pad = (size_t)((double)sm / (n + 0.5)) - 1024;
    return pad > cg_smem_max(c->opt) ? cg_smem_max(c->opt) : pad & ~(size_t)1023;
}

int cg_vec_width(int64_t n)
{
    return n % 8 == 0 ? 8 : n % 4 == 0 ? 4 : n % 2 == 0 ? 2 : 1;
}

void cg_dtype_signature(const cg_ctx *c, const ir_op *op, char *buf, size_t cap)
{
    ir_dtype dy = cg_storage(c, op->out[0]);
    int same = 1;
    for (int i = 0; i < op->n_in; i++)
        same &= cg_storage(c, op->in[i]) == dy;
    int n = snprintf(buf, cap, "%s", ir_dtype_name(dy));
    for (int i = 0; !same && i < op->n_in && n > 0 && (size_t)n < cap; i++)
        n += snprintf(buf + n, cap - (size_t)n, "_%s", ir_dtype_name(cg_storage(c, op->in[i])));
}
