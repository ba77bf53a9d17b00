/* gpu_kernels.c — the heavy generated kernels (attention, mla_attention,
 * moe_topk, moe_routed, moe_experts, argmax, DeepSeek-V3.2's dsa_topk with
 * the sparse mla_attention over its selection (and dsa_topk's fast kernels
 * against its legacy ones), the MLA prologue ops and GQA's attn_prologue
 * with the cache rows they write, the linears and experts of fp8 weights, and issue 15's fused
 * forms: the routed experts unsummed with the add_rms_norm that sums them
 * and the moe_topk kernel that aligns their slots, the act silu_mul linear)
 * run on the GPU against the CPU interpreter, on fresh
 * random inputs, at real model shapes (DeepSeek-V2-Lite, DeepSeek-V3,
 * Qwen3-30B-A3B) and odd small ones, in bf16 (tolerance 2e-2) and fp32
 * (1e-4), relative to each row's largest magnitude. fp8 weights are random
 * e4m3 codes (every code but the NaNs) with random block scales, uploaded
 * as the runtime lays them out (codes, then scales: ir_weight_scale_offset)
 * while the interpreter holds their exact dequantization; the fp8 cases
 * run each choice of fp8 kernels asked for (MOEC_FP8_KERNEL's auto, old,
 * tc: cg_options.fp8_kernel) against one interpreter run, at buckets 3
 * and 128 too, and e4m3_widen_case checks the staged kernels' widening of
 * all 256 codes bit for bit. MOEC_KERN_FP8 runs only the fp8 real shapes,
 * old and staged kernels (scripts/gpu_fp8_tune.sh); MOEC_KERN_FP8_LINEAR,
 * with it or alone, only their linears. MOEC_KERN_MOE_AB runs
 * only the routed experts' A/B (scripts/gpu_moe_ab.sh): the first
 * CUDA-core GEMMs against the streaming ones and their shapes
 * (AB_VARIANTS, which override the MOEC_MOE_GEMV* knobs), each checked,
 * each gate_up and down timed in a CUDA graph over copies of the weights.
 * MOEC_KERN_NORM_ONLY runs only the residual add_rms_norms' cases (the
 * add3 and the routed sums'). MOEC_KERN_LINEAR_ONLY runs only the bf16
 * linears' cases past the few-token kernel (plain and act silu_mul, at up
 * to 8 tokens). MOEC_KERN_GQA_PRO_ONLY runs only GQA's
 * prologue cases (by default the
 * one-token bucket's attention kernel runs the prologue, whose results no
 * kernel writes then; MOEC_ATTN_FUSE_PROLOGUE=0 checks the prologue
 * kernel there too). MOEC_KERN_MLA_ONLY runs only the MLA attention's
 * cases (dense and V3.2's sparse form) under the environment's MOEC_MLA_*
 * knobs. Every output
 * is poisoned with NaNs first, so an element a kernel leaves unwritten
 * fails; scratch is poisoned with huge values. Attention runs steps of
 * several sequences (one interpreter each) mixed with padding tokens over a
 * shuffled paged cache, then long contexts against this file's reference,
 * which the short runs check against the interpreter. Kernels are compiled
 * with cg_compile (for $MOEC_ARCH, else sm_90), loaded with
 * cudaLibraryLoadData and launched with cudaLaunchKernel from the steps'
 * symbolic arguments. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codegen/cg.h"
#include "err.h"
#include "kern_modules.h"
#include "runtime/interp.h"
#include "testlib.h"

#ifdef MOEC_HAVE_CUDA
#include "cuda_check.h"

#define TMAX 128
#define TOL_BF16 2e-2
#define TOL_F32 1e-4

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- random numbers and dtypes -------------------------------------------- */

static float urand(uint64_t *s, float a) /* uniform in [-a, a) */
{
    return ((float)(t_rand_u64(s) >> 40) * (1.0f / 8388608.0f) - 1.0f) * a;
}

static int irand(uint64_t *s, int n) { return (int)(t_rand_u64(s) % (uint64_t)n); }

static uint16_t f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf2f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float round_to(ir_dtype dt, float f) { return dt == IR_DTYPE_BF16 ? bf2f(f2bf(f)) : f; }

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* Host floats (or i32 bit patterns for I32) to n elements of dt on the device. */
static void upload(void *d, ir_dtype dt, const float *h, size_t n)
{
    if (dt == IR_DTYPE_F32 || dt == IR_DTYPE_I32) {
        CK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
        return;
    }
    if (dt != IR_DTYPE_BF16) {
        fprintf(stderr, "upload: dtype %s is not used by these tests\n", ir_dtype_name(dt));
        exit(1);
    }
    uint16_t *t = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++)
        t[i] = f2bf(h[i]);
    CK(cudaMemcpy(d, t, n * 2, cudaMemcpyHostToDevice));
    free(t);
}

static void download(float *h, ir_dtype dt, const void *d, size_t n)
{
    if (dt == IR_DTYPE_F32 || dt == IR_DTYPE_I32) {
        CK(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost));
        return;
    }
    uint16_t *t = xmalloc(n * 2);
    CK(cudaMemcpy(t, d, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        h[i] = bf2f(t[i]);
    free(t);
}

static void *dalloc(size_t bytes)
{
    void *p = NULL;
    CK(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}

/* ---- comparison ------------------------------------------------------------ */

/* Rows of n: every |gpu - ref| within tol of the row's largest |ref|; any
 * non-finite GPU value fails. Prints the first mismatches. */
static double compare_rows(const char *what, const float *gpu, const float *ref, int rows, int n,
                           double tol)
{
    double worst = 0;
    int shown = 0;
    for (int r = 0; r < rows; r++) {
        double mx = 0;
        for (int i = 0; i < n; i++)
            mx = fmax(mx, fabs(ref[(size_t)r * n + i]));
        if (mx < 1e-30)
            mx = 1e-30;
        for (int i = 0; i < n; i++) {
            float g = gpu[(size_t)r * n + i], f = ref[(size_t)r * n + i];
            double e = isfinite(g) ? fabs((double)g - f) / mx : INFINITY;
            if (e > worst)
                worst = e;
            if (e > tol && shown < 5) {
                fprintf(stderr, "  %s: row %d [%d]: gpu %.7g, reference %.7g (row max %.4g)\n", what,
                        r, i, g, f, mx);
                shown++;
            }
        }
    }
    t_checks++;
    if (!(worst <= tol)) {
        t_failures++;
        fprintf(stderr, "FAIL %s: worst relative error %.3g > %.3g\n", what, worst, tol);
    }
    return worst;
}

/* ---- programs: generated per module, compiled in parallel up front -------- */

/* the default buckets, then 128 and 3 (tokens past the largest default
   bucket, a bucket that is not a power of two) for the fp8 kernels; TM(t)
   is bucket t's bit in a mask */
static const int BUCKETS[] = {1, 2, 4, 8, 16, 32, 64, 128, 3};
#define N_BUCKETS ((int)(sizeof BUCKETS / sizeof *BUCKETS))
#define TM(t) ((t) == 3 ? 1u << 8 : 1u << __builtin_ctz(t))

typedef struct gk_prog {
    char key[128];
    cg_compile_job job; /* its source, then its cubin */
    cudaLibrary_t lib;
    int loaded;
} gk_prog;

static gk_prog progs[128];
static int n_progs;
static const char *cache_dir;

/* The fp8 kernel choices (cg_options.fp8_kernel) by name. */
static const char *const FP8_MODES[] = {"auto", "old", "tc"};
#define FM(mode) (1u << (mode))

/* The expert GEMMs' A/B (MOEC_KERN_MOE_AB, moe_case_run): each variant is
 * the environment its programs are generated under (the first CUDA-core
 * form, the streaming form and its shapes: codegen/moe_routed.c's knobs);
 * ab_var is the variant programs are being made or run for, -1 outside
 * the A/B. */
typedef struct ab_variant {
    const char *name;
    const char *env[3]; /* NAME=value, set over the knobs' defaults */
} ab_variant;

static const ab_variant AB_VARIANTS[] = {
    {"old", {"MOEC_MOE_GEMV=0"}},
    {"gv", {NULL}},
    {"gv_u8", {"MOEC_MOE_GEMV_U=8"}},
    {"gv_u8_r4", {"MOEC_MOE_GEMV_U=8", "MOEC_MOE_GEMV_RW=4", "MOEC_MOE_GEMV_RWD=8"}},
    {"gv_u1", {"MOEC_MOE_GEMV_U=1", "MOEC_MOE_GEMV_RW=4", "MOEC_MOE_GEMV_RWD=8"}},
    {"gv_w8", {"MOEC_MOE_GEMV_WARPS=8"}},
    {"gv_w2", {"MOEC_MOE_GEMV_WARPS=2"}},
    {"gv_r1", {"MOEC_MOE_GEMV_RW=1", "MOEC_MOE_GEMV_RWD=2"}},
    {"gv_r4", {"MOEC_MOE_GEMV_RW=4", "MOEC_MOE_GEMV_RWD=8"}},
};
#define N_AB_VARIANTS ((int)(sizeof AB_VARIANTS / sizeof *AB_VARIANTS))
static int ab_var = -1;

/* Sets variant v's environment (-1: none of the knobs set). */
static void ab_set(int v)
{
    static const char *const KNOBS[] = {"MOEC_MOE_GEMV",     "MOEC_MOE_GEMV_U",
                                        "MOEC_MOE_GEMV_RW",  "MOEC_MOE_GEMV_RWD",
                                        "MOEC_MOE_GEMV_WARPS", "MOEC_MOE_GEMV_MAX_BM"};
    for (size_t i = 0; i < sizeof KNOBS / sizeof *KNOBS; i++)
        unsetenv(KNOBS[i]);
    for (int i = 0; v >= 0 && i < 3 && AB_VARIANTS[v].env[i]; i++) {
        char kv[64];
        snprintf(kv, sizeof kv, "%s", AB_VARIANTS[v].env[i]);
        char *eq = strchr(kv, '=');
        *eq = 0;
        setenv(kv, eq + 1, 1);
    }
    ab_var = v;
}

static void prog_key(char *buf, const km_spec *s, ir_dtype cdt, int bs, int fp8)
{
    snprintf(buf, 128, "%s/%s/bs%d/%s%s%s", s->name, ir_dtype_name(cdt), bs, FP8_MODES[fp8],
             ab_var >= 0 ? "/" : "", ab_var >= 0 ? AB_VARIANTS[ab_var].name : "");
}

/* The target the programs are generated and compiled for: $MOEC_ARCH, as
 * moec compile reads it (sm_90a, say, where codegen has a form for that
 * target alone), else sm_90. */
static const char *karch(void)
{
    const char *a = getenv("MOEC_ARCH");
    return a && !strncmp(a, "sm_", 3) && strlen(a) < 16 ? a : "sm_90";
}

static void kopts_default(cg_options *o)
{
    cg_options_default(o);
    snprintf(o->arch, sizeof o->arch, "%s", karch());
}

static void options_for(cg_options *o, ir_dtype cdt, int bs, int fp8)
{
    kopts_default(o);
    o->compute_dtype = cdt;
    o->kv_block_size = bs;
    o->fp8_kernel = fp8;
}

/* The ops whose kernels these programs run: the heavy ones, and here the
 * add_rms_norm of km_spec.AN, the absorptions of km_spec.AH (their
 * buckets of up to 2 tokens: generated kernels, not cuBLASLt) and the
 * linear of km_spec.LN (ly; bf16 ones are generated kernels up to 8
 * tokens where K is a multiple of 32, else up to 4: their cases run only
 * those; a router's linear is left to its top-k or the interpreter). */
static int runs(const ir_op *op)
{
    return km_is_heavy(op) || op->kind == IR_OP_ADD_RMS_NORM || op->kind == IR_OP_MLA_QABSORB ||
           op->kind == IR_OP_MLA_VABSORB ||
           (op->kind == IR_OP_LINEAR && (ir_op_attr(op, "act") || !strcmp(op->out[0]->name, "ly")));
}

/* The heavy ops of m and the argmax of its output, for bucket T, added to
 * c (whose kernels so far are reused, not emitted again). */
static moec_status gen_more(const ir_module *m, int T, cg_ctx *c)
{
    c->T = T;
    c->n_steps = 0;
    for (int k = 0; k < m->n_ops; k++)
        if (runs(m->ops[k]))
            MOEC_TRY(cg_emit_op(c, m->ops[k]));
    return cg_emit_argmax(c, m->outputs[0]);
}

/* The heavy ops of m and the argmax of its output, for bucket T. */
static moec_status gen(const ir_module *m, const cg_options *o, int T, cg_ctx *c)
{
    memset(c, 0, sizeof *c);
    c->m = m;
    c->opt = o;
    return gen_more(m, T, c);
}

/* Queues one program with the buckets of tmask (bit i: BUCKETS[i]), fp8
 * weights' kernels chosen as fp8 (CG_FP8_*) says. */
static void prog_add_fp8(const km_spec *s, ir_dtype cdt, int bs, unsigned tmask, int fp8)
{
    if (n_progs == (int)(sizeof progs / sizeof *progs)) {
        fprintf(stderr, "too many programs\n");
        exit(1);
    }
    ir_module *m = km_module(s);
    if (!m)
        exit(1);
    cg_options o;
    options_for(&o, cdt, bs, fp8);
    /* one context for every bucket: a kernel two buckets share (the few-rows
       linear of 4 rows, run per group of 4 by larger buckets) is emitted once */
    cg_ctx c;
    memset(&c, 0, sizeof c);
    c.m = m;
    c.opt = &o;
    cg_emit_prologue(&c.src);
    for (int b = 0; b < N_BUCKETS; b++) {
        if (!(tmask & (1u << b)))
            continue;
        moec_status st = gen_more(m, BUCKETS[b], &c);
        if (st != MOEC_OK) {
            fprintf(stderr, "%s T=%d: %s\n", s->name, BUCKETS[b], moec_last_error());
            exit(1);
        }
    }
    ir_module_free(m);
    if (c.src.oom) {
        fprintf(stderr, "%s: out of memory generating its program\n", s->name);
        exit(1);
    }
    gk_prog *p = &progs[n_progs++];
    memset(p, 0, sizeof *p);
    prog_key(p->key, s, cdt, bs, fp8);
    p->job.src = c.src.data;
    c.src.data = NULL;
    cg_ctx_free(&c);
}

static void prog_add(const km_spec *s, ir_dtype cdt, int bs, unsigned tmask)
{
    prog_add_fp8(s, cdt, bs, tmask, CG_FP8_AUTO);
}

/* prog_add_fp8 for each choice in modes (bit m: FM(m)). */
static void prog_add_modes(const km_spec *s, ir_dtype cdt, unsigned tmask, unsigned modes)
{
    for (int f = 0; f < 3; f++)
        if (modes & FM(f))
            prog_add_fp8(s, cdt, 64, tmask, f);
}

static void progs_compile(void)
{
    double t0 = now_s();
    cg_compile_job jobs[128];
    for (int i = 0; i < n_progs; i++)
        jobs[i] = progs[i].job;
    cg_compile_many(jobs, n_progs, karch(), cache_dir, NULL, NULL);
    for (int i = 0; i < n_progs; i++) {
        progs[i].job = jobs[i];
        if (jobs[i].st != MOEC_OK) {
            fprintf(stderr, "%s: %s\n", progs[i].key, jobs[i].err);
            exit(1);
        }
    }
    printf("compiled %d programs in %.1f s\n", n_progs, now_s() - t0);
}

static cudaLibrary_t prog_lib_fp8(const km_spec *s, ir_dtype cdt, int bs, int fp8)
{
    char key[128];
    prog_key(key, s, cdt, bs, fp8);
    for (int i = 0; i < n_progs; i++) {
        gk_prog *p = &progs[i];
        if (strcmp(p->key, key))
            continue;
        if (!p->loaded) {
            CK(cudaLibraryLoadData(&p->lib, p->job.cubin, NULL, NULL, 0, NULL, NULL, 0));
            p->loaded = 1;
        }
        return p->lib;
    }
    fprintf(stderr, "no program %s\n", key);
    exit(1);
}

static cudaLibrary_t prog_lib(const km_spec *s, ir_dtype cdt, int bs)
{
    return prog_lib_fp8(s, cdt, bs, CG_FP8_AUTO);
}

static void progs_free(void)
{
    for (int i = 0; i < n_progs; i++) {
        if (progs[i].loaded)
            CK(cudaLibraryUnload(progs[i].lib));
        free(progs[i].job.cubin);
        free((char *)progs[i].job.src);
    }
    n_progs = 0;
}

/* ---- binding steps to device memory and launching them -------------------- */

typedef struct gk_bind {
    const ir_module *m;
    ir_dtype cdt;
    void **val;             /* per value id: TMAX tokens (weights: all of it) */
    void *kv[2];
    void **kv_by_op;        /* when set: KV pool p of op id k at [2 * k + p] (several ops' pools) */
    void *input[IR_INPUT_COUNT];
    void *scratch;
    size_t scratch_cap;
    int max_blocks;
} gk_bind;

static void bind_init(gk_bind *b, const ir_module *m, ir_dtype cdt)
{
    memset(b, 0, sizeof *b);
    b->m = m;
    b->cdt = cdt;
    b->val = calloc((size_t)m->n_values, sizeof *b->val);
    if (!b->val)
        exit(1);
    /* the split counters, zero as the runtime leaves them at load */
    b->input[IR_INPUT_SPLIT_COUNTERS] = dalloc(IR_SPLIT_COUNTERS * 4);
    CK(cudaMemset(b->input[IR_INPUT_SPLIT_COUNTERS], 0, IR_SPLIT_COUNTERS * 4));
}

static void bind_free(gk_bind *b)
{
    /* every split attention kernel's last block set its counters back to 0 */
    unsigned *cnt = xmalloc(IR_SPLIT_COUNTERS * 4);
    CK(cudaMemcpy(cnt, b->input[IR_INPUT_SPLIT_COUNTERS], IR_SPLIT_COUNTERS * 4,
                  cudaMemcpyDeviceToHost));
    int left = 0;
    for (int i = 0; i < IR_SPLIT_COUNTERS; i++)
        left += cnt[i] != 0;
    free(cnt);
    T_CHECK(left == 0);
    if (left)
        fprintf(stderr, "FAIL: %d split counters left nonzero\n", left);
    for (int i = 0; i < b->m->n_values; i++)
        if (b->val[i])
            CK(cudaFree(b->val[i]));
    free(b->val);
    for (int i = 0; i < 2; i++)
        if (b->kv[i])
            CK(cudaFree(b->kv[i]));
    for (int i = 0; b->kv_by_op && i < 2 * b->m->n_ops; i++)
        if (b->kv_by_op[i])
            CK(cudaFree(b->kv_by_op[i]));
    free(b->kv_by_op);
    for (int i = 0; i < IR_INPUT_COUNT; i++)
        if (b->input[i])
            CK(cudaFree(b->input[i]));
    if (b->scratch)
        CK(cudaFree(b->scratch));
}

static ir_dtype storage(const gk_bind *b, const ir_value *v)
{
    return ir_value_storage_dtype(b->m, v, b->cdt);
}

/* Whether v is a result of an op whose kernels the program runs. */
static int produced(const ir_value *v) { return v->def && runs(v->def); }

/* The device copy of activation v (TMAX tokens of 4-byte slots). */
static void *act(gk_bind *b, const ir_value *v)
{
    if (!b->val[v->id])
        b->val[v->id] = dalloc((size_t)ir_type_numel(&v->type, 1) * TMAX * 4);
    return b->val[v->id];
}

/* Rows of the operand values a step reads, for bucket T: src(u, v) gives
 * T rows of v as floats (i32 values as their bit patterns). */
typedef const float *(*row_source)(void *u, const ir_value *v);

/* Uploads what the steps read and no step writes; poisons what they write
 * (NaN for floats, -1 for ints) and the scratch (huge values). */
static void bind_step_values(gk_bind *b, const cg_ctx *c, row_source src, void *u)
{
    for (int i = 0; i < c->n_steps; i++)
        for (int a = 0; a < c->steps[i].n_args; a++) {
            const ir_arg *g = &c->steps[i].args[a];
            if (g->kind != IR_ARG_ACT)
                continue;
            const ir_value *v = b->m->values[g->index];
            size_t n = (size_t)ir_type_numel(&v->type, c->T);
            void *d = act(b, v);
            if (produced(v))
                CK(cudaMemset(d, 0xff, (size_t)ir_type_numel(&v->type, 1) * TMAX * 4));
            else
                upload(d, storage(b, v), src(u, v), n);
        }
    if (c->scratch_bytes > b->scratch_cap) {
        if (b->scratch)
            CK(cudaFree(b->scratch));
        b->scratch = dalloc(c->scratch_bytes);
        b->scratch_cap = c->scratch_bytes;
    }
    if (b->scratch)
        CK(cudaMemset(b->scratch, 0x7f, b->scratch_cap));
    if (!b->input[IR_INPUT_SAMPLED])
        b->input[IR_INPUT_SAMPLED] = dalloc(TMAX * 4);
    CK(cudaMemset(b->input[IR_INPUT_SAMPLED], 0xff, TMAX * 4));
}

/* Uploads weight v once: an fp8 weight's image (codes, scales) as is,
 * another as the interpreter's values, rounded alike. */
static void bind_weight(gk_bind *b, rt_interp *in, const ir_value *v, void *const *image)
{
    if (b->val[v->id])
        return;
    size_t n = (size_t)ir_type_numel(&v->type, 0);
    ir_dtype dt = storage(b, v);
    size_t bytes = ir_weight_storage_bytes(b->m, v, b->cdt);
    b->val[v->id] = dalloc(bytes);
    if (dt == IR_DTYPE_F8E4M3) {
        if (!image[v->id]) {
            fprintf(stderr, "fp8 weight %s has no image\n", v->name);
            exit(1);
        }
        CK(cudaMemcpy(b->val[v->id], image[v->id], bytes, cudaMemcpyHostToDevice));
        return;
    }
    upload(b->val[v->id], dt, rt_interp_weight(in, v), n);
}

/* A step's kernel arguments, as cudaLaunchKernel takes them. */
typedef struct step_argv {
    void *ptr[IR_MAX_ARGS], *argv[IR_MAX_ARGS];
    int iv[IR_MAX_ARGS];
    float fv[IR_MAX_ARGS];
} step_argv;

/* Binds the arguments of step s of c into *sa; weights whose alt[id] is set
 * (alt may be NULL) are read from there, a copy elsewhere in memory. */
static void step_args(gk_bind *b, const cg_ctx *c, const ir_step *s, void *const *alt,
                      step_argv *sa)
{
    void **ptr = sa->ptr, **argv = sa->argv;
    int *iv = sa->iv;
    float *fv = sa->fv;
    for (int a = 0; a < s->n_args; a++) {
        const ir_arg *g = &s->args[a];
        argv[a] = &ptr[a];
        switch (g->kind) {
        case IR_ARG_ACT:
            ptr[a] = b->val[g->index] ? (char *)b->val[g->index] + g->i : NULL;
            break;
        case IR_ARG_WEIGHT: {
            void *w = alt && alt[g->index] ? alt[g->index] : b->val[g->index];
            ptr[a] = w ? (char *)w + g->i : NULL;
            break;
        }
        case IR_ARG_KV:
            ptr[a] = b->kv_by_op ? b->kv_by_op[2 * g->index + g->i] : b->kv[g->i];
            break;
        case IR_ARG_INPUT:
            ptr[a] = b->input[g->index] ? (char *)b->input[g->index] + g->i : NULL;
            break;
        case IR_ARG_SCRATCH: ptr[a] = (char *)b->scratch + g->i; break;
        case IR_ARG_CONFIG:
            iv[a] = b->max_blocks;
            argv[a] = &iv[a];
            break;
        case IR_ARG_I32:
            iv[a] = (int)g->i;
            argv[a] = &iv[a];
            break;
        case IR_ARG_F32:
            fv[a] = (float)g->f;
            argv[a] = &fv[a];
            break;
        }
        if (argv[a] == &ptr[a] && !ptr[a]) {
            fprintf(stderr, "%s: argument %d (kind %d) is unbound\n", c->kernel_names[s->kernel],
                    a, (int)g->kind);
            exit(1);
        }
    }
}

/* Launches every step of c (reps times each, for timing) on stream st. */
static void launch_steps_on(gk_bind *b, const cg_ctx *c, cudaLibrary_t lib, int reps,
                            cudaStream_t st)
{
    for (int i = 0; i < c->n_steps; i++) {
        const ir_step *s = &c->steps[i];
        if (s->kind != IR_STEP_KERNEL) { /* cuBLASLt steps are not run here */
            fprintf(stderr, "step %d is no generated kernel (kind %d)\n", i, (int)s->kind);
            T_CHECK(0);
            continue;
        }
        cudaKernel_t k;
        CK(cudaLibraryGetKernel(&k, lib, c->kernel_names[s->kernel]));
        step_argv sa;
        void **argv = sa.argv;
        step_args(b, c, s, NULL, &sa);
        if (s->smem > 48 * 1024)
            CK(cudaKernelSetAttributeForDevice(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)s->smem, 0));
        dim3 grid = {s->grid[0], s->grid[1], s->grid[2]}, block = {s->block[0], s->block[1], s->block[2]};
        for (int r = 0; r < reps; r++)
            CK(cudaLaunchKernel((const void *)k, grid, block, argv, s->smem, st));
        CK(cudaGetLastError());
    }
}

/* Launches every step of c (reps times each); synchronizes. */
static void launch_steps_n(gk_bind *b, const cg_ctx *c, cudaLibrary_t lib, int reps)
{
    launch_steps_on(b, c, lib, reps, 0);
    CK(cudaDeviceSynchronize());
}

static void launch_steps(gk_bind *b, const cg_ctx *c, cudaLibrary_t lib)
{
    launch_steps_n(b, c, lib, 1);
}

/* With MOEC_KERN_BENCH set: the mean time of each step over 20 launches. */
static void bench_steps(gk_bind *b, const cg_ctx *c, cudaLibrary_t lib, const char *what,
                        double bytes)
{
    if (!getenv("MOEC_KERN_BENCH"))
        return;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double total = 0;
    for (int i = 0; i < c->n_steps; i++) {
        cg_ctx one = *c;
        one.steps = &c->steps[i];
        one.n_steps = 1;
        launch_steps(b, &one, lib);
        CK(cudaEventRecord(e0, 0));
        launch_steps_n(b, &one, lib, 20);
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        total += ms / 20 * 1e3;
        printf("  bench %-12s %-70s %8.1f us\n", what, c->kernel_names[c->steps[i].kernel], ms / 20 * 1e3);
    }
    if (bytes > 0)
        printf("  bench %-12s total %.1f us, %.0f GB/s of weights\n", what, total, bytes / total * 1e-3);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
}

/* The A/B's weight copies: ab_copies[r][id], copy r of weight id (NULL: the
 * original); the timed graphs read copy j % AB_COPIES at launch j, so that
 * the expert weights come from memory as in a decode step, not from the
 * 50 MB L2 (V2-Lite's down at one token is 35 MB, 17 in fp8). */
#define AB_COPIES 8
#define AB_GRAPH_LAUNCHES 64
static void **ab_copies[AB_COPIES];

/* Microseconds of one of the n launches graph g (captured on st) holds:
 * the mean of 5 replays after a warm-up, so that launch gaps stay out of
 * the kernels' times. Destroys g. */
static double graph_us(cudaGraph_t g, cudaStream_t st, int n)
{
    cudaGraphExec_t ge;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e0, st));
    for (int r = 0; r < 5; r++)
        CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return ms * 1e3 / (5.0 * n);
}

/* The mean time in us of step i of c over AB_GRAPH_LAUNCHES launches
 * captured in a CUDA graph. */
static double ab_graph_us(gk_bind *b, const cg_ctx *c, cudaLibrary_t lib, int i)
{
    const ir_step *s = &c->steps[i];
    cudaKernel_t k;
    CK(cudaLibraryGetKernel(&k, lib, c->kernel_names[s->kernel]));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    dim3 grid = {s->grid[0], s->grid[1], s->grid[2]}, block = {s->block[0], s->block[1], s->block[2]};
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int j = 0; j < AB_GRAPH_LAUNCHES; j++) {
        step_argv sa;
        step_args(b, c, s, ab_copies[j % AB_COPIES], &sa);
        CK(cudaLaunchKernel((const void *)k, grid, block, sa.argv, s->smem, st));
    }
    CK(cudaStreamEndCapture(st, &g));
    double us = graph_us(g, st, AB_GRAPH_LAUNCHES);
    CK(cudaStreamDestroy(st));
    return us;
}

/* The A/B's times: each expert GEMM step of c (gate_up, down) in a graph,
 * with the bytes of the experts the tokens chose (gu_bytes, dn_bytes) as
 * TB/s. */
static void ab_time(gk_bind *b, const cg_ctx *c, cudaLibrary_t lib, const char *what,
                    double gu_bytes, double dn_bytes)
{
    for (int i = 0; i < c->n_steps; i++) {
        const char *kn = c->kernel_names[c->steps[i].kernel];
        int gu = !strncmp(kn, "moe_gate_up_", 12), dn = !strncmp(kn, "moe_down_", 9);
        if (!gu && !dn)
            continue;
        double us = ab_graph_us(b, c, lib, i), bytes = gu ? gu_bytes : dn_bytes;
        printf("  ab %-28s %-7s %7.1f us %5.2f TB/s %5.1f MB  %s\n", what,
               gu ? "gate_up" : "down", us, bytes / us * 1e-6, bytes * 1e-6, kn);
    }
}

/* The argmax step: sampled[t] against the interpreter's logits (ties low). */
static void check_sampled(gk_bind *b, const float *logits, int T, int V, const char *what)
{
    int got[TMAX];
    CK(cudaMemcpy(got, b->input[IR_INPUT_SAMPLED], (size_t)T * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int t = 0; t < T; t++) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[(size_t)t * V + i] > logits[(size_t)t * V + best])
                best = i;
        if (got[t] != best && bad++ < 3)
            fprintf(stderr, "  %s argmax: token %d: gpu %d, reference %d\n", what, t, got[t], best);
    }
    T_CHECK(bad == 0);
}

static const ir_value *val(const ir_module *m, const char *name)
{
    const ir_value *v = ir_module_find_value(m, name);
    if (!v) {
        fprintf(stderr, "module %s has no value %s\n", m->name, name);
        exit(1);
    }
    return v;
}

/* ---- MoE: routing, routed experts, unfused experts ------------------------- */

typedef struct interp_rows {
    rt_interp *in;
} interp_rows;

static const float *rows_from_interp(void *u, const ir_value *v)
{
    return rt_interp_value(((interp_rows *)u)->in, v);
}

/* fp8 weight v: random e4m3 codes (the NaN codes 0x7f and 0xff taken one
 * lower), one random positive scale per block (about a / 448, so that
 * |weights| stay below about 1.5 a), into its device image *image
 * (malloc'd: codes, zero padding, scales, as ir_weight_scale_offset lays
 * them out, the codes in tiles where MOEC_FP8_TILES=1 and ir_weight_tiled
 * say); the interpreter gets each code times its block's scale, as
 * the loader dequantizes. */
static void fill_fp8(rt_interp *in, const ir_module *m, const ir_value *v, ir_dtype cdt, float a,
                     uint64_t *rng, void **image)
{
    size_t n = (size_t)ir_type_numel(&v->type, 0), off = ir_weight_scale_offset(v);
    uint8_t *img = calloc(1, ir_weight_storage_bytes(m, v, cdt));
    if (!img) {
        fprintf(stderr, "out of memory for the image of %s\n", v->name);
        exit(1);
    }
    ir_type st = ir_block_scale_type(v);
    float *sc = (float *)(img + off);
    for (int64_t i = 0; i < ir_type_numel(&st, 0); i++)
        sc[i] = a / 448.0f * (1.0f + 0.5f * urand(rng, 1.0f));
    int r = v->type.rank;
    int64_t rows = v->type.dims[r - 2], cols = v->type.dims[r - 1];
    int64_t srows = st.dims[r - 2], scols = st.dims[r - 1];
    float *w = rt_interp_weight(in, v);
    for (size_t i = 0; i < n; i++) {
        uint8_t q = (uint8_t)(t_rand_u64(rng) >> 56);
        if ((q & 0x7f) == 0x7f)
            q--;
        img[i] = q;
        int64_t col = (int64_t)i % cols, row = ((int64_t)i / cols) % rows;
        int64_t lead = (int64_t)i / (cols * rows);
        w[i] = rt_f8e4m3_to_f32(q) *
               sc[(lead * srows + row / v->scale.block[0]) * scols + col / v->scale.block[1]];
    }
    cg_options o;
    kopts_default(&o); /* as the programs were compiled */
    if (ir_weight_tiled(m, v, o.fp8_tiles) && ir_tile_codes(img, (int64_t)n / cols, cols) != 0) {
        fprintf(stderr, "out of memory for the tiles of %s\n", v->name);
        exit(1);
    }
    image[v->id] = img;
}

/* Random weights, rounded to how the GPU stores them: routing logits on a
 * grid of 1/16 (exact ties, and no near-ties for rounding to flip), the
 * bias on a grid of 1/64, expert and linear weights scaled to keep
 * activations O(1); fp8 weights as fill_fp8 makes them. */
static void fill_weights(rt_interp *in, const ir_module *m, ir_dtype cdt, const km_spec *s,
                         uint64_t *rng, void **image)
{
    for (int i = 0; i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        if (v->kind != IR_VALUE_WEIGHT)
            continue;
        size_t n = (size_t)ir_type_numel(&v->type, 0);
        float *w = rt_interp_weight(in, v);
        ir_dtype dt = ir_value_storage_dtype(m, v, cdt);
        if (!strcmp(v->name, "tab_logits")) {
            for (size_t j = 0; j < n; j++)
                w[j] = (float)(irand(rng, 97) - 48) / 16.0f;
        } else if (!strcmp(v->name, "bias")) {
            for (size_t j = 0; j < n; j++)
                w[j] = (float)(irand(rng, 33) - 16) / 64.0f;
        } else {
            float a = 1.7f;
            if (!strcmp(v->name, "gate_up") || !strcmp(v->name, "gate") || !strcmp(v->name, "up"))
                a = sqrtf(3.0f / (float)s->HID);
            else if (!strcmp(v->name, "down"))
                a = sqrtf(12.0f / (float)s->I);
            else if (!strcmp(v->name, "rw"))
                a = sqrtf(3.0f / (float)s->HID);
            else if (!strcmp(v->name, "lw"))
                a = sqrtf(3.0f / (float)s->LK);
            else if (!strcmp(v->name, "ab_kvb"))
                a = sqrtf(3.0f / (float)s->AR);
            if (dt == IR_DTYPE_F8E4M3) {
                if (!image) {
                    fprintf(stderr, "%s: fp8 weight %s without an image\n", s->name, v->name);
                    exit(1);
                }
                fill_fp8(in, m, v, cdt, a, rng, image);
                continue;
            }
            for (size_t j = 0; j < n; j++)
                w[j] = round_to(dt, urand(rng, a));
        }
    }
}

/* The device bytes of the weights an op reads per expert (E: the expert
 * count) or whole (E 1), by name: fp8 ones with their scales. */
static double weight_bytes(const ir_module *m, ir_dtype cdt, const char *const *names, int E)
{
    double bytes = 0;
    for (; *names; names++) {
        const ir_value *v = ir_module_find_value(m, *names);
        if (v)
            bytes += (double)ir_weight_storage_bytes(m, v, cdt) / E;
    }
    return bytes;
}

/* Value `name` of the steps just run, T rows, against the interpreter's
 * (compare_rows, reported as "<spec> <dtype> T=<T> <label>"): the row error. */
static double compare_value(const km_spec *s, const ir_module *m, rt_interp *in, gk_bind *b,
                            ir_dtype cdt, int T, const char *name, const char *label, double tol)
{
    const ir_value *v = val(m, name);
    int n = (int)ir_type_numel(&v->type, 1);
    float *g = xmalloc((size_t)T * n * 4);
    download(g, storage(b, v), b->val[v->id], (size_t)T * n);
    char what[200];
    snprintf(what, sizeof what, "%s %s T=%d %s", s->name, ir_dtype_name(cdt), T, label);
    double e = compare_rows(what, g, rt_interp_value(in, v), T, n, tol);
    free(g);
    return e;
}

/* One bucket of moe_case under one choice of fp8 kernels: the steps
 * generated with it run on the inputs the interpreter saw, their results
 * compared (ids exactly, weights, the experts, the linear, the argmax);
 * worst[3] takes the worst errors of weights, experts and linear. */
static void moe_bucket(const km_spec *s, const ir_module *m, rt_interp *in, void **image,
                       gk_bind *b, ir_dtype cdt, int T, int fp8, double worst[3])
{
    cg_options o;
    options_for(&o, cdt, 64, fp8);
    cudaLibrary_t lib = prog_lib_fp8(s, cdt, 64, fp8);
    double tol = cdt == IR_DTYPE_BF16 ? TOL_BF16 : TOL_F32;
    interp_rows u = {in};
    cg_ctx c;
    T_OK(gen(m, &o, T, &c));
    for (int i = 0; i < c.n_steps; i++)
        for (int a = 0; a < c.steps[i].n_args; a++)
            if (c.steps[i].args[a].kind == IR_ARG_WEIGHT)
                bind_weight(b, in, m->values[c.steps[i].args[a].index], image);
    bind_step_values(b, &c, rows_from_interp, &u);
    launch_steps(b, &c, lib);
    char what[160];
    const char *fm = FP8_MODES[fp8];
    if (s->E > 0) {
        const ir_value *ids = val(m, "ids"), *w = val(m, "w");
        size_t n = (size_t)T * s->K;
        int32_t *gid = xmalloc(n * 4);
        float *gw = xmalloc(n * 4);
        CK(cudaMemcpy(gid, b->val[ids->id], n * 4, cudaMemcpyDeviceToHost));
        download(gw, IR_DTYPE_F32, b->val[w->id], n);
        const int32_t *rid = (const int32_t *)rt_interp_value(in, ids);
        int bad = 0;
        for (size_t j = 0; j < n; j++)
            if (gid[j] != rid[j] && bad++ < 3)
                fprintf(stderr, "  %s T=%d: ids[%zu / %d]: gpu %d, interpreter %d\n", s->name, T,
                        j / (size_t)s->K, (int)(j % (size_t)s->K), gid[j], rid[j]);
        t_checks++;
        if (bad) {
            t_failures++;
            fprintf(stderr, "FAIL %s T=%d: %d of %zu expert ids differ\n", s->name, T, bad, n);
        }
        snprintf(what, sizeof what, "%s T=%d topk weights", s->name, T);
        worst[0] = fmax(worst[0], compare_rows(what, gw, rt_interp_value(in, w), T, s->K, 1e-5));
        free(gid);
        free(gw);
    }
    if (s->moe != KM_MOE_NONE) {
        const ir_value *y = val(m, "y");
        int per = (int)ir_type_numel(&y->type, 1), rows = T, n = per;
        if (s->moe == KM_EXPERTS || s->moe == KM_EXPERTS_SPLIT || s->an_moe) {
            rows = T * s->K;
            n = s->HID;
        }
        float *gy = xmalloc((size_t)T * per * 4);
        download(gy, storage(b, y), b->val[y->id], (size_t)T * per);
        snprintf(what, sizeof what, "%s %s T=%d fp8 %s experts", s->name, ir_dtype_name(cdt), T,
                 fm);
        worst[1] = fmax(worst[1], compare_rows(what, gy, rt_interp_value(in, y), rows, n, tol));
        free(gy);
    }
    char label[96];
    if (s->LN > 0) {
        snprintf(label, sizeof label, "fp8 %s linear %s[%d, %d]", fm, s->ldt, s->LN, s->LK);
        worst[2] = fmax(worst[2], compare_value(s, m, in, b, cdt, T, "ly", label, tol));
    }
    if (s->AN > 0) {
        worst[2] = fmax(worst[2], compare_value(s, m, in, b, cdt, T, "an_s", "add_rms_norm an_s",
                                                tol));
        worst[2] = fmax(worst[2], compare_value(s, m, in, b, cdt, T, "an_n", "add_rms_norm an_n",
                                                tol));
    }
    if (s->AH > 0) {
        worst[2] = fmax(worst[2], compare_value(s, m, in, b, cdt, T, "ab_qc", "mla_qabsorb", tol));
        worst[2] = fmax(worst[2], compare_value(s, m, in, b, cdt, T, "ab_o", "mla_vabsorb", tol));
    }
    snprintf(what, sizeof what, "%s T=%d", s->name, T);
    check_sampled(b, rt_interp_value(in, val(m, "out")), T, 40, what);
    static const char *const EXPERT_W[] = {"gate_up", "gate", "up", "down", NULL};
    static const char *const LINEAR_W[] = {"lw", "ab_kvb", NULL};
    double bytes = weight_bytes(m, cdt, LINEAR_W, 1);
    if (s->moe != KM_MOE_NONE) {
        /* the weights of the experts the tokens chose */
        const int32_t *rid = (const int32_t *)rt_interp_value(in, val(m, "ids"));
        char used[8192] = {0};
        for (int j = 0; j < T * s->K; j++)
            used[rid[j]] = 1;
        for (int j = 0; j < s->E; j++)
            bytes += used[j] * weight_bytes(m, cdt, EXPERT_W, s->E);
    }
    snprintf(what, sizeof what, "%s T=%d %s", s->name, T, fm);
    bench_steps(b, &c, lib, what, bytes);
    if (ab_var >= 0 && s->moe != KM_MOE_NONE) {
        static const char *const GU_W[] = {"gate_up", "gate", "up", NULL};
        static const char *const DN_W[] = {"down", NULL};
        const int32_t *rid = (const int32_t *)rt_interp_value(in, val(m, "ids"));
        char used[8192] = {0};
        int n_used = 0;
        for (int j = 0; j < T * s->K; j++) {
            n_used += !used[rid[j]];
            used[rid[j]] = 1;
        }
        snprintf(what, sizeof what, "%s T=%d %s", s->name, T, AB_VARIANTS[ab_var].name);
        ab_time(b, &c, lib, what, n_used * weight_bytes(m, cdt, GU_W, s->E),
                n_used * weight_bytes(m, cdt, DN_W, s->E));
    }
    cg_ctx_free(&c);
}

/* The A/B's copies of the expert weights of m (bound first, as all its
 * weights), ab_copies[1..] (ab_copies[0]: the originals). */
static void ab_copies_make(const ir_module *m, gk_bind *b, rt_interp *in, void *const *image)
{
    static const char *const EXPERT_W[] = {"gate_up", "gate", "up", "down"};
    for (int r = 1; r < AB_COPIES; r++) {
        ab_copies[r] = calloc((size_t)m->n_values, sizeof(void *));
        if (!ab_copies[r])
            exit(1);
    }
    for (int i = 0; i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        if (v->kind != IR_VALUE_WEIGHT)
            continue;
        bind_weight(b, in, v, image);
        int expert = 0;
        for (int k = 0; k < 4; k++)
            expert |= !strcmp(v->name, EXPERT_W[k]);
        size_t bytes = ir_weight_storage_bytes(m, v, b->cdt);
        for (int r = 1; expert && r < AB_COPIES; r++) {
            ab_copies[r][i] = dalloc(bytes);
            CK(cudaMemcpy(ab_copies[r][i], b->val[i], bytes, cudaMemcpyDeviceToDevice));
        }
    }
}

static void ab_copies_free(const ir_module *m)
{
    for (int r = 1; r < AB_COPIES; r++) {
        for (int i = 0; i < m->n_values; i++)
            if (ab_copies[r][i])
                CK(cudaFree(ab_copies[r][i]));
        free(ab_copies[r]);
        ab_copies[r] = NULL;
    }
}

/* Runs the routing, expert and fp8 linear kernels of s for each bucket of
 * tmask, with each choice of fp8 kernels in modes (bit m: FM(m)) on the
 * same inputs and the interpreter's one result, and compares ids
 * (exactly), weights, the expert and linear results and the argmax. With
 * vmask (the expert GEMMs' A/B, MOEC_KERN_MOE_AB): each choice once under
 * every variant of vmask (bit v: AB_VARIANTS[v]), each gate_up and down
 * step then timed in a CUDA graph (ab_time) over AB_COPIES copies of the
 * expert weights. */
static void moe_case_run(const km_spec *s, ir_dtype cdt, unsigned tmask, uint64_t seed,
                         unsigned modes, unsigned vmask)
{
    double t0 = now_s();
    ir_module *m = km_module(s);
    if (!m)
        exit(1);
    rt_interp *in = NULL;
    T_OK(rt_interp_init(m, NULL, TMAX, &in));
    if (!in)
        exit(1);
    uint64_t rng = seed;
    void **image = calloc((size_t)m->n_values, sizeof *image);
    if (!image)
        exit(1);
    fill_weights(in, m, cdt, s, &rng, image);
    gk_bind b;
    bind_init(&b, m, cdt);
    if (vmask)
        ab_copies_make(m, &b, in, image);
    double worst[3][3] = {{0}};
    for (int bi = 0; bi < N_BUCKETS; bi++) {
        if (!(tmask & (1u << bi)))
            continue;
        int T = BUCKETS[bi];
        int32_t tokens[TMAX], pos[TMAX];
        for (int t = 0; t < T; t++) {
            tokens[t] = irand(&rng, s->vocab);
            pos[t] = t;
        }
        T_OK(rt_interp_forward(in, tokens, pos, T, NULL));
        for (int f = 0; f < 3; f++)
            for (int v = vmask ? 0 : -1; (modes & FM(f)) && v < (vmask ? N_AB_VARIANTS : 0); v++)
                if (v < 0 || (vmask & (1u << v))) {
                    if (v >= 0)
                        ab_set(v);
                    moe_bucket(s, m, in, image, &b, cdt, T, f, worst[f]);
                }
        if (vmask)
            ab_set(-1);
    }
    for (int f = 0; f < 3; f++)
        if (modes & FM(f))
            printf("%-16s %s moe    fp8 %-4s%s worst error: weights %.2e, experts %.2e, linear "
                   "%.2e (%.1f s)\n",
                   s->name, ir_dtype_name(cdt), FP8_MODES[f], vmask ? " A/B" : "", worst[f][0],
                   worst[f][1], worst[f][2], now_s() - t0);
    if (vmask)
        ab_copies_free(m);
    for (int i = 0; i < m->n_values; i++)
        free(image[i]);
    free(image);
    bind_free(&b);
    rt_interp_free(in);
    ir_module_free(m);
}

static void moe_case_modes(const km_spec *s, ir_dtype cdt, unsigned tmask, uint64_t seed,
                           unsigned modes)
{
    moe_case_run(s, cdt, tmask, seed, modes, 0);
}

static void moe_case(const km_spec *s, ir_dtype cdt, unsigned tmask, uint64_t seed)
{
    moe_case_modes(s, cdt, tmask, seed, FM(CG_FP8_AUTO));
}

/* ---- attention: steps over several sequences and padding ------------------ */

#define MAX_SEQ 3

/* What the steps over several sequences share (attention, DSA, the MLA
 * prologue): the rows of each operand value of a step of T tokens, by
 * value id, as a row_source. */
static const float *rows_from_table(void *u, const ir_value *v)
{
    float *const *rows = u;
    if (!rows[v->id]) {
        fprintf(stderr, "no rows for %s\n", v->name);
        exit(1);
    }
    return rows[v->id];
}

/* rows[v->id] = the step's T rows of v: for a real token t (seq_of[t] >=
 * 0) interpreter in[seq_of[t]]'s row idx_of[t] when in is not NULL, else
 * (and for padding) random ones rounded to v's storage dtype. */
static void step_rows(float **rows, const gk_bind *b, rt_interp *const *in, const int *seq_of,
                      const int *idx_of, uint64_t *rng, const ir_value *v, int T)
{
    int w = (int)ir_type_numel(&v->type, 1);
    ir_dtype dt = storage(b, v);
    free(rows[v->id]);
    rows[v->id] = xmalloc((size_t)T * w * 4);
    for (int t = 0; t < T; t++) {
        float *r = rows[v->id] + (size_t)t * w;
        int q = seq_of[t];
        if (q >= 0 && in)
            memcpy(r, rt_interp_value(in[q], v) + (size_t)idx_of[t] * w, (size_t)w * 4);
        else
            for (int i = 0; i < w; i++)
                r[i] = round_to(dt, urand(rng, 1.7f));
    }
}

/* Interpreter in[q] runs ntok[q] new random tokens of its sequence, at
 * positions len[q] on. */
static void interps_step(rt_interp *const *in, int n_seq, const int *len, const int *ntok,
                         int vocab, uint64_t *rng)
{
    for (int q = 0; q < n_seq; q++) {
        if (!ntok[q])
            continue;
        int32_t tok[TMAX], pos[TMAX];
        for (int j = 0; j < ntok[q]; j++) {
            tok[j] = irand(rng, vocab);
            pos[j] = len[q] + j;
        }
        T_OK(rt_interp_forward(in[q], tok, pos, ntok[q], NULL));
    }
}

/* A cache of two pools of `pages` pages of bs rows, w0 and w1 elements a
 * row, poisoned (0xff: NaN, so that a read of an unwritten row shows, and a
 * write where none belongs too), the positions and slots inputs, and an
 * empty rows table for m's values: what the steps over several sequences
 * bind. */
static float **bind_paged_cache(gk_bind *b, const ir_module *m, ir_dtype cdt, int pages, int bs,
                                int w0, int w1)
{
    size_t esz = ir_dtype_size(cdt);
    for (int i = 0; i < 2; i++) {
        size_t bytes = (size_t)pages * bs * (i ? w1 : w0) * esz;
        b->kv[i] = dalloc(bytes);
        CK(cudaMemset(b->kv[i], 0xff, bytes));
    }
    b->input[IR_INPUT_POSITIONS] = dalloc(TMAX * 4);
    b->input[IR_INPUT_SLOTS] = dalloc(TMAX * 4);
    float **rows = calloc((size_t)m->n_values, sizeof *rows);
    if (!rows)
        exit(1);
    return rows;
}

/* Frees what bind_paged_cache bound (b and its pools, the rows table) and
 * the env's module m. */
static void free_paged_cache(gk_bind *b, float **rows, ir_module *m)
{
    for (int i = 0; i < m->n_values; i++)
        free(rows[i]);
    free(rows);
    bind_free(b);
    ir_module_free(m);
}

/* Runs a step of bucket T whose operands' rows are in `rows`: random
 * logits for the argmax's %out, positions and slots uploaded, the heavy
 * ops generated into *c (the caller frees it), their values bound and
 * launched, the n_seq lengths advanced by ntok, the argmax checked. */
static void run_step(gk_bind *b, const ir_module *m, ir_dtype cdt, int bs, cudaLibrary_t lib,
                     float **rows, uint64_t *rng, const int *pos_of, const int *slots, int T,
                     int n_seq, int *len, const int *ntok, const char *what, cg_ctx *c)
{
    const ir_value *outv = val(m, "out");
    free(rows[outv->id]);
    rows[outv->id] = xmalloc((size_t)T * 40 * 4);
    for (size_t i = 0; i < (size_t)T * 40; i++)
        rows[outv->id][i] = urand(rng, 1.0f);
    CK(cudaMemcpy(b->input[IR_INPUT_POSITIONS], pos_of, (size_t)T * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b->input[IR_INPUT_SLOTS], slots, (size_t)T * 4, cudaMemcpyHostToDevice));
    cg_options o;
    options_for(&o, cdt, bs, CG_FP8_AUTO);
    T_OK(gen(m, &o, T, c));
    bind_step_values(b, c, rows_from_table, rows);
    launch_steps(b, c, lib);
    for (int q = 0; q < n_seq; q++)
        len[q] += ntok[q];
    check_sampled(b, rows[outv->id], T, 40, what);
}

typedef struct attn_env {
    const km_spec *s;
    ir_module *m;
    ir_dtype cdt;
    int bs, n_seq, max_len, use_interp;
    int len[MAX_SEQ];
    float *hist0[MAX_SEQ], *hist1[MAX_SEQ]; /* cached rows: k, v (or kv_c, k_pe) */
    int row0, row1;                         /* their widths */
    rt_interp *in[MAX_SEQ];
    gk_bind b;
    cudaLibrary_t lib;
    uint64_t rng;
    /* this step's rows per operand value id (T rows), and the token map */
    float **rows;
    int seq_of[TMAX], idx_of[TMAX], pos_of[TMAX];
    double worst_gpu, worst_ref;
} attn_env;

static int is_mla(const attn_env *e) { return e->s->attn == KM_MLA; }

/* The reference attention of one token of sequence sq at position p (the
 * interpreter's formulas: double dots, fp32 logits, double softmax). */
static void ref_token(const attn_env *e, int sq, int p, const float *q0, const float *q1,
                      float *out)
{
    const km_spec *s = e->s;
    float scale = (float)s->attn_scale;
    int lo = s->window > 0 && p - s->window + 1 > 0 ? p - s->window + 1 : 0;
    double *sc = xmalloc((size_t)(p + 1) * sizeof *sc);
    const float *h0 = e->hist0[sq], *h1 = e->hist1[sq];
    for (int h = 0; h < s->H; h++) {
        double mx = -INFINITY;
        int kvh = is_mla(e) ? 0 : h / (s->H / s->HKV);
        for (int j = lo; j <= p; j++) {
            double dot = 0;
            if (is_mla(e)) {
                for (int i = 0; i < s->R; i++)
                    dot += (double)q0[(size_t)h * s->R + i] * h0[(size_t)j * e->row0 + i];
                for (int i = 0; i < s->DR; i++)
                    dot += (double)q1[(size_t)h * s->DR + i] * h1[(size_t)j * e->row1 + i];
            } else {
                for (int i = 0; i < s->DK; i++)
                    dot += (double)q0[(size_t)h * s->DK + i] *
                           h0[(size_t)j * e->row0 + (size_t)kvh * s->DK + i];
            }
            sc[j] = (double)((float)dot * scale);
            mx = fmax(mx, sc[j]);
        }
        double sum = 0;
        for (int j = lo; j <= p; j++) {
            sc[j] = exp(sc[j] - mx);
            sum += sc[j];
        }
        int dv = is_mla(e) ? s->R : s->DV;
        const float *vb = is_mla(e) ? h0 : h1 + (size_t)kvh * s->DV;
        int vstride = is_mla(e) ? e->row0 : e->row1;
        for (int i = 0; i < dv; i++) {
            double acc = 0;
            for (int j = lo; j <= p; j++)
                acc += sc[j] * vb[(size_t)j * vstride + i];
            out[(size_t)h * dv + i] = (float)(acc / sum);
        }
    }
    free(sc);
}

/* One interpreter per sequence (n of them, for max_len tokens), all with
 * the same random weights. */
static void interps_init(rt_interp **in, int n, const ir_module *m, ir_dtype cdt,
                         const km_spec *s, int max_len, uint64_t *rng)
{
    for (int q = 0; q < n; q++) {
        T_OK(rt_interp_init(m, NULL, max_len, &in[q]));
        if (!in[q])
            exit(1);
    }
    fill_weights(in[0], m, cdt, s, rng, NULL); /* no fp8 weights */
    for (int i = 0; i < m->n_values; i++)
        if (m->values[i]->kind == IR_VALUE_WEIGHT)
            for (int q = 1; q < n; q++)
                T_OK(rt_interp_set_weight(in[q], m->values[i], rt_interp_weight(in[0], m->values[i])));
}

/* The block table of MAX_SEQ sequences of max_len tokens in pages of bs:
 * every page of every sequence shuffled over the pools; returns the pages. */
static int bind_block_table(gk_bind *b, uint64_t *rng, int max_len, int bs)
{
    int mb = (max_len + bs - 1) / bs, pages = mb * MAX_SEQ;
    b->max_blocks = mb;
    int *bt = xmalloc((size_t)pages * 4);
    for (int i = 0; i < pages; i++)
        bt[i] = i;
    for (int i = pages - 1; i > 0; i--) {
        int j = irand(rng, i + 1), t = bt[i];
        bt[i] = bt[j];
        bt[j] = t;
    }
    b->input[IR_INPUT_BLOCK_TABLE] = dalloc((size_t)pages * 4);
    CK(cudaMemcpy(b->input[IR_INPUT_BLOCK_TABLE], bt, (size_t)pages * 4, cudaMemcpyHostToDevice));
    free(bt);
    return pages;
}

/* The short runs' steps of two sequences: chunks a then b in bucket T0
 * (prefill crossing pages, mixed with padding), then decode steps in
 * buckets 8, 1 and 2, each checked. */
static void short_steps(void (*step)(void *, int, const int *, int), void *u, int T0, const int *a,
                        const int *b)
{
    static const int d[2] = {1, 1}, d1[2] = {0, 1};
    step(u, T0, a, 1);
    step(u, T0, b, 1);
    step(u, 8, d, 1);
    step(u, 1, d1, 1);
    step(u, 2, d1, 1);
}

/* The longest of three sequences of lens[] tokens, with room for decode steps. */
static int long_max_len(const int *lens)
{
    int mx = 0;
    for (int q = 0; q < 3; q++)
        mx = lens[q] + 4 > mx ? lens[q] + 4 : mx;
    return mx;
}

/* Fills three sequences to lens[] tokens (len[]: so far) by steps of 64
 * tokens of step(u, 64, ntok, 0). */
static void fill_sequences(void (*step)(void *, int, const int *, int), void *u, const int *len,
                           const int *lens)
{
    for (;;) {
        int n[3], tot = 0;
        for (int q = 0; q < 3; q++) {
            n[q] = lens[q] - len[q] < 64 - tot ? lens[q] - len[q] : 64 - tot;
            tot += n[q];
        }
        if (!tot)
            break;
        step(u, 64, n, 0);
    }
}

static void attn_init(attn_env *e, const km_spec *s, ir_dtype cdt, int bs, int n_seq, int max_len,
                      int use_interp, uint64_t seed)
{
    memset(e, 0, sizeof *e);
    e->s = s;
    e->cdt = cdt;
    e->bs = bs;
    e->n_seq = n_seq;
    e->max_len = max_len;
    e->use_interp = use_interp;
    e->rng = seed;
    e->m = km_module(s);
    if (!e->m)
        exit(1);
    e->row0 = is_mla(e) ? s->R : s->HKV * s->DK;
    e->row1 = is_mla(e) ? s->DR : s->HKV * s->DV;
    for (int q = 0; q < n_seq; q++) {
        e->hist0[q] = xmalloc((size_t)max_len * e->row0 * 4);
        e->hist1[q] = xmalloc((size_t)max_len * e->row1 * 4);
    }
    if (use_interp)
        interps_init(e->in, n_seq, e->m, cdt, s, max_len, &e->rng);
    bind_init(&e->b, e->m, cdt);
    e->lib = prog_lib(s, cdt, bs);
    int pages = bind_block_table(&e->b, &e->rng, max_len, bs);
    e->rows = bind_paged_cache(&e->b, e->m, cdt, pages, bs, e->row0, e->row1);
}

static void attn_free(attn_env *e)
{
    printf("%-16s %s attn   worst error: gpu %.2e, reference vs interpreter %.2e\n", e->s->name,
           ir_dtype_name(e->cdt), e->worst_gpu, e->worst_ref);
    for (int q = 0; q < e->n_seq; q++) {
        free(e->hist0[q]);
        free(e->hist1[q]);
        rt_interp_free(e->in[q]);
    }
    free_paged_cache(&e->b, e->rows, e->m);
}

/* The tokens of a step of bucket T: ntok[q] new ones of sequence q (of
 * len[q] so far), padding (sequence -1, slot -1, a random position below
 * max_len) for the rest, all shuffled: each token's sequence, index among
 * its sequence's new tokens, position and slot. */
static void assign_tokens(uint64_t *rng, int T, int n_seq, const int *len, const int *ntok,
                          int max_len, int *seq_of, int *idx_of, int *pos_of, int *slots)
{
    int n = 0;
    for (int q = 0; q < n_seq; q++)
        for (int j = 0; j < ntok[q]; j++) {
            seq_of[n] = q;
            idx_of[n++] = j;
        }
    if (n > T) {
        fprintf(stderr, "a step of %d tokens in bucket %d\n", n, T);
        exit(1);
    }
    for (; n < T; n++)
        seq_of[n] = -1;
    for (int i = T - 1; i > 0; i--) {
        int j = irand(rng, i + 1), a = seq_of[i], b = idx_of[i];
        seq_of[i] = seq_of[j];
        idx_of[i] = idx_of[j];
        seq_of[j] = a;
        idx_of[j] = b;
    }
    for (int t = 0; t < T; t++) {
        int q = seq_of[t];
        pos_of[t] = q < 0 ? irand(rng, max_len) : len[q] + idx_of[t];
        slots[t] = q;
    }
}

/* One step of bucket T: ntok[q] new tokens of sequence q, padding for the
 * rest, all shuffled; compare: 0 no check, 1 against the reference (and the
 * interpreter, with the reference checked against it). */
static void attn_step(attn_env *e, int T, const int *ntok, int compare)
{
    const km_spec *s = e->s;
    const ir_module *m = e->m;
    int slots[TMAX];
    assign_tokens(&e->rng, T, e->n_seq, e->len, ntok, e->max_len, e->seq_of, e->idx_of, e->pos_of,
                  slots);
    if (e->use_interp)
        interps_step(e->in, e->n_seq, e->len, ntok, s->vocab, &e->rng);
    /* the attention op's operands: from the interpreters or random */
    const ir_op *op = NULL;
    for (int k = 0; k < m->n_ops; k++)
        if (m->ops[k]->kind == IR_OP_ATTENTION || m->ops[k]->kind == IR_OP_MLA_ATTENTION)
            op = m->ops[k];
    int n_opnd = is_mla(e) ? 4 : 3;
    for (int a = 0; a < n_opnd; a++)
        step_rows(e->rows, &e->b, e->use_interp ? e->in : NULL, e->seq_of, e->idx_of, &e->rng,
                  op->in[a], T);
    /* what the cache now holds */
    for (int t = 0; t < T; t++) {
        int q = e->seq_of[t];
        if (q < 0)
            continue;
        const ir_value *c0 = op->in[is_mla(e) ? 2 : 1], *c1 = op->in[is_mla(e) ? 3 : 2];
        memcpy(e->hist0[q] + (size_t)e->pos_of[t] * e->row0, e->rows[c0->id] + (size_t)t * e->row0,
               (size_t)e->row0 * 4);
        memcpy(e->hist1[q] + (size_t)e->pos_of[t] * e->row1, e->rows[c1->id] + (size_t)t * e->row1,
               (size_t)e->row1 * 4);
    }
    char what[160];
    snprintf(what, sizeof what, "%s T=%d", s->name, T);
    cg_ctx c;
    run_step(&e->b, m, e->cdt, e->bs, e->lib, e->rows, &e->rng, e->pos_of, slots, T, e->n_seq,
             e->len, ntok, what, &c);
    const ir_value *res = op->out[0];
    int w = (int)ir_type_numel(&res->type, 1);
    float *gpu = xmalloc((size_t)T * w * 4);
    download(gpu, storage(&e->b, res), e->b.val[res->id], (size_t)T * w);
    if (compare) {
        int pads_ok = 1, n_real = 0;
        float *g = xmalloc((size_t)T * w * 4), *r = xmalloc((size_t)T * w * 4),
              *ri = xmalloc((size_t)T * w * 4);
        for (int t = 0; t < T; t++) {
            int q = e->seq_of[t];
            if (q < 0) {
                for (int i = 0; i < w; i++)
                    pads_ok &= gpu[(size_t)t * w + i] == 0.0f;
                continue;
            }
            const float *q0 = e->rows[op->in[0]->id] + (size_t)t * (size_t)ir_type_numel(&op->in[0]->type, 1);
            const float *q1 = is_mla(e) ? e->rows[op->in[1]->id] + (size_t)t * (size_t)ir_type_numel(&op->in[1]->type, 1) : NULL;
            ref_token(e, q, e->pos_of[t], q0, q1, r + (size_t)n_real * w);
            memcpy(g + (size_t)n_real * w, gpu + (size_t)t * w, (size_t)w * 4);
            if (e->use_interp)
                memcpy(ri + (size_t)n_real * w, rt_interp_value(e->in[q], res) + (size_t)e->idx_of[t] * w,
                       (size_t)w * 4);
            n_real++;
        }
        T_CHECK(pads_ok);
        if (!pads_ok)
            fprintf(stderr, "FAIL %s: a padding token's attention output is not zero\n", what);
        double tol = e->cdt == IR_DTYPE_BF16 ? TOL_BF16 : TOL_F32;
        if (e->use_interp) {
            char w2[200];
            snprintf(w2, sizeof w2, "%s reference vs interpreter", what);
            e->worst_ref = fmax(e->worst_ref, compare_rows(w2, r, ri, n_real, w, 1e-5));
            e->worst_gpu = fmax(e->worst_gpu, compare_rows(what, g, ri, n_real, w, tol));
        } else {
            e->worst_gpu = fmax(e->worst_gpu, compare_rows(what, g, r, n_real, w, tol));
        }
        free(g);
        free(r);
        free(ri);
    }
    free(gpu);
    cg_ctx_free(&c);
}

static void attn_step_any(void *e, int T, const int *ntok, int compare)
{
    attn_step(e, T, ntok, compare);
}

/* Short runs against the interpreter: two sequences of prefill chunks that
 * cross pages, mixed with padding, then decode steps. */
static void attn_case_interp(const km_spec *s, ir_dtype cdt, int bs, int big)
{
    double t0 = now_s();
    attn_env e;
    attn_init(&e, s, cdt, bs, 2, 160, 1, 0x5eed0000u + (uint64_t)s->H * 7 + (uint64_t)cdt);
    int a[2] = {big ? 40 : 7, big ? 20 : 5}, b2[2] = {big ? 30 : 9, big ? 34 : 4};
    short_steps(attn_step_any, &e, big ? 64 : 16, a, b2);
    attn_free(&e);
    printf("%-16s %s attn   (interpreter, %.1f s)\n", s->name, ir_dtype_name(cdt), now_s() - t0);
}

/* The long contexts' lengths of each attention family (attn_case_long):
 * Qwen3's GQA, the MLA's, and the odd shapes'. */
static const int LONG_Q3[3] = {2100, 700, 64}, LONG_MLA[3] = {1500, 300, 65},
                 LONG_ODD[3] = {200, 33, 16};

/* Long contexts against the reference: three sequences filled by steps of
 * 64 random tokens, then decode steps. */
static void attn_case_long(const km_spec *s, ir_dtype cdt, int bs, const int *lens)
{
    double t0 = now_s();
    attn_env e;
    attn_init(&e, s, cdt, bs, 3, long_max_len(lens), 0, 0x10c0000u + (uint64_t)s->H);
    fill_sequences(attn_step_any, &e, e.len, lens);
    int d[3] = {1, 1, 1};
    attn_step(&e, 8, d, 1);
    if (getenv("MOEC_KERN_BENCH")) {
        cg_options o;
        options_for(&o, cdt, bs, CG_FP8_AUTO);
        cg_ctx c;
        T_OK(gen(e.m, &o, 8, &c));
        bench_steps(&e.b, &c, e.lib, "T=8 long", 0);
        cg_ctx_free(&c);
    }
    int d1[3] = {1, 0, 0};
    attn_step(&e, 1, d1, 1);
    attn_free(&e);
    printf("%-16s %s attn   (long: %d, %d, %d positions, %.1f s)\n", s->name, ir_dtype_name(cdt),
           lens[0], lens[1], lens[2], now_s() - t0);
}

/* Value v on the GPU against the interpreters' for the real tokens of the
 * step (token t of sequence seq_of[t] >= 0: row idx_of[t] of in[seq_of[t]]);
 * the worst error. */
static double compare_real_rows(const gk_bind *b, rt_interp *const *in, const int *seq_of,
                                const int *idx_of, const ir_value *v, int T, ir_dtype cdt,
                                const char *what)
{
    int w = (int)ir_type_numel(&v->type, 1), n = 0;
    float *gpu = xmalloc((size_t)T * w * 4), *g = xmalloc((size_t)T * w * 4),
          *r = xmalloc((size_t)T * w * 4);
    download(gpu, storage(b, v), b->val[v->id], (size_t)T * w);
    for (int t = 0; t < T; t++) {
        int q = seq_of[t];
        if (q < 0)
            continue;
        memcpy(g + (size_t)n * w, gpu + (size_t)t * w, (size_t)w * 4);
        memcpy(r + (size_t)n * w, rt_interp_value(in[q], v) + (size_t)idx_of[t] * w,
               (size_t)w * 4);
        n++;
    }
    char w2[320];
    snprintf(w2, sizeof w2, "%s %%%s", what, v->name);
    double err = compare_rows(w2, g, r, n, w, cdt == IR_DTYPE_BF16 ? TOL_BF16 : TOL_F32);
    free(gpu);
    free(g);
    free(r);
    return err;
}

/* One KV pool of `pages` pages of bs rows of w elements (cdt): the row of
 * each sequence q's position p < len[q] within tol of hist[q] + p * w (the
 * interpreter's); every row no sequence owns, or past its length, all
 * poison bytes (0xff): padding tokens wrote nothing. The worst error into
 * *worst, the rows checked added to *checked. */
static void check_pool(const gk_bind *b, const void *pool, int pages, int bs, int n_seq,
                       const int *len, int max_len, int w, ir_dtype cdt, float *const *hist,
                       const char *what, const char *name, double *worst, int *checked)
{
    int mb = b->max_blocks;
    int *bt = xmalloc((size_t)pages * 4);
    CK(cudaMemcpy(bt, b->input[IR_INPUT_BLOCK_TABLE], (size_t)pages * 4, cudaMemcpyDeviceToHost));
    /* the owner of each pool row: sequence * max_len + position, or -1 */
    int rows = pages * bs;
    int *owner = xmalloc((size_t)rows * sizeof *owner);
    for (int i = 0; i < rows; i++)
        owner[i] = -1;
    for (int q = 0; q < n_seq; q++)
        for (int p = 0; p < len[q]; p++)
            owner[bt[q * mb + p / bs] * bs + p % bs] = q * max_len + p;
    size_t esz = ir_dtype_size(cdt);
    int stray = 0;
    unsigned char *raw = xmalloc((size_t)rows * w * esz);
    CK(cudaMemcpy(raw, pool, (size_t)rows * w * esz, cudaMemcpyDeviceToHost));
    float *got = xmalloc((size_t)w * 4);
    for (int row = 0; row < rows; row++) {
        const unsigned char *rb = raw + (size_t)row * w * esz;
        if (owner[row] < 0) {
            for (size_t k = 0; k < (size_t)w * esz; k++)
                stray += rb[k] != 0xff;
            continue;
        }
        int q = owner[row] / max_len, p = owner[row] % max_len;
        if (cdt == IR_DTYPE_BF16)
            for (int k = 0; k < w; k++) {
                uint16_t h;
                memcpy(&h, rb + 2 * k, 2);
                got[k] = bf2f(h);
            }
        else
            memcpy(got, rb, (size_t)w * 4);
        char w2[320];
        snprintf(w2, sizeof w2, "%s cache %s of sequence %d position %d", what, name, q, p);
        double tol = cdt == IR_DTYPE_BF16 ? TOL_BF16 : TOL_F32;
        *worst = fmax(*worst, compare_rows(w2, got, hist[q] + (size_t)p * w, 1, w, tol));
        (*checked)++;
    }
    free(got);
    free(raw);
    T_CHECK(stray == 0);
    if (stray)
        fprintf(stderr, "FAIL %s: %d bytes of %s cache rows no sequence owns were written\n", what,
                stray, name);
    free(owner);
    free(bt);
}

/* ---- DSA: the indexer's selection, then the sparse MLA over it ------------ */

/* Steps of several sequences with padding over a shuffled paged cache, as
 * for attention, through dsa_topk (its key cache: pool 0; its index-score
 * rows: pool 1) and the mla_attention that reads its selection. Every real
 * token's selection must equal the interpreter's (short runs) or this
 * file's reference (long contexts) exactly, a padding token's be all -1;
 * the attention output must agree within the dtype's tolerance. */
typedef struct dsa_env {
    const km_spec *s;
    ir_module *m;
    const ir_op *dsa, *mla;
    ir_dtype cdt;
    int bs, n_seq, max_len, use_interp;
    int len[MAX_SEQ];
    rt_interp *in[MAX_SEQ];
    float *hist[MAX_SEQ][3]; /* cached rows of each sequence: ik [DI], kv_c [R], k_pe [DR] */
    int hw[3];
    gk_bind b;
    cudaLibrary_t lib;
    uint64_t rng;
    float **rows;
    int seq_of[TMAX], idx_of[TMAX], pos_of[TMAX];
    double worst_gpu, worst_ref, min_gap;
    int checked, sel_bad;
    /* the fused indexer (s->IRD > 0): the key pool's pages, the worst error
       of dsa_prologue_k's keys (its result and its cache rows) */
    int pages, key_rows, near_ties;
    double worst_key;
} dsa_env;

static int dsa_fused(const dsa_env *e) { return e->s->IRD > 0; }

typedef struct dsa_scored {
    double s;
    int p;
} dsa_scored;

/* Descending scores, a NaN above everything, ties to the lower position
 * (the interpreter's order). */
static int dsa_scored_cmp(const void *pa, const void *pb)
{
    const dsa_scored *a = pa, *b = pb;
    int na = isnan(a->s), nb = isnan(b->s);
    if (na != nb)
        return na ? -1 : 1;
    if (!na && a->s != b->s)
        return a->s > b->s ? -1 : 1;
    return (a->p > b->p) - (a->p < b->p);
}

/* The index score of key k for a token's indexer q [HI, DI] and head
 * weights w [HI]: the interpreter's definition (runtime/interp.c). */
static float dsa_score_of(const float *q, const float *w, const float *k, int HI, int DI,
                          double scale, double wscale)
{
    double acc = 0;
    for (int h = 0; h < HI; h++) {
        double dot = 0;
        for (int i = 0; i < DI; i++)
            dot += (double)q[(size_t)h * DI + i] * k[i];
        float sh = (float)dot * (float)scale;
        acc += (double)(w[h] * (float)wscale) * (sh > 0 ? sh : 0.0f);
    }
    return (float)acc;
}

/* The selection of n scores (K of them, ascending; NaN above all, ties to
 * the lower position), as the interpreter's; the relative gap between the
 * K-th and the next score into *gap (0 on a tie). */
static void dsa_select_of(const float *sc, int n, int K, int *sel, double *gap)
{
    dsa_scored *c = xmalloc((size_t)n * sizeof *c);
    double big = 0;
    for (int i = 0; i < n; i++) {
        c[i].s = sc[i];
        c[i].p = i;
        if (isfinite(sc[i]))
            big = fmax(big, fabs(sc[i]));
    }
    qsort(c, (size_t)n, sizeof *c, dsa_scored_cmp);
    *gap = isfinite(c[K - 1].s) && isfinite(c[K].s) ? (c[K - 1].s - c[K].s) / (big > 0 ? big : 1) : 0;
    char *mark = calloc((size_t)n, 1);
    if (!mark)
        exit(1);
    for (int i = 0; i < K; i++)
        mark[c[i].p] = 1;
    for (int i = 0, o = 0; i < n; i++)
        if (mark[i])
            sel[o++] = i;
    free(mark);
    free(c);
}

/* The selection of a token of sequence sq at position p (its indexer q
 * [HI, DI] and weights [HI]): the interpreter's definition in double; the
 * relative gap at the top-k boundary into *gap. Returns n = min(K, p + 1). */
static int dsa_ref_select(const dsa_env *e, int sq, int p, const float *iq, const float *iw,
                          int *sel, double *gap, float *scores)
{
    const km_spec *s = e->s;
    int K = s->TOPK, n = p + 1;
    *gap = INFINITY;
    if (n <= K) {
        for (int i = 0; i < K; i++)
            sel[i] = i < n ? i : -1;
        return n;
    }
    float *sc = scores ? scores : xmalloc((size_t)n * sizeof *sc);
    for (int j = 0; j < n; j++)
        sc[j] = dsa_score_of(iq, iw, e->hist[sq][0] + (size_t)j * s->DI, s->HI, s->DI,
                             s->dsa_scale, s->dsa_wscale);
    dsa_select_of(sc, n, K, sel, gap);
    if (!scores)
        free(sc);
    return K;
}

/* The fused form rounds q after its rotation and the keys after their
 * norm and rotation to the storage dtype (and sums in another order),
 * where the interpreter keeps fp32: a selection may differ from the
 * interpreter's at a near-tie. 1 when every position
 * got holds and want does not scores within tol of the largest score of
 * the top_k-th's (sc: the reference scores of the n positions), and at
 * most max(1, K / 8) of them. */
static int dsa_near_tie(const int *got, const int *want, int K, const float *sc, int n, double tol)
{
    double big = 0, kth = INFINITY;
    for (int i = 0; i < n; i++)
        big = fmax(big, fabs(sc[i]));
    for (int i = 0; i < K; i++)
        if (want[i] >= 0)
            kth = fmin(kth, sc[want[i]]);
    int extra = 0;
    for (int i = 0; i < K; i++) {
        int in = 0;
        for (int j = 0; j < K && !in; j++)
            in = got[i] == want[j];
        if (in)
            continue;
        if (got[i] < 0 || got[i] >= n || !(sc[got[i]] >= kth - tol * big))
            return 0;
        extra++;
    }
    return extra <= (K / 8 > 1 ? K / 8 : 1);
}

/* The sparse MLA attention of a token of sequence sq over sel[0..n-1]. */
static void dsa_ref_attn(const dsa_env *e, int sq, const int *sel, int n, const float *qc,
                         const float *qpe, float *out)
{
    const km_spec *s = e->s;
    float scale = (float)s->attn_scale;
    double *sc = xmalloc((size_t)n * sizeof *sc);
    const float *kv = e->hist[sq][1], *pe = e->hist[sq][2];
    for (int h = 0; h < s->H; h++) {
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < n; i++) {
            double dot = 0;
            for (int j = 0; j < s->R; j++)
                dot += (double)qc[(size_t)h * s->R + j] * kv[(size_t)sel[i] * s->R + j];
            for (int j = 0; j < s->DR; j++)
                dot += (double)qpe[(size_t)h * s->DR + j] * pe[(size_t)sel[i] * s->DR + j];
            sc[i] = (double)((float)dot * scale);
            mx = fmax(mx, sc[i]);
        }
        for (int i = 0; i < n; i++)
            sum += sc[i] = exp(sc[i] - mx);
        for (int j = 0; j < s->R; j++) {
            double acc = 0;
            for (int i = 0; i < n; i++)
                acc += sc[i] * kv[(size_t)sel[i] * s->R + j];
            out[(size_t)h * s->R + j] = (float)(acc / sum);
        }
    }
    free(sc);
}

static void dsa_init(dsa_env *e, const km_spec *s, ir_dtype cdt, int bs, int n_seq, int max_len,
                     int use_interp, uint64_t seed)
{
    memset(e, 0, sizeof *e);
    e->s = s;
    e->cdt = cdt;
    e->bs = bs;
    e->n_seq = n_seq;
    e->max_len = max_len;
    e->use_interp = use_interp;
    e->rng = seed;
    e->min_gap = INFINITY;
    e->m = km_module(s);
    if (!e->m)
        exit(1);
    for (int k = 0; k < e->m->n_ops; k++) {
        if (e->m->ops[k]->kind == IR_OP_DSA_TOPK)
            e->dsa = e->m->ops[k];
        if (e->m->ops[k]->kind == IR_OP_MLA_ATTENTION)
            e->mla = e->m->ops[k];
    }
    e->hw[0] = s->DI;
    e->hw[1] = s->R;
    e->hw[2] = s->DR;
    for (int q = 0; q < n_seq; q++)
        for (int i = 0; i < 3; i++)
            e->hist[q][i] = xmalloc((size_t)max_len * e->hw[i] * 4);
    if (use_interp)
        interps_init(e->in, n_seq, e->m, cdt, s, max_len, &e->rng);
    bind_init(&e->b, e->m, cdt);
    /* the fused indexer's LayerNorm weights (checked against the interpreter only) */
    if (dsa_fused(e)) {
        if (!use_interp) {
            fprintf(stderr, "%s: the fused indexer is checked against the interpreter only\n",
                    s->name);
            exit(1);
        }
        for (int i = 0; i < e->m->n_values; i++)
            if (e->m->values[i]->kind == IR_VALUE_WEIGHT && !strstr(e->m->values[i]->name, "tab_"))
                bind_weight(&e->b, e->in[0], e->m->values[i], NULL);
    }
    e->lib = prog_lib(s, cdt, bs);
    int pages = bind_block_table(&e->b, &e->rng, max_len, bs), mb = e->b.max_blocks;
    e->pages = pages;
    /* the pools, NaN-poisoned: keys, scores of TMAX tokens, kv_c, k_pe */
    size_t esz = ir_dtype_size(cdt);
    e->b.kv_by_op = calloc(2 * (size_t)e->m->n_ops, sizeof *e->b.kv_by_op);
    if (!e->b.kv_by_op)
        exit(1);
    size_t bytes[4] = {(size_t)pages * bs * s->DI * esz, (size_t)TMAX * mb * bs * 4,
                       (size_t)pages * bs * s->R * esz, (size_t)pages * bs * s->DR * esz};
    int at[4] = {2 * e->dsa->id, 2 * e->dsa->id + 1, 2 * e->mla->id, 2 * e->mla->id + 1};
    for (int i = 0; i < 4; i++) {
        e->b.kv_by_op[at[i]] = dalloc(bytes[i]);
        CK(cudaMemset(e->b.kv_by_op[at[i]], 0xff, bytes[i]));
    }
    e->b.input[IR_INPUT_POSITIONS] = dalloc(TMAX * 4);
    e->b.input[IR_INPUT_SLOTS] = dalloc(TMAX * 4);
    e->rows = calloc((size_t)e->m->n_values, sizeof *e->rows);
    if (!e->rows)
        exit(1);
}

static void dsa_free(dsa_env *e)
{
    printf("%-16s %s dsa    %d selections checked, %d wrong; smallest top-k gap %.2g; attention "
           "worst error: gpu %.2e, reference vs interpreter %.2e\n",
           e->s->name, ir_dtype_name(e->cdt), e->checked, e->sel_bad, e->min_gap, e->worst_gpu,
           e->worst_ref);
    if (dsa_fused(e))
        printf("%-16s %s dsa    fused: dsa_prologue_k's keys worst error %.2e (results and %d "
               "cache rows); %d selections differ from the interpreter's at a near-tie\n",
               e->s->name, ir_dtype_name(e->cdt), e->worst_key, e->key_rows, e->near_ties);
    for (int q = 0; q < e->n_seq; q++) {
        for (int i = 0; i < 3; i++)
            free(e->hist[q][i]);
        rt_interp_free(e->in[q]);
    }
    free_paged_cache(&e->b, e->rows, e->m);
}

/* The step's rows of operand v (T of them): the interpreters' for real
 * tokens, random (rounded to the storage dtype) otherwise. */
static void dsa_operand_rows(dsa_env *e, const ir_value *v, int T)
{
    step_rows(e->rows, &e->b, e->use_interp ? e->in : NULL, e->seq_of, e->idx_of, &e->rng, v, T);
}

/* Checks token t's selection (GPU row got) and attention output (GPU row o)
 * against the interpreter's or the reference's; the reference against the
 * interpreter when both are there. */
static void dsa_check_token(dsa_env *e, int t, const int *got, const float *o, const char *what)
{
    const km_spec *s = e->s;
    int q = e->seq_of[t], K = s->TOPK, W = s->H * s->R;
    int *ref = xmalloc((size_t)K * sizeof *ref);
    double gap;
    float *ro = xmalloc((size_t)W * 4), *sc = xmalloc((size_t)(e->pos_of[t] + 1) * sizeof *sc);
    /* the fused form: q rotated by the module's reference rope op (the
       interpreter's), the head weights at their columns of the key's row */
    const float *iq = e->rows[e->dsa->in[0]->id] + (size_t)t * s->HI * s->DI;
    const float *iw = e->rows[e->dsa->in[2]->id] + (size_t)t * s->HI;
    if (dsa_fused(e)) {
        iq = rt_interp_value(e->in[q], val(e->m, "iq_rot_ref")) + (size_t)e->idx_of[t] * s->HI * s->DI;
        iw = e->rows[e->dsa->in[2]->id] + (size_t)t * (s->IPRE + s->DI + s->HI) + s->IPRE + s->DI;
    }
    int n = dsa_ref_select(e, q, e->pos_of[t], iq, iw, ref, &gap, sc);
    e->min_gap = fmin(e->min_gap, gap);
    dsa_ref_attn(e, q, ref, n, e->rows[e->mla->in[0]->id] + (size_t)t * W,
                 e->rows[e->mla->in[1]->id] + (size_t)t * s->H * s->DR, ro);
    const int *want = ref;
    const float *want_o = ro;
    if (e->use_interp) {
        const int32_t *isel =
            (const int32_t *)rt_interp_value(e->in[q], e->dsa->out[0]) + (size_t)e->idx_of[t] * K;
        const float *io = rt_interp_value(e->in[q], e->mla->out[0]) + (size_t)e->idx_of[t] * W;
        int same = !memcmp(isel, ref, (size_t)K * sizeof *ref);
        T_CHECK(same);
        if (!same)
            fprintf(stderr, "FAIL %s: token %d: this file's reference selection differs from "
                            "the interpreter's\n", what, t);
        char w2[200];
        snprintf(w2, sizeof w2, "%s token %d reference vs interpreter", what, t);
        e->worst_ref = fmax(e->worst_ref, compare_rows(w2, ro, io, 1, W, 1e-5));
        want = isel;
        want_o = io;
    }
    e->checked++;
    int bad = -1;
    for (int i = 0; i < K && bad < 0; i++)
        if (got[i] != want[i])
            bad = i;
    if (bad >= 0 && dsa_fused(e) && n == K &&
        dsa_near_tie(got, want, K, sc, e->pos_of[t] + 1,
                     e->cdt == IR_DTYPE_BF16 ? TOL_BF16 : TOL_F32)) {
        e->near_ties++;
    } else if (bad >= 0) {
        e->sel_bad++;
        t_checks++;
        t_failures++;
        fprintf(stderr,
                "FAIL %s: token %d (sequence %d, position %d): selection [%d] is %d on the GPU, "
                "%d wanted (of %d chosen; top-k boundary gap %.3g of the largest score)\n",
                what, t, q, e->pos_of[t], bad, got[bad], want[bad], n, gap);
    } else {
        char w2[200];
        snprintf(w2, sizeof w2, "%s token %d attention", what, t);
        e->worst_gpu = fmax(e->worst_gpu,
                            compare_rows(w2, o, want_o, 1, W,
                                         e->cdt == IR_DTYPE_BF16 ? TOL_BF16 : TOL_F32));
    }
    free(ref);
    free(ro);
    free(sc);
}

/* The fused form's keys: dsa_prologue_k's result for the step's real
 * tokens against the interpreter's, and every row of the key pool
 * (check_pool: the owned rows the interpreter's keys, the others never
 * written). */
static void dsa_check_keys(dsa_env *e, int T, const char *what)
{
    const ir_value *k = e->dsa->in[1];
    e->worst_key = fmax(e->worst_key, compare_real_rows(&e->b, e->in, e->seq_of, e->idx_of, k, T,
                                                        e->cdt, what));
    float *hist[MAX_SEQ];
    for (int q = 0; q < e->n_seq; q++)
        hist[q] = e->hist[q][0];
    check_pool(&e->b, e->b.kv_by_op[2 * e->dsa->id], e->pages, e->bs, e->n_seq, e->len,
               e->max_len, e->s->DI, e->cdt, hist, what, "ik", &e->worst_key, &e->key_rows);
}

/* One step of bucket T, as attn_step. */
static void dsa_step(dsa_env *e, int T, const int *ntok, int compare)
{
    const km_spec *s = e->s;
    const ir_module *m = e->m;
    int slots[TMAX];
    assign_tokens(&e->rng, T, e->n_seq, e->len, ntok, e->max_len, e->seq_of, e->idx_of, e->pos_of,
                  slots);
    if (e->use_interp)
        interps_step(e->in, e->n_seq, e->len, ntok, s->vocab, &e->rng);
    for (int a = 0; a < 3; a++)
        dsa_operand_rows(e, e->dsa->in[a], T);
    for (int a = 0; a < 4; a++)
        dsa_operand_rows(e, e->mla->in[a], T);
    const ir_value *cached[3] = {e->dsa->in[1], e->mla->in[2], e->mla->in[3]};
    for (int t = 0; t < T; t++) {
        int q = e->seq_of[t];
        for (int i = 0; q >= 0 && i < 3; i++)
            memcpy(e->hist[q][i] + (size_t)e->pos_of[t] * e->hw[i],
                   e->rows[cached[i]->id] + (size_t)t * e->hw[i], (size_t)e->hw[i] * 4);
    }
    char what[160];
    snprintf(what, sizeof what, "%s %s T=%d", s->name, ir_dtype_name(e->cdt), T);
    cg_ctx c;
    run_step(&e->b, m, e->cdt, e->bs, e->lib, e->rows, &e->rng, e->pos_of, slots, T, e->n_seq,
             e->len, ntok, what, &c);
    if (compare) {
        int K = s->TOPK, W = s->H * s->R;
        int32_t *sel = xmalloc((size_t)T * K * 4);
        float *gpu = xmalloc((size_t)T * W * 4);
        CK(cudaMemcpy(sel, e->b.val[e->dsa->out[0]->id], (size_t)T * K * 4, cudaMemcpyDeviceToHost));
        download(gpu, storage(&e->b, e->mla->out[0]), e->b.val[e->mla->out[0]->id], (size_t)T * W);
        int pads_ok = 1;
        for (int t = 0; t < T; t++) {
            if (e->seq_of[t] >= 0) {
                dsa_check_token(e, t, sel + (size_t)t * K, gpu + (size_t)t * W, what);
                continue;
            }
            for (int i = 0; i < K; i++)
                pads_ok &= sel[(size_t)t * K + i] == -1;
            for (int i = 0; i < W; i++)
                pads_ok &= gpu[(size_t)t * W + i] == 0.0f;
        }
        T_CHECK(pads_ok);
        if (!pads_ok)
            fprintf(stderr, "FAIL %s: a padding token's selection is not all -1 or its attention "
                            "output not zero\n", what);
        free(sel);
        free(gpu);
        if (dsa_fused(e))
            dsa_check_keys(e, T, what);
    }
    if (getenv("MOEC_KERN_BENCH") && compare && T <= 8) {
        char label[64];
        snprintf(label, sizeof label, "T=%d ctx %d", T, e->len[0]);
        bench_steps(&e->b, &c, e->lib, label, 0);
    }
    cg_ctx_free(&c);
}

static void dsa_step_any(void *e, int T, const int *ntok, int compare)
{
    dsa_step(e, T, ntok, compare);
}

/* Short runs against the interpreter: prefill chunks of two sequences
 * crossing top_k and pages, mixed with padding, then decode steps. */
static void dsa_case_interp(const km_spec *s, ir_dtype cdt, int bs)
{
    double t0 = now_s();
    dsa_env e;
    dsa_init(&e, s, cdt, bs, 2, 160, 1, 0xd5a0000u + (uint64_t)s->HI * 7 + (uint64_t)cdt);
    int a[2] = {s->TOPK - 2, 5}, b2[2] = {30, 34};
    short_steps(dsa_step_any, &e, 64, a, b2);
    dsa_free(&e);
    printf("%-16s %s dsa    (interpreter, %.1f s)\n", s->name, ir_dtype_name(cdt), now_s() - t0);
}

/* The fused indexer (pass fuse_dsa_indexer: dsa_prologue_k writing the key
 * cache, dsa_topk reading q and the weights from rows and rotating q)
 * against the interpreter: two sequences, prefill chunks crossing top_k
 * and a cache block (positions 40 to 69 of sequence 0 in one step, blocks
 * of 64), steps of T = 3 with and without padding, T = 1 and 8. */
static void dsa_case_fused(const km_spec *s, ir_dtype cdt, int bs)
{
    double t0 = now_s();
    dsa_env e;
    dsa_init(&e, s, cdt, bs, 2, 160, 1, 0xd5a2000u + (uint64_t)s->HI * 7 + (uint64_t)cdt);
    static const int steps[][3] = {{64, 40, 5}, {64, 30, 34}, {3, 2, 1}, {3, 1, 1},
                                   {1, 1, 0}, {8, 1, 1}, {1, 0, 1}};
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++)
        dsa_step(&e, steps[i][0], steps[i] + 1, 1);
    dsa_free(&e);
    printf("%-16s %s dsa    (fused, interpreter, %.1f s)\n", s->name, ir_dtype_name(cdt),
           now_s() - t0);
}

/* Long contexts against the reference: three sequences filled by steps of
 * 64 random tokens (lens[q] past top_k or not), then decode steps. */
static void dsa_case_long(const km_spec *s, ir_dtype cdt, int bs, const int *lens)
{
    double t0 = now_s();
    dsa_env e;
    dsa_init(&e, s, cdt, bs, 3, long_max_len(lens), 0, 0xd5a1000u + (uint64_t)s->HI);
    fill_sequences(dsa_step_any, &e, e.len, lens);
    int d[3] = {1, 1, 1};
    dsa_step(&e, 8, d, 1);
    int d1[3] = {1, 0, 0};
    dsa_step(&e, 1, d1, 1);
    dsa_free(&e);
    printf("%-16s %s dsa    (long: %d, %d, %d positions, %.1f s)\n", s->name, ir_dtype_name(cdt),
           lens[0], lens[1], lens[2], now_s() - t0);
}

/* ---- the widening of e4m3 codes to bf16 ----------------------------------- */

/* moec_e4m3x4_bf16 (the staged fp8 kernels' widening, with no conversion
 * unit) against rt_f8e4m3_to_f32 for all 256 codes, bit for bit: every
 * finite code exactly its bf16 (subnormal codes, the zeros' signs), the
 * two NaN codes +-480 as the prologue says. */
static void e4m3_widen_case(void)
{
    moec_buf src = {0};
    cg_emit_prologue(&src);
    moec_buf_printf(&src, "extern \"C\" __global__ void e4m3_all(unsigned *out)\n{\n"
                          "    const unsigned t = threadIdx.x, c = 4 * t;\n"
                          "    moec_e4m3x4_bf16(c | (c + 1) << 8 | (c + 2) << 16 | (c + 3) << 24,\n"
                          "                     out[2 * t], out[2 * t + 1]);\n}\n");
    T_CHECK(!src.oom);
    void *cubin = NULL;
    size_t size = 0;
    T_OK(cg_compile(src.data, karch(), cache_dir, &cubin, &size));
    moec_buf_free(&src);
    if (!cubin)
        return;
    cudaLibrary_t lib;
    cudaKernel_t k;
    CK(cudaLibraryLoadData(&lib, cubin, NULL, NULL, 0, NULL, NULL, 0));
    CK(cudaLibraryGetKernel(&k, lib, "e4m3_all"));
    unsigned *d = dalloc(128 * 4), got[128];
    void *argv[1] = {&d};
    CK(cudaLaunchKernel((const void *)k, (dim3){1, 1, 1}, (dim3){64, 1, 1}, argv, 0, 0));
    CK(cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int code = 0; code < 256; code++) {
        /* code 4t + i: word 2t holds codes 4t, 4t + 1, word 2t + 1 the others */
        unsigned w = got[code / 4 * 2 + code % 4 / 2];
        uint16_t h = (uint16_t)(code % 2 ? w >> 16 : w & 0xffffu);
        float want = (code & 0x7f) == 0x7f ? (code & 0x80 ? -480.0f : 480.0f)
                                           : rt_f8e4m3_to_f32((uint8_t)code);
        if (h != f2bf(want) && bad++ < 5)
            fprintf(stderr, "  e4m3 code 0x%02x: bf16 0x%04x, want 0x%04x (%g)\n", code, h,
                    f2bf(want), want);
    }
    t_checks++;
    if (bad) {
        t_failures++;
        fprintf(stderr, "FAIL e4m3 widening: %d of 256 codes wrong\n", bad);
    }
    printf("e4m3 widening     all 256 codes %s\n", bad ? "WRONG" : "exact");
    CK(cudaFree(d));
    CK(cudaLibraryUnload(lib));
    free(cubin);
}

/* ---- the MLA prologue: its results, the cache rows it writes ---------------- */

/* Steps of two sequences with padding over a shuffled paged cache, as for
 * attention, through the prologue op(s) (mla_prologue, or mla_prologue_kv
 * and mla_prologue_q) and the mla_attention whose cache they write: every
 * prologue result of a real token against the interpreter's, the cache
 * rows of every position of both sequences against the interpreter's kv_c
 * and k_pe of that position, every other cache row still poisoned (padding
 * tokens write none), and the attention output over the rows written. */
typedef struct pro_env {
    const km_spec *s;
    ir_module *m;
    const ir_op *att, *pro[2]; /* the prologue ops: the kv side's, then the q side's (or NULL) */
    const ir_value *cached[2]; /* the attention's operands in its two pools: kv_c, k_pe (MLA)
                                  or k, v (GQA's attn_prologue) */
    int width[2];              /* their rows' widths */
    ir_dtype cdt;
    int bs, max_len, pages;
    int len[MAX_SEQ];
    float *hist[MAX_SEQ][2]; /* the interpreter's cached rows per position */
    rt_interp *in[MAX_SEQ];
    gk_bind b;
    cudaLibrary_t lib;
    uint64_t rng;
    float **rows;
    int seq_of[TMAX], idx_of[TMAX], pos_of[TMAX];
    double worst_pro, worst_att;
    int rows_checked;
} pro_env;

static void pro_init(pro_env *e, const km_spec *s, ir_dtype cdt, int bs, uint64_t seed)
{
    memset(e, 0, sizeof *e);
    e->s = s;
    e->cdt = cdt;
    e->bs = bs;
    e->max_len = 160;
    e->rng = seed;
    e->m = km_module(s);
    if (!e->m)
        exit(1);
    e->att = val(e->m, "o")->def;
    int gqa = s->attn == KM_GQA_PRO;
    e->cached[0] = e->att->in[gqa ? 1 : 2];
    e->cached[1] = e->att->in[gqa ? 2 : 3];
    e->width[0] = gqa ? s->HKV * s->DK : s->R;
    e->width[1] = gqa ? s->HKV * s->DK : s->DR;
    e->pro[0] = e->cached[0]->def;
    e->pro[1] = gqa || val(e->m, "q_pe")->def == e->pro[0] ? NULL : val(e->m, "q_pe")->def;
    for (int q = 0; q < 2; q++)
        for (int i = 0; i < 2; i++)
            e->hist[q][i] = xmalloc((size_t)e->max_len * e->width[i] * 4);
    interps_init(e->in, 2, e->m, cdt, s, e->max_len, &e->rng);
    bind_init(&e->b, e->m, cdt);
    for (int i = 0; i < e->m->n_values; i++)
        if (e->m->values[i]->kind == IR_VALUE_WEIGHT && !strstr(e->m->values[i]->name, "tab_"))
            bind_weight(&e->b, e->in[0], e->m->values[i], NULL);
    e->lib = prog_lib(s, cdt, bs);
    e->pages = bind_block_table(&e->b, &e->rng, e->max_len, bs);
    e->rows = bind_paged_cache(&e->b, e->m, cdt, e->pages, bs, e->width[0], e->width[1]);
}

static void pro_free(pro_env *e)
{
    printf("%-16s %s prologue worst error: results %.2e, attention %.2e; %d cache rows checked\n",
           e->s->name, ir_dtype_name(e->cdt), e->worst_pro, e->worst_att, e->rows_checked);
    for (int q = 0; q < 2; q++) {
        free(e->hist[q][0]);
        free(e->hist[q][1]);
        rt_interp_free(e->in[q]);
    }
    free_paged_cache(&e->b, e->rows, e->m);
}

/* Value v on the GPU against the interpreter (compare_real_rows). */
static double pro_compare(pro_env *e, const ir_value *v, int T, const char *what)
{
    return compare_real_rows(&e->b, e->in, e->seq_of, e->idx_of, v, T, e->cdt, what);
}

/* Both pools of the attention, as check_pool. */
static void pro_check_cache(pro_env *e, const char *what)
{
    for (int i = 0; i < 2; i++) {
        float *hist[2] = {e->hist[0][i], e->hist[1][i]};
        check_pool(&e->b, e->b.kv[i], e->pages, e->bs, 2, e->len, e->max_len, e->width[i],
                   e->cdt, hist, what, e->cached[i]->name, &e->worst_pro, &e->rows_checked);
    }
}

static void pro_step(pro_env *e, int T, const int *ntok)
{
    const km_spec *s = e->s;
    const ir_module *m = e->m;
    int slots[TMAX];
    assign_tokens(&e->rng, T, 2, e->len, ntok, e->max_len, e->seq_of, e->idx_of, e->pos_of, slots);
    interps_step(e->in, 2, e->len, ntok, s->vocab, &e->rng);
    /* what the cache holds at the new positions */
    for (int q = 0; q < 2; q++)
        for (int j = 0; j < ntok[q]; j++)
            for (int i = 0; i < 2; i++) {
                size_t w = (size_t)e->width[i];
                memcpy(e->hist[q][i] + (size_t)(e->len[q] + j) * w,
                       rt_interp_value(e->in[q], e->cached[i]) + (size_t)j * w, w * 4);
            }
    /* what the kernels read and nothing of theirs writes: the prologue
       inputs, q_c (MLA), the argmax's logits */
    for (int i = 0; i < 3; i++) {
        const ir_value *v = i < 2 ? (e->pro[i] ? e->pro[i]->in[0] : NULL) : e->att->in[0];
        if (v && (i < 2 || v->def != e->pro[0]))
            step_rows(e->rows, &e->b, e->in, e->seq_of, e->idx_of, &e->rng, v, T);
    }
    char what[160];
    snprintf(what, sizeof what, "%s %s T=%d", s->name, ir_dtype_name(e->cdt), T);
    cg_ctx c;
    run_step(&e->b, m, e->cdt, e->bs, e->lib, e->rows, &e->rng, e->pos_of, slots, T, 2, e->len,
             ntok, what, &c);
    /* every result something reads (the kernel leaves q_nope unwritten when
       nothing does: mla_qabsorb reads the projection in place), but those
       of a GQA prologue that the attention's kernel runs itself
       (one token, unless MOEC_ATTN_FUSE_PROLOGUE=0): no kernel writes them */
    const ir_op *fused = s->attn == KM_GQA_PRO ? cg_attn_prologue_fused(&c, e->att) : NULL;
    for (int i = 0; i < 2; i++)
        for (int k = 0; e->pro[i] && e->pro[i] != fused && k < e->pro[i]->n_out; k++)
            if (cg_read_after(m, e->pro[i]->out[k], -1))
                e->worst_pro = fmax(e->worst_pro, pro_compare(e, e->pro[i]->out[k], T, what));
    e->worst_att = fmax(e->worst_att, pro_compare(e, e->att->out[0], T, what));
    /* padding tokens: zeros from the attention */
    int w = (int)ir_type_numel(&e->att->out[0]->type, 1), pads_ok = 1;
    float *gpu = xmalloc((size_t)T * w * 4);
    download(gpu, storage(&e->b, e->att->out[0]), e->b.val[e->att->out[0]->id], (size_t)T * w);
    for (int t = 0; t < T; t++)
        for (int i = 0; e->seq_of[t] < 0 && i < w; i++)
            pads_ok &= gpu[(size_t)t * w + i] == 0.0f;
    T_CHECK(pads_ok);
    free(gpu);
    pro_check_cache(e, what);
    if (getenv("MOEC_KERN_BENCH") && T <= 8) {
        char label[64];
        snprintf(label, sizeof label, "prologue T=%d", T);
        bench_steps(&e->b, &c, e->lib, label, 0);
    }
    cg_ctx_free(&c);
}

/* Prefill chunks crossing pages (T = 64, padding among them), then decode
 * steps at T = 3 and 1, with a padding token in each T = 3 step. */
static void pro_case(const km_spec *s, ir_dtype cdt, int bs)
{
    double t0 = now_s();
    pro_env e;
    pro_init(&e, s, cdt, bs, 0x9a0000u + (uint64_t)s->H * 7 + (uint64_t)cdt);
    /* GQA's prologue also in bucket 8 (with a padding token) */
    static const int steps[][3] = {{64, 40, 21}, {64, 30, 33}, {3, 1, 1}, {1, 0, 1},
                                   {3, 1, 0},    {1, 1, 0},    {3, 0, 2}, {8, 4, 3}};
    int n_steps = (int)(sizeof steps / sizeof *steps) - (s->attn != KM_GQA_PRO);
    for (int i = 0; i < n_steps; i++)
        pro_step(&e, steps[i][0], steps[i] + 1);
    pro_free(&e);
    printf("%-16s %s prologue (interpreter, %.1f s)\n", s->name, ir_dtype_name(cdt),
           now_s() - t0);
}

/* ---- the cases ------------------------------------------------------------- */


static const km_spec V2_MOE = {.name = "v2lite_moe", .vocab = 97, .E = 64, .K = 6, .NG = 1,
                               .TG = 1, .scaling = 1.0, .moe = KM_ROUTED, .HID = 2048, .I = 1408,
                               .wdt = "bf16", .moe_scale = 1.0};
static const km_spec V2_EXPERTS = {.name = "v2lite_experts", .vocab = 97, .E = 64, .K = 6,
                                   .NG = 1, .TG = 1, .scaling = 1.0, .moe = KM_EXPERTS,
                                   .HID = 2048, .I = 1408, .wdt = "bf16", .moe_scale = 1.0};
/* V3's hidden sizes with 16 of its 256 experts (its full routing below) */
static const km_spec V3_MOE = {.name = "v3_moe16", .vocab = 97, .E = 16, .K = 8, .sigmoid = 1,
                               .NG = 8, .TG = 4, .top2 = 1, .norm = 1, .bias = 1, .scaling = 2.5,
                               .moe = KM_ROUTED, .HID = 7168, .I = 2048, .wdt = "bf16",
                               .moe_scale = 1.0};
/* the router's linear inside the top-k kernel (2 to 64 tokens: its
 * tensor-core form): V2-Lite's (64 experts, H 2048), Qwen3-30B's (128, norm),
 * V3's grouped sigmoid routing with the bias over 256 experts (H 512), and
 * odd sizes (20 experts: partial 16-row tiles; H 96: three k chunks) */
static const km_spec R_V2 = {.name = "v2lite_router", .vocab = 97, .E = 64, .K = 6, .NG = 1,
                             .TG = 1, .scaling = 1.0, .moe = KM_ROUTED, .HID = 2048, .I = 1408,
                             .wdt = "bf16", .moe_scale = 1.0, .router = 1};
static const km_spec R_Q3 = {.name = "qwen3_router", .vocab = 97, .E = 128, .K = 8, .NG = 1,
                             .TG = 1, .norm = 1, .scaling = 1.0, .moe = KM_ROUTED_SPLIT,
                             .HID = 2048, .I = 768, .wdt = "bf16", .moe_scale = 1.0, .router = 1};
static const km_spec R_V3 = {.name = "v3_route256_router", .vocab = 97, .E = 256, .K = 8,
                             .sigmoid = 1, .NG = 8, .TG = 4, .top2 = 1, .norm = 1, .bias = 1,
                             .scaling = 2.5, .moe = KM_ROUTED, .HID = 512, .I = 128, .wdt = "bf16",
                             .moe_scale = 2.5, .router = 1};
static const km_spec R_ODD = {.name = "odd_router", .vocab = 97, .E = 20, .K = 3, .sigmoid = 1,
                              .NG = 1, .TG = 1, .bias = 1, .scaling = 1.0, .moe = KM_ROUTED,
                              .HID = 96, .I = 40, .wdt = "bf16", .moe_scale = 0.5, .router = 1};
static const km_spec V3_TOPK = {.name = "v3_topk", .vocab = 97, .E = 256, .K = 8, .sigmoid = 1,
                                .NG = 8, .TG = 4, .top2 = 1, .norm = 1, .bias = 1, .scaling = 2.5};
static const km_spec V2_GROUPED = {.name = "v2_grouped_topk", .vocab = 97, .E = 160, .K = 6,
                                   .NG = 8, .TG = 3, .scaling = 16.0};
static const km_spec Q3_MOE = {.name = "qwen3_moe", .vocab = 97, .E = 128, .K = 8, .NG = 1,
                               .TG = 1, .norm = 1, .scaling = 1.0, .moe = KM_ROUTED_SPLIT,
                               .HID = 2048, .I = 768, .wdt = "bf16", .moe_scale = 1.0};
static const km_spec ODD_EXPERTS = {.name = "odd_experts", .vocab = 97, .E = 6, .K = 3, .NG = 3,
                                    .TG = 2, .norm = 1, .scaling = 1.5, .moe = KM_EXPERTS,
                                    .HID = 20, .I = 12, .wdt = "f16", .moe_scale = 1.0};
static const km_spec ODD_ROUTED = {.name = "odd_routed", .vocab = 97, .E = 5, .K = 2, .sigmoid = 1,
                                   .NG = 1, .TG = 1, .bias = 1, .scaling = 1.0,
                                   .moe = KM_ROUTED_SPLIT, .HID = 9, .I = 7, .wdt = "f32",
                                   .moe_scale = 0.25};
static const km_spec Q3_ATTN = {.name = "qwen3_attn", .vocab = 97, .attn = KM_GQA, .H = 32,
                                .HKV = 4, .DK = 128, .DV = 128, .attn_scale = 0.08838834764831845};
/* one kv head per query head: T = 64 fills the GPU without a split */
static const km_spec MHA_ATTN = {.name = "mha_attn", .vocab = 97, .attn = KM_GQA, .H = 8, .HKV = 8,
                                 .DK = 64, .DV = 64, .attn_scale = 0.125};
static const km_spec ODD_ATTN = {.name = "odd_attn", .vocab = 97, .attn = KM_GQA, .H = 6, .HKV = 2,
                                 .DK = 24, .DV = 40, .window = 5, .attn_scale = 0.2};
static const km_spec V2_MLA = {.name = "v2lite_mla", .vocab = 97, .attn = KM_MLA, .H = 16, .R = 512,
                               .DR = 64, .attn_scale = 0.07216878364870323};
static const km_spec V3_MLA = {.name = "v3_mla", .vocab = 97, .attn = KM_MLA, .H = 128, .R = 512,
                               .DR = 64, .attn_scale = 0.07216878364870323};
static const km_spec ODD_MLA = {.name = "odd_mla", .vocab = 97, .attn = KM_MLA, .H = 3, .R = 36,
                                .DR = 6, .window = 3, .attn_scale = 0.3};
/* fp8 (block-scaled e4m3) weights: DeepSeek-V3's kv_a (576 rows, 4.5 row
 * blocks), its fused q_a + kv_a (2112 rows), o_proj (K 16384) and 16 of
 * its routed experts; V2-Lite's dense down_proj quantized (K 10944: 85.5
 * column blocks) and gate_proj (10944 rows: two row tiles a tensor-core
 * block); Qwen3-30B's split experts and q_proj; odd shapes with
 * partial blocks of 32 x 64, K = 200 (not in 32-wide chunks), and up
 * starting inside a row block. */
static const km_spec F8_KV_A = {.name = "f8_v3_kv_a", .vocab = 97, .LN = 576, .LK = 7168,
                                .ldt = "f8e4m3"};
static const km_spec F8_QKV_A = {.name = "f8_v3_qkv_a", .vocab = 97, .LN = 2112, .LK = 7168,
                                 .ldt = "f8e4m3"};
static const km_spec F8_O_PROJ = {.name = "f8_v3_o_proj", .vocab = 97, .LN = 7168, .LK = 16384,
                                  .ldt = "f8e4m3"};
static const km_spec F8_V2_DOWN = {.name = "f8_v2lite_down", .vocab = 97, .LN = 2048,
                                   .LK = 10944, .ldt = "f8e4m3"};
static const km_spec F8_V2_GATE = {.name = "f8_v2lite_gate", .vocab = 97, .LN = 10944,
                                   .LK = 2048, .ldt = "f8e4m3"};
static const km_spec F8_ODD_LINEAR = {.name = "f8_odd_linear", .vocab = 97, .LN = 37, .LK = 200,
                                      .ldt = "f8e4m3", .BN = 32, .BK = 64};
static const km_spec F8_V3_MOE = {.name = "f8_v3_moe16", .vocab = 97, .E = 16, .K = 8,
                                  .sigmoid = 1, .NG = 8, .TG = 4, .top2 = 1, .norm = 1, .bias = 1,
                                  .scaling = 2.5, .moe = KM_ROUTED, .HID = 7168, .I = 2048,
                                  .wdt = "f8e4m3", .moe_scale = 2.5};
static const km_spec F8_Q3_MOE = {.name = "f8_qwen3_moe", .vocab = 97, .E = 128, .K = 8, .NG = 1,
                                  .TG = 1, .norm = 1, .scaling = 1.0, .moe = KM_ROUTED_SPLIT,
                                  .HID = 2048, .I = 768, .wdt = "f8e4m3", .moe_scale = 1.0,
                                  .LN = 4096, .LK = 2048, .ldt = "f8e4m3"};
static const km_spec F8_ODD_MOE = {.name = "f8_odd_moe", .vocab = 97, .E = 6, .K = 3, .NG = 1,
                                   .TG = 1, .norm = 1, .scaling = 1.0, .moe = KM_ROUTED,
                                   .HID = 320, .I = 48, .wdt = "f8e4m3", .moe_scale = 0.5,
                                   .BN = 32, .BK = 64};
/* tensor cores with up from row 96 of 32-row blocks */
static const km_spec F8_ODD_MMA = {.name = "f8_odd_mma", .vocab = 97, .E = 3, .K = 2, .NG = 1,
                                   .TG = 1, .norm = 1, .scaling = 1.0, .moe = KM_ROUTED,
                                   .HID = 320, .I = 96, .wdt = "f8e4m3", .moe_scale = 1.0,
                                   .BN = 32, .BK = 64};
/* DeepSeek-V2-Lite's fp8 linears of a MoE layer (q_proj with kv_a, o_proj,
 * the shared experts' gate_up and down) and its 64 routed experts: the
 * shapes of the decode benchmark (BENCHMARKS.md) */
static const km_spec F8_V2_QKV_A = {.name = "f8_v2lite_qkv_a", .vocab = 97, .LN = 3648,
                                    .LK = 2048, .ldt = "f8e4m3"};
static const km_spec F8_V2_O = {.name = "f8_v2lite_o_proj", .vocab = 97, .LN = 2048, .LK = 2048,
                                .ldt = "f8e4m3"};
static const km_spec F8_V2_SH_GU = {.name = "f8_v2lite_sh_gu", .vocab = 97, .LN = 5632,
                                    .LK = 2048, .ldt = "f8e4m3"};
static const km_spec F8_V2_SH_DOWN = {.name = "f8_v2lite_sh_dn", .vocab = 97, .LN = 2048,
                                      .LK = 2816, .ldt = "f8e4m3"};
static const km_spec F8_V2_MOE = {.name = "f8_v2lite_moe", .vocab = 97, .E = 64, .K = 6, .NG = 1,
                                  .TG = 1, .scaling = 1.0, .moe = KM_ROUTED, .HID = 2048,
                                  .I = 1408, .wdt = "f8e4m3", .moe_scale = 1.0};
/* the staged kernels' edges (codegen/fp8_tc.c): blocks of 48 x 64, 336
 * rows (7 row blocks, 21 tiles: slabs with dead warps), K 640 (10 chunks
 * over up to 8 splits), up from row 192 of gate_up, down's H 320 (6.7 row
 * blocks); gate and up apart with blocks of 16 x 128 (H 192: 1.5 column
 * blocks), a linear of 100 rows (a tile past the end) and K 1280; the
 * unfused experts op (down writing the result) */
static const km_spec F8_TC_ODD = {.name = "f8_tc_odd", .vocab = 97, .E = 6, .K = 3, .NG = 1,
                                  .TG = 1, .norm = 1, .scaling = 1.0, .moe = KM_ROUTED, .HID = 320,
                                  .I = 192, .wdt = "f8e4m3", .moe_scale = 0.5, .LN = 336,
                                  .LK = 640, .ldt = "f8e4m3", .BN = 48, .BK = 64};
static const km_spec F8_TC_EXPERTS = {.name = "f8_tc_experts", .vocab = 97, .E = 4, .K = 2,
                                      .NG = 1, .TG = 1, .norm = 1, .scaling = 1.0,
                                      .moe = KM_EXPERTS_SPLIT, .HID = 256, .I = 128,
                                      .wdt = "f8e4m3", .moe_scale = 1.0};
static const km_spec F8_TC_SPLIT = {.name = "f8_tc_split", .vocab = 97, .E = 5, .K = 2, .NG = 1,
                                    .TG = 1, .norm = 1, .scaling = 1.0, .moe = KM_ROUTED_SPLIT,
                                    .HID = 192, .I = 64, .wdt = "f8e4m3", .moe_scale = 1.5,
                                    .LN = 100, .LK = 1280, .ldt = "f8e4m3", .BN = 16, .BK = 128};

/* The streaming expert form's edges (codegen/moe_routed.c, GV_CONSTS):
 * bf16 H 200 (a partial 256-wide chunk) with I 37 (gate_up's last block
 * of rows partly dead; down, I not in 8-wide vectors, on the first form);
 * 256 experts top-1, H 136, I 72 (a chunk of 9 live lanes), gate and up
 * apart; fp8 H 208 and I 176 (partial 128 x 128 scale blocks both ways,
 * chunks of 512 codes mostly dead), top-4 of 7 */
static const km_spec GV_ODD = {.name = "gv_odd", .vocab = 97, .E = 6, .K = 3, .NG = 1, .TG = 1,
                               .norm = 1, .scaling = 1.0, .moe = KM_ROUTED, .HID = 200, .I = 37,
                               .wdt = "bf16", .moe_scale = 0.5};
static const km_spec GV_ODD_SPLIT = {.name = "gv_odd_split", .vocab = 97, .E = 256, .K = 1,
                                     .NG = 1, .TG = 1, .scaling = 1.0, .moe = KM_ROUTED_SPLIT,
                                     .HID = 136, .I = 72, .wdt = "bf16", .moe_scale = 1.5};
static const km_spec F8_GV_ODD = {.name = "f8_gv_odd", .vocab = 97, .E = 7, .K = 4, .NG = 1,
                                  .TG = 1, .norm = 1, .scaling = 1.0, .moe = KM_ROUTED_SPLIT,
                                  .HID = 208, .I = 176, .wdt = "f8e4m3", .moe_scale = 0.75};

/* DeepSeek-V3.2: the indexer's 64 heads of 128 and V3's MLA; top 32 of short
 * runs (so that they select), the real top 2048 at long contexts */
static const km_spec V32_DSA = {.name = "v32_dsa", .vocab = 97, .attn = KM_MLA, .H = 128, .R = 512,
                                .DR = 64, .attn_scale = 0.07216878364870323, .TOPK = 32,
                                .HI = 64, .DI = 128, .dsa_scale = 0.08838834764831845,
                                .dsa_wscale = 0.125};
static const km_spec V32_DSA_2K = {.name = "v32_dsa_2k", .vocab = 97, .attn = KM_MLA, .H = 128,
                                   .R = 512, .DR = 64, .attn_scale = 0.07216878364870323,
                                   .TOPK = 2048, .HI = 64, .DI = 128,
                                   .dsa_scale = 0.08838834764831845, .dsa_wscale = 0.125};
/* the fused indexer (pass fuse_dsa_indexer) at V3.2's shape: the key from
 * dsa_prologue_k of qkv_a's row (after its 2112 columns of q_a, kv and
 * k_pe), q at column 24576 of q_b_wq_b's row, both rotated half-split
 * over 64 channels; odd sizes (rows not 16-byte aligned: CUDA-core scores,
 * scalar loads) with interleaved pairs, linear scaling and an attn_factor */
static const km_spec V32_DSA_FUSED = {.name = "v32_dsa_fused", .vocab = 97, .attn = KM_MLA,
                                      .H = 128, .R = 512, .DR = 64,
                                      .attn_scale = 0.07216878364870323, .TOPK = 32, .HI = 64,
                                      .DI = 128, .dsa_scale = 0.08838834764831845,
                                      .dsa_wscale = 0.125, .IRD = 64, .IPRE = 2112,
                                      .IQPRE = 24576};
static const km_spec ODD_DSA_FUSED = {.name = "odd_dsa_fused", .vocab = 97, .attn = KM_MLA,
                                      .H = 3, .R = 36, .DR = 6, .attn_scale = 0.3, .TOPK = 5,
                                      .HI = 3, .DI = 12, .dsa_scale = 0.5, .dsa_wscale = -0.7,
                                      .IRD = 6, .IPRE = 5, .IQPRE = 3,
                                      .irope = "style = \"interleave\", theta = 500.0, scaling = "
                                               "\"linear\", factor = 2.0, attn_factor = 1.25"};
/* the MLA prologue: DeepSeek-V2-Lite (no q LoRA: one mla_prologue) and V3
 * (q_lora 1536, 128 heads: mla_prologue_kv and mla_prologue_q, rows wider
 * than their sections as V3.2's), and odd sizes with neox, linear scaling
 * and an attn_factor, with and without the q latent */
/* fuse_moe_sum: the routed experts unsummed, their sum over k in the
 * residual add_rms_norm, the moe_topk kernel aligning their slots (T = 1),
 * at V2-Lite's shape (64 experts top-6), V3's (its
 * grouped sigmoid routing with the bias and the scaling, hidden 7168, 16
 * of its experts; alpha 2.5), Qwen3-30B's (128 experts top-8, softmax,
 * norm_topk_prob; gate and up apart) and odd ones */
static const km_spec SUM_V2 = {.name = "v2lite_moe_sum", .vocab = 97, .E = 64, .K = 6, .NG = 1,
                               .TG = 1, .scaling = 1.0, .moe = KM_ROUTED, .HID = 2048, .I = 1408,
                               .wdt = "bf16", .moe_scale = 1.0, .AN = 2048, .an_alpha = 1.0,
                               .an_moe = 1};
static const km_spec SUM_V3 = {.name = "v3_moe16_sum", .vocab = 97, .E = 16, .K = 8, .sigmoid = 1,
                               .NG = 8, .TG = 4, .top2 = 1, .norm = 1, .bias = 1, .scaling = 2.5,
                               .moe = KM_ROUTED, .HID = 7168, .I = 2048, .wdt = "bf16",
                               .moe_scale = 1.0, .AN = 7168, .an_alpha = 2.5, .an_moe = 1};
static const km_spec SUM_Q3 = {.name = "qwen3_moe_sum", .vocab = 97, .E = 128, .K = 8, .NG = 1,
                               .TG = 1, .norm = 1, .scaling = 1.0, .moe = KM_ROUTED_SPLIT,
                               .HID = 2048, .I = 768, .wdt = "bf16", .moe_scale = 1.0, .AN = 2048,
                               .an_alpha = 1.0, .an_moe = 1};
/* V3's full routing (256 experts, 8 groups of which 4 kept by their top-2
 * sums, sigmoid with the correction bias, norm_topk_prob, scaling 2.5) at
 * a small hidden size: the moe_topk kernel that also aligns 8 slots a
 * token over 256 experts */
static const km_spec SUM_V3_R256 = {.name = "v3_route256_sum", .vocab = 97, .E = 256, .K = 8,
                                    .sigmoid = 1, .NG = 8, .TG = 4, .top2 = 1, .norm = 1,
                                    .bias = 1, .scaling = 2.5, .moe = KM_ROUTED, .HID = 512,
                                    .I = 128, .wdt = "bf16", .moe_scale = 2.5, .AN = 512,
                                    .an_alpha = 1.0, .an_moe = 1};
static const km_spec SUM_ODD = {.name = "odd_moe_sum", .vocab = 97, .E = 5, .K = 3, .sigmoid = 1,
                                .NG = 1, .TG = 1, .bias = 1, .scaling = 1.0, .moe = KM_ROUTED,
                                .HID = 37, .I = 7, .wdt = "bf16", .moe_scale = 0.25, .AN = 37,
                                .an_alpha = -0.5, .an_moe = 1};
/* fuse_silu_mul_linear: the shared experts' down projection with its
 * silu_mul, V2-Lite's (2 shared experts: K 2816) and V3's (K 2048, N
 * 7168), and odd */
static const km_spec ACT_V2 = {.name = "v2lite_sh_down_act", .vocab = 97, .LN = 2048, .LK = 2816,
                               .ldt = "bf16", .lact = 1};
static const km_spec ACT_V3 = {.name = "v3_sh_down_act", .vocab = 97, .LN = 7168, .LK = 2048,
                               .ldt = "bf16", .lact = 1};
static const km_spec ACT_ODD = {.name = "odd_act", .vocab = 97, .LN = 37, .LK = 200,
                                .ldt = "bf16", .lact = 1};
/* ... and in fp8 (block-scaled codes): V2-Lite's shape, and odd blocks
 * of 48 x 64 with a tile past N; the few-token kernel up to 8 tokens, the
 * staged one past that, each computing h as it loads x */
static const km_spec F8_ACT_V2 = {.name = "f8_v2lite_sh_down_act", .vocab = 97, .LN = 2048,
                                  .LK = 2816, .ldt = "f8e4m3", .lact = 1};
static const km_spec F8_ACT_ODD = {.name = "f8_odd_act", .vocab = 97, .LN = 100, .LK = 640,
                                   .ldt = "f8e4m3", .BN = 48, .BK = 64, .lact = 1};
/* bf16 linears on tensor cores past the few-token kernel (codegen/linear.c,
 * linear_mma): V2-Lite's q_proj with kv_a (3648 x 2048), a router's shape
 * (64 x 2048: 4 blocks), and odd (100 x 640: a tile past N, 20 chunks
 * over 8 warps) */
static const km_spec L16_V2 = {.name = "v2lite_qkv_a16", .vocab = 97, .LN = 3648, .LK = 2048,
                               .ldt = "bf16"};
static const km_spec L16_ROUTER = {.name = "router_shape16", .vocab = 97, .LN = 64, .LK = 2048,
                                   .ldt = "bf16"};
static const km_spec L16_ODD = {.name = "odd_linear16", .vocab = 97, .LN = 100, .LK = 640,
                                .ldt = "bf16"};
/* V2-Lite's shared experts' gate_up (5632 x 2048): the staged kernel's two
 * tiles a warp from 32 tokens */
static const km_spec L16_SH_GU = {.name = "v2lite_sh_gate_up16", .vocab = 97, .LN = 5632,
                                  .LK = 2048, .ldt = "bf16"};
/* The bf16 linears' cases, each at its buckets: queued for compiling
 * (run 0) or, once compiled, run (1). The act ones (bf16 and f32) take the
 * few-token kernel up to 4 tokens, the tensor-core one at 8 and the staged
 * one (codegen/fp8_tc.c; MOEC_LINEAR_TC_MAX_T, set here, lets it) at 16 to
 * 64 in bf16 where K is a multiple of 64
 * (f32 and odd_act's 200: cuBLASLt after the silu_mul kernel, which these
 * cases cannot run); the plain ones likewise (odd_linear16's K 640: all
 * of them). */
static void linear_cases(int run)
{
    setenv("MOEC_LINEAR_TC_MAX_T", "64", 1); /* the staged kernel from 16 tokens */
    static const km_spec *const acts[3] = {&ACT_V2, &ACT_V3, &ACT_ODD};
    static const km_spec *const plain[4] = {&L16_V2, &L16_ROUTER, &L16_ODD, &L16_SH_GU};
    const unsigned few = TM(1) | TM(2) | TM(3) | TM(4), mma = few | TM(8);
    const unsigned staged = mma | TM(16) | TM(32) | TM(64);
    for (int f32 = 0; f32 < 2; f32++)
        for (int i = 0; i < 3; i++) {
            ir_dtype cdt = f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16;
            unsigned mask = f32 || i == 2 ? few : staged;
            if (run)
                moe_case(acts[i], cdt, mask, 80 + (uint64_t)(2 * i + f32));
            else
                prog_add(acts[i], cdt, 64, mask);
        }
    for (int i = 0; i < 4; i++) {
        if (run)
            moe_case(plain[i], IR_DTYPE_BF16, staged, 100 + (uint64_t)i);
        else
            prog_add(plain[i], IR_DTYPE_BF16, 64, staged);
    }
    static const km_spec *const f8acts[2] = {&F8_ACT_V2, &F8_ACT_ODD};
    for (int i = 0; i < 2; i++) {
        if (run)
            moe_case(f8acts[i], IR_DTYPE_BF16, staged, 110 + (uint64_t)i);
        else
            prog_add(f8acts[i], IR_DTYPE_BF16, 64, staged);
    }
    unsetenv("MOEC_LINEAR_TC_MAX_T");
}

/* the residual add_rms_norm with the routed and shared experts' sum:
 * V2-Lite's hidden size (alpha 1), V3's (alpha 2.5, its f16 form), odd */
static const km_spec ADD3_V2 = {.name = "v2lite_add3", .vocab = 97, .AN = 2048, .an_alpha = 1.0};
static const km_spec ADD3_V3 = {.name = "v3_add3", .vocab = 97, .AN = 7168, .an_alpha = 2.5};
static const km_spec ADD3_ODD = {.name = "odd_add3", .vocab = 97, .AN = 37, .an_alpha = -0.5};
/* MLA's absorptions as generated kernels (the CUDA-core form up to 2
 * tokens, the tensor-core one from 3 to 64): V2-Lite's 16 heads and V3's
 * 128 (dn = dv = 128, r 512), odd sizes (r not a multiple of 8, dv past one
 * block's rows: cuBLASLt from 3 tokens), and sizes the tensor-core form
 * takes in blocks of 16 columns that no wider block divides */
static const km_spec ABS_V2 = {.name = "v2lite_absorb", .vocab = 97, .AH = 16, .ADN = 128,
                               .ADV = 128, .AR = 512};
static const km_spec ABS_V3 = {.name = "v3_absorb", .vocab = 97, .AH = 128, .ADN = 128, .ADV = 128,
                               .AR = 512};
static const km_spec ABS_ODD = {.name = "odd_absorb", .vocab = 97, .AH = 3, .ADN = 5, .ADV = 37,
                                .AR = 36};
static const km_spec ABS_MMA_ODD = {.name = "odd_absorb_mma", .vocab = 97, .AH = 3, .ADN = 16,
                                    .ADV = 48, .AR = 80};
static const km_spec PRO_V2 = {.name = "v2lite_pro", .vocab = 97, .attn = KM_MLA_PRO, .H = 16,
                               .DN = 128, .DR = 64, .R = 512, .attn_scale = 0.1147213867929261};
static const km_spec PRO_V3 = {.name = "v3_pro", .vocab = 97, .attn = KM_MLA_PRO, .H = 128,
                               .DN = 128, .DR = 64, .R = 512, .QR = 1536, .XN = 192,
                               .attn_scale = 0.1352337788608801};
static const km_spec PRO_ODD = {.name = "odd_pro", .vocab = 97, .attn = KM_MLA_PRO, .H = 3,
                                .DN = 5, .DR = 6, .R = 36, .XN = 3, .attn_scale = 0.3,
                                .rope = "style = \"neox\", theta = 500.0, scaling = \"linear\", "
                                        "factor = 2.0, attn_factor = 1.25"};
static const km_spec PRO_ODD_Q = {.name = "odd_pro_q", .vocab = 97, .attn = KM_MLA_PRO, .H = 3,
                                  .DN = 5, .DR = 6, .R = 36, .QR = 7, .XN = 3, .attn_scale = 0.3,
                                  .rope = "style = \"neox\", theta = 500.0, scaling = "
                                          "\"linear\", factor = 2.0, attn_factor = 1.25"};
/* GQA's attn_prologue (fuse_attn_prologue) before the attention: Qwen3-30B's
 * shape (32 q heads, 4 kv heads of 128, q/k norms, neox at theta 1e6);
 * Qwen2's form (no norms) at odd sizes (rows not 16-byte aligned, wider
 * than the sections; interleaved YaRN, a partial rotary_dim, a window),
 * and the same with norms */
static const km_spec GPRO_Q3 = {.name = "qwen3_gqa_pro", .vocab = 97, .attn = KM_GQA_PRO, .H = 32,
                                .HKV = 4, .DK = 128, .DV = 128, .qk_norm = 1,
                                .attn_scale = 0.08838834764831845};
static const km_spec GPRO_ODD = {.name = "odd_gqa_pro", .vocab = 97, .attn = KM_GQA_PRO, .H = 6,
                                 .HKV = 2, .DK = 10, .DV = 10, .XN = 3, .window = 5,
                                 .attn_scale = 0.3,
                                 .rope = "style = \"interleave\", theta = 500.0, scaling = "
                                         "\"yarn\", factor = 4.0, yarn_low = 1.0, yarn_high = "
                                         "3.0, attn_factor = 1.25, rotary_dim = 6"};
static const km_spec GPRO_ODD_NORM = {.name = "odd_gqa_pro_norm", .vocab = 97,
                                      .attn = KM_GQA_PRO, .H = 6, .HKV = 2, .DK = 10, .DV = 10,
                                      .XN = 3, .qk_norm = 1, .window = 5, .attn_scale = 0.3,
                                      .rope = "style = \"interleave\", theta = 500.0, scaling = "
                                              "\"yarn\", factor = 4.0, yarn_low = 1.0, "
                                              "yarn_high = 3.0, attn_factor = 1.25, rotary_dim = 6"};
static const km_spec ODD_DSA = {.name = "odd_dsa", .vocab = 97, .attn = KM_MLA, .H = 3, .R = 36,
                                .DR = 6, .attn_scale = 0.3, .TOPK = 5, .HI = 3, .DI = 12,
                                .dsa_scale = 0.5, .dsa_wscale = -0.7};

/* ---- DSA: the fast indexer kernels against the legacy ones ------------------ */

/* The dsa_topk op alone at V3.2's real shape (64 heads of 128, top 2048),
 * generated in each form (MOEC_DSA_KERNEL=legacy; the fast default; the
 * fast with MOEC_DSA_SELECT_CAP=2100, so that one launch has rows in
 * shared memory and rows read from global memory) for T = 1, 3 and 64.
 * A key cache of up to 64 sequences of random bf16 keys (every 13th
 * position a copy of an earlier key, every 29th zeros: exact ties) in
 * shuffled pages; each run writes this step's keys, scores and selects.
 * The scores must match this file's reference (the interpreter's
 * definition) within 1e-4 of the row's largest; the selection must be the
 * reference selection of the GPU's own scores exactly (and of the
 * reference scores wherever the top-k boundary is not a near-tie); tokens
 * with no more than top_k positions get 0..pos then -1s, padding -1s.
 * Then the select alone on crafted score rows: all equal, -0 and +0, a few
 * values (ties everywhere), NaNs and infinities, keys equal but in their
 * last bits, negatives. With MOEC_KERN_BENCH: the kernels' times per form
 * at T = 1 and 64, contexts 4096 and 16384 (a sequence per token). */
enum { DSA_LEGACY, DSA_FAST, DSA_FAST_MIX, DSA_FORMS };
static const char *const DSA_FORM_NAME[DSA_FORMS] = {"legacy", "fast", "fast-cap2100"};
static const int DSA_AB_T[3] = {1, 3, 64};
#define DSA_AB_SEQ 64
#define DSA_AB_LEN (16384 + 64)

typedef struct dsa_ab {
    ir_module *m;
    const ir_op *op;
    int HI, DI, K, bs, mb;
    cg_ctx ctx[DSA_FORMS];             /* each form's kernels (its source compiled) */
    ir_step *steps[DSA_FORMS][3];      /* its steps per bucket of DSA_AB_T */
    int n_steps[DSA_FORMS][3];
    cudaLibrary_t lib[DSA_FORMS];
    void *cubin[DSA_FORMS];
    gk_bind b;
    uint16_t *keys;                    /* the key pool as uploaded (bf16) */
    int *bt;                           /* the block table [DSA_AB_SEQ, mb] */
    uint64_t rng;
    int pos[TMAX], slot[TMAX];
    float *q, *w, *k;                  /* this step's operands, rounded to bf16 */
} dsa_ab;

/* Generates every form for every bucket and compiles them. */
static void dsa_ab_programs(dsa_ab *e)
{
    cg_compile_job jobs[DSA_FORMS];
    cg_options o;
    options_for(&o, IR_DTYPE_BF16, e->bs, CG_FP8_AUTO);
    for (int f = 0; f < DSA_FORMS; f++) {
        setenv("MOEC_DSA_KERNEL", f == DSA_LEGACY ? "legacy" : "fast", 1);
        if (f == DSA_FAST_MIX)
            setenv("MOEC_DSA_SELECT_CAP", "2100", 1);
        cg_ctx *c = &e->ctx[f];
        memset(c, 0, sizeof *c);
        c->m = e->m;
        c->opt = &o;
        cg_emit_prologue(&c->src);
        for (int i = 0; i < 3; i++) {
            c->T = DSA_AB_T[i];
            c->n_steps = 0;
            T_OK(cg_emit_op(c, e->op));
            e->n_steps[f][i] = c->n_steps;
            e->steps[f][i] = xmalloc((size_t)c->n_steps * sizeof(ir_step));
            memcpy(e->steps[f][i], c->steps, (size_t)c->n_steps * sizeof(ir_step));
        }
        unsetenv("MOEC_DSA_KERNEL");
        unsetenv("MOEC_DSA_SELECT_CAP");
        c->opt = NULL;
        if (c->src.oom) {
            fprintf(stderr, "dsa forms: out of memory generating their source\n");
            exit(1);
        }
        memset(&jobs[f], 0, sizeof jobs[f]);
        jobs[f].src = c->src.data;
    }
    cg_compile_many(jobs, DSA_FORMS, karch(), cache_dir, NULL, NULL);
    for (int f = 0; f < DSA_FORMS; f++) {
        if (jobs[f].st != MOEC_OK) {
            fprintf(stderr, "dsa form %s: %s\n", DSA_FORM_NAME[f], jobs[f].err);
            exit(1);
        }
        e->cubin[f] = jobs[f].cubin;
        CK(cudaLibraryLoadData(&e->lib[f], e->cubin[f], NULL, NULL, 0, NULL, NULL, 0));
    }
}

/* The steps of form f for bucket index ti, as a context to launch (only
 * the step named by `only` when it is not NULL: "dsa_score", "dsa_select"). */
static cg_ctx dsa_ab_view(const dsa_ab *e, int f, int ti, const char *only)
{
    cg_ctx v = e->ctx[f];
    v.T = DSA_AB_T[ti];
    v.steps = e->steps[f][ti];
    v.n_steps = e->n_steps[f][ti];
    for (int i = 0; only && i < e->n_steps[f][ti]; i++)
        if (!strncmp(v.kernel_names[v.steps[i].kernel], only, strlen(only))) {
            v.steps = &e->steps[f][ti][i];
            v.n_steps = 1;
            return v;
        }
    if (only) {
        fprintf(stderr, "dsa form %s has no %s step\n", DSA_FORM_NAME[f], only);
        exit(1);
    }
    return v;
}

static uint16_t *dsa_key_row(const dsa_ab *e, int s, int x)
{
    return e->keys + ((size_t)e->bt[(size_t)s * e->mb + x / e->bs] * e->bs + x % e->bs) * e->DI;
}

static void dsa_ab_init(dsa_ab *e)
{
    memset(e, 0, sizeof *e);
    e->m = km_module(&V32_DSA_2K);
    if (!e->m)
        exit(1);
    for (int k = 0; k < e->m->n_ops; k++)
        if (e->m->ops[k]->kind == IR_OP_DSA_TOPK)
            e->op = e->m->ops[k];
    e->HI = V32_DSA_2K.HI;
    e->DI = V32_DSA_2K.DI;
    e->K = V32_DSA_2K.TOPK;
    e->bs = 64;
    e->mb = DSA_AB_LEN / e->bs;
    e->rng = 0xd5aab000u;
    dsa_ab_programs(e);
    bind_init(&e->b, e->m, IR_DTYPE_BF16);
    e->b.max_blocks = e->mb;
    int pages = DSA_AB_SEQ * e->mb;
    e->bt = xmalloc((size_t)pages * sizeof *e->bt);
    for (int i = 0; i < pages; i++)
        e->bt[i] = i;
    for (int i = pages - 1; i > 0; i--) {
        int j = irand(&e->rng, i + 1), t = e->bt[i];
        e->bt[i] = e->bt[j];
        e->bt[j] = t;
    }
    e->b.input[IR_INPUT_BLOCK_TABLE] = dalloc((size_t)pages * 4);
    CK(cudaMemcpy(e->b.input[IR_INPUT_BLOCK_TABLE], e->bt, (size_t)pages * 4, cudaMemcpyHostToDevice));
    /* random keys; every 13th position a copy of an earlier one, every 29th zeros */
    size_t n_keys = (size_t)pages * e->bs * e->DI;
    e->keys = xmalloc(n_keys * 2);
    for (size_t i = 0; i < n_keys; i++)
        e->keys[i] = f2bf(urand(&e->rng, 1.7f));
    for (int s = 0; s < DSA_AB_SEQ; s++)
        for (int x = 1; x < DSA_AB_LEN; x++) {
            if (x % 29 == 3)
                memset(dsa_key_row(e, s, x), 0, (size_t)e->DI * 2);
            else if (x % 13 == 5)
                memcpy(dsa_key_row(e, s, x), dsa_key_row(e, s, irand(&e->rng, x)), (size_t)e->DI * 2);
        }
    e->b.kv_by_op = calloc(2 * (size_t)e->m->n_ops, sizeof *e->b.kv_by_op);
    if (!e->b.kv_by_op)
        exit(1);
    void **kp = &e->b.kv_by_op[2 * e->op->id];
    kp[0] = dalloc(n_keys * 2);
    CK(cudaMemcpy(kp[0], e->keys, n_keys * 2, cudaMemcpyHostToDevice));
    kp[1] = dalloc((size_t)TMAX * e->mb * e->bs * 4);
    e->b.input[IR_INPUT_POSITIONS] = dalloc(TMAX * 4);
    e->b.input[IR_INPUT_SLOTS] = dalloc(TMAX * 4);
    for (int a = 0; a < 3; a++)
        act(&e->b, e->op->in[a]);
    act(&e->b, e->op->out[0]);
    e->q = xmalloc((size_t)TMAX * e->HI * e->DI * 4);
    e->w = xmalloc((size_t)TMAX * e->HI * 4);
    e->k = xmalloc((size_t)TMAX * e->DI * 4);
}

static void dsa_ab_free(dsa_ab *e)
{
    for (int f = 0; f < DSA_FORMS; f++) {
        CK(cudaLibraryUnload(e->lib[f]));
        free(e->cubin[f]);
        for (int i = 0; i < 3; i++)
            free(e->steps[f][i]);
        cg_ctx_free(&e->ctx[f]);
    }
    bind_free(&e->b);
    ir_module_free(e->m);
    free(e->keys);
    free(e->bt);
    free(e->q);
    free(e->w);
    free(e->k);
}

/* A step of T tokens: token t of slot[t] at pos[t] (slot -1: padding);
 * fresh random q, w and keys; this step's keys into the host's copy of the
 * cache (the kernels write them into the device's). */
static void dsa_ab_step(dsa_ab *e, int T, const int *slot, const int *pos)
{
    size_t nq = (size_t)T * e->HI * e->DI, nw = (size_t)T * e->HI, nk = (size_t)T * e->DI;
    for (size_t i = 0; i < nq; i++)
        e->q[i] = round_to(IR_DTYPE_BF16, urand(&e->rng, 1.0f));
    for (size_t i = 0; i < nw; i++)
        e->w[i] = round_to(IR_DTYPE_BF16, urand(&e->rng, 1.0f));
    for (size_t i = 0; i < nk; i++)
        e->k[i] = round_to(IR_DTYPE_BF16, urand(&e->rng, 1.7f));
    for (int t = 0; t < T; t++) {
        e->slot[t] = slot[t];
        e->pos[t] = pos[t];
        if (slot[t] >= 0)
            for (int i = 0; i < e->DI; i++)
                dsa_key_row(e, slot[t], pos[t])[i] = f2bf(e->k[(size_t)t * e->DI + i]);
    }
    upload(e->b.val[e->op->in[0]->id], storage(&e->b, e->op->in[0]), e->q, nq);
    upload(e->b.val[e->op->in[1]->id], storage(&e->b, e->op->in[1]), e->k, nk);
    upload(e->b.val[e->op->in[2]->id], storage(&e->b, e->op->in[2]), e->w, nw);
    CK(cudaMemcpy(e->b.input[IR_INPUT_POSITIONS], pos, (size_t)T * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(e->b.input[IR_INPUT_SLOTS], slot, (size_t)T * 4, cudaMemcpyHostToDevice));
}

/* The index score of position x for token t. */
static float dsa_ab_score(const dsa_ab *e, int t, int x)
{
    const uint16_t *k = dsa_key_row(e, e->slot[t], x);
    float kf[512];
    for (int i = 0; i < e->DI; i++)
        kf[i] = bf2f(k[i]);
    return dsa_score_of(e->q + (size_t)t * e->HI * e->DI, e->w + (size_t)t * e->HI, kf, e->HI,
                        e->DI, V32_DSA_2K.dsa_scale, V32_DSA_2K.dsa_wscale);
}

/* Checks token t's selection: the n <= K and padding rows, else against
 * the selection of the scores sc (which must be exact). */
static int dsa_ab_check_sel(const dsa_ab *e, int t, const int *got, const float *sc,
                            const char *what)
{
    int K = e->K, n = e->pos[t] + 1, *want = xmalloc((size_t)K * sizeof *want);
    double gap;
    if (e->slot[t] < 0 || n <= K)
        for (int i = 0; i < K; i++)
            want[i] = e->slot[t] < 0 || i >= n ? -1 : i;
    else
        dsa_select_of(sc, n, K, want, &gap);
    int bad = -1;
    for (int i = 0; i < K && bad < 0; i++)
        if (got[i] != want[i])
            bad = i;
    if (bad >= 0)
        fprintf(stderr, "FAIL %s: token %d (slot %d, position %d): selection [%d] is %d, %d wanted\n",
                what, t, e->slot[t], e->pos[t], bad, got[bad], want[bad]);
    free(want);
    return bad < 0;
}

/* One scenario: every form runs the step's write, score and select; the
 * scores against the reference, the selections exactly. */
static void dsa_ab_run(dsa_ab *e, int ti, const int *slot, const int *pos, const char *label)
{
    int T = DSA_AB_T[ti], K = e->K, row = e->mb * e->bs;
    dsa_ab_step(e, T, slot, pos);
    float *ref = xmalloc((size_t)T * row * 4), *gs = xmalloc((size_t)T * row * 4);
    int *ref_sel = xmalloc((size_t)T * K * 4), *sel = xmalloc((size_t)T * K * 4);
    double gap[TMAX];
    for (int t = 0; t < T; t++) {
        gap[t] = INFINITY;
        if (slot[t] < 0 || pos[t] + 1 <= K)
            continue;
        for (int x = 0; x <= pos[t]; x++)
            ref[(size_t)t * row + x] = dsa_ab_score(e, t, x);
        dsa_select_of(ref + (size_t)t * row, pos[t] + 1, K, ref_sel + (size_t)t * K, &gap[t]);
    }
    void **kp = &e->b.kv_by_op[2 * e->op->id];
    for (int f = 0; f < DSA_FORMS; f++) {
        char what[160];
        snprintf(what, sizeof what, "dsa %s T=%d %s", DSA_FORM_NAME[f], T, label);
        CK(cudaMemset(kp[1], 0xff, (size_t)TMAX * row * 4));
        CK(cudaMemset(e->b.val[e->op->out[0]->id], 0x7f, (size_t)T * K * 4));
        cg_ctx v = dsa_ab_view(e, f, ti, NULL);
        launch_steps(&e->b, &v, e->lib[f]);
        CK(cudaMemcpy(gs, kp[1], (size_t)T * row * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(sel, e->b.val[e->op->out[0]->id], (size_t)T * K * 4, cudaMemcpyDeviceToHost));
        int ok = 1, near = 0;
        double worst = 0;
        for (int t = 0; t < T; t++) {
            const float *g = gs + (size_t)t * row, *r = ref + (size_t)t * row;
            const int *st = sel + (size_t)t * K;
            int scored = slot[t] >= 0 && pos[t] + 1 > K;
            if (scored) {
                double big = 0, err = 0;
                for (int x = 0; x <= pos[t]; x++)
                    big = fmax(big, fabs(r[x]));
                for (int x = 0; x <= pos[t]; x++)
                    err = isfinite(g[x]) ? fmax(err, fabs(g[x] - r[x])) : INFINITY;
                err /= big > 0 ? big : 1;
                worst = fmax(worst, err);
                if (!(err <= 1e-4)) {
                    fprintf(stderr, "FAIL %s: token %d: scores off the reference by %.3g of the largest\n",
                            what, t, err);
                    ok = 0;
                }
            }
            ok &= dsa_ab_check_sel(e, t, st, g, what);
            if (scored && memcmp(st, ref_sel + (size_t)t * K, (size_t)K * 4)) {
                /* the GPU's scores rounded across a near-tie of the reference's */
                near++;
                if (gap[t] > 1e-4) {
                    fprintf(stderr, "FAIL %s: token %d: the selection differs from the reference's "
                                    "with a top-k gap of %.3g\n", what, t, gap[t]);
                    ok = 0;
                }
            }
        }
        T_CHECK(ok);
        printf("%-16s %-14s T=%-2d %-28s scores worst %.2e; selections %s%s\n", "v32_dsa_ab",
               DSA_FORM_NAME[f], T, label, worst, ok ? "exact" : "WRONG",
               near ? " (a near-tie of the reference rounded the other way)" : "");
    }
    free(ref);
    free(gs);
    free(ref_sel);
    free(sel);
}

/* The select alone on crafted score rows: token t's row by pattern t % 8,
 * its position pos[t]. */
static void dsa_ab_crafted(dsa_ab *e, const int *pos)
{
    int T = 64, K = e->K, row = e->mb * e->bs;
    float *sc = xmalloc((size_t)T * row * 4);
    int *sel = xmalloc((size_t)T * K * 4), slot[TMAX];
    for (int t = 0; t < T; t++) {
        slot[t] = t;
        float *r = sc + (size_t)t * row;
        for (int x = 0; x < row; x++) {
            float v;
            switch (t % 8) {
            case 0: v = 0.25f; break;                                     /* all equal */
            case 1: v = irand(&e->rng, 2) ? 0.0f : -0.0f; break;          /* -0 and +0 */
            case 2: v = (float)(irand(&e->rng, 5) - 2) * 0.5f; break;     /* ties everywhere */
            case 3: {                                                     /* NaNs, infinities */
                int c = irand(&e->rng, 40);
                v = c == 0 ? NAN : c == 1 ? -NAN : c == 2 ? INFINITY : c == 3 ? -INFINITY
                                                                     : urand(&e->rng, 3.0f);
                break;
            }
            case 4: {                                                     /* the last bits decide */
                uint32_t u = 0x3f800000u + (uint32_t)irand(&e->rng, 3000);
                memcpy(&v, &u, 4);
                break;
            }
            case 5: v = -1.0f - urand(&e->rng, 0.5f); break;              /* negatives */
            case 6: v = x % 2 ? 1.0f : urand(&e->rng, 2.0f); break;       /* half tie at the top */
            default: v = urand(&e->rng, 100.0f); break;                   /* distinct */
            }
            r[x] = v;
        }
    }
    int pp[TMAX];
    for (int t = 0; t < T; t++)
        pp[t] = pos[t];
    dsa_ab_step(e, T, slot, pp);
    void **kp = &e->b.kv_by_op[2 * e->op->id];
    for (int f = 0; f < DSA_FORMS; f++) {
        char what[160];
        snprintf(what, sizeof what, "dsa %s select on crafted rows", DSA_FORM_NAME[f]);
        CK(cudaMemcpy(kp[1], sc, (size_t)T * row * 4, cudaMemcpyHostToDevice));
        CK(cudaMemset(e->b.val[e->op->out[0]->id], 0x7f, (size_t)T * K * 4));
        cg_ctx v = dsa_ab_view(e, f, 2, "dsa_select");
        launch_steps(&e->b, &v, e->lib[f]);
        CK(cudaMemcpy(sel, e->b.val[e->op->out[0]->id], (size_t)T * K * 4, cudaMemcpyDeviceToHost));
        int ok = 1;
        for (int t = 0; t < T; t++)
            ok &= dsa_ab_check_sel(e, t, sel + (size_t)t * K, sc + (size_t)t * row, what);
        T_CHECK(ok);
        printf("%-16s %-14s T=64 %-28s selections %s\n", "v32_dsa_ab", DSA_FORM_NAME[f],
               "crafted rows", ok ? "exact" : "WRONG");
    }
    free(sc);
    free(sel);
}

/* Microseconds of one launch of view v's steps: 20 of them captured in a
 * CUDA Graph (as the runtime replays a step), the mean of 5 replays after
 * a warm-up, so that launch gaps stay out of the kernels' times. */
static double dsa_ab_time(dsa_ab *e, const cg_ctx *v, cudaLibrary_t lib)
{
    cudaStream_t st;
    cudaGraph_t g;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    launch_steps(&e->b, v, lib);
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    launch_steps_on(&e->b, v, lib, 20, st);
    CK(cudaStreamEndCapture(st, &g));
    double us = graph_us(g, st, 20);
    CK(cudaStreamDestroy(st));
    return us;
}

/* With MOEC_KERN_BENCH: each form's kernels at T = 1 and 64 (a sequence
 * per token, all at position ctx: ctx + 1 positions), contexts 4096 and
 * 16384, random keys; then the select alone on all-equal scores (what
 * `moec bench` gives it: an unfilled cache). */
static void dsa_ab_bench(dsa_ab *e)
{
    if (!getenv("MOEC_KERN_BENCH"))
        return;
    static const int ctxs[2] = {4096, 16384}, tis[2] = {0, 2};
    printf("dsa bench (us a kernel, CUDA Graph of 20 launches): form, T, context, k_write, score, "
           "select, sum\n");
    for (int c = 0; c < 2; c++)
        for (int b = 0; b < 2; b++) {
            int T = DSA_AB_T[tis[b]], slot[TMAX], pos[TMAX];
            for (int t = 0; t < T; t++) {
                slot[t] = t;
                pos[t] = ctxs[c];
            }
            dsa_ab_step(e, T, slot, pos);
            for (int f = 0; f < DSA_FORMS; f++) {
                if (f == DSA_FAST_MIX)
                    continue;
                static const char *const names[3] = {"dsa_k_write", "dsa_score", "dsa_select"};
                double us[3], sum = 0;
                for (int k = 0; k < 3; k++) {
                    cg_ctx v = dsa_ab_view(e, f, tis[b], names[k]);
                    sum += us[k] = dsa_ab_time(e, &v, e->lib[f]);
                }
                printf("  bench dsa %-7s T=%-2d ctx %-5d  k_write %6.1f  score %7.1f  select %6.1f  "
                       "sum %7.1f\n",
                       DSA_FORM_NAME[f], T, ctxs[c], us[0], us[1], us[2], sum);
            }
            /* the select alone on equal scores: every position ties */
            CK(cudaMemset(e->b.kv_by_op[2 * e->op->id + 1], 0, (size_t)T * e->mb * e->bs * 4));
            for (int f = 0; f < DSA_FORMS; f++) {
                if (f == DSA_FAST_MIX)
                    continue;
                cg_ctx v = dsa_ab_view(e, f, tis[b], "dsa_select");
                printf("  bench dsa %-7s T=%-2d ctx %-5d  select on equal scores %6.1f\n",
                       DSA_FORM_NAME[f], T, ctxs[c], dsa_ab_time(e, &v, e->lib[f]));
            }
        }
}

/* The scenarios (sanitize: a small sample, for compute-sanitizer). */
static void dsa_ab_case(int sanitize)
{
    double t0 = now_s();
    dsa_ab e;
    dsa_ab_init(&e);
    /* T = 1: each context (positions pos + 1) on its own; padding alone */
    static const int ctxs[5] = {1000, 2048, 2049, 4096, 16384};
    for (int i = sanitize ? 2 : 0; i < (sanitize ? 4 : 5); i++) {
        int slot = i, pos = ctxs[i] - 1;
        char label[64];
        snprintf(label, sizeof label, "context %d", ctxs[i]);
        dsa_ab_run(&e, 0, &slot, &pos, label);
    }
    int pad = -1, pad_pos = 77;
    dsa_ab_run(&e, 0, &pad, &pad_pos, "padding");
    /* T = 3: a prefill chunk across top_k (2047, 2048, 2049 positions); then
       a long context, padding and 4096 */
    int s3[3] = {5, 5, 5}, p3[3] = {2046, 2047, 2048};
    dsa_ab_run(&e, 1, s3, p3, "chunk at 2047..2049");
    if (!sanitize) {
        int s3b[3] = {6, -1, 7}, p3b[3] = {16383, 300, 4095};
        dsa_ab_run(&e, 1, s3b, p3b, "16384, padding, 4096");
    }
    if (sanitize) {
        dsa_ab_free(&e);
        printf("%-16s (sanitizer sample, %.1f s)\n", "v32_dsa_ab", now_s() - t0);
        return;
    }
    /* T = 64: chunks of 8 tokens at 16384, 8 across top_k, 20 at 4096, single
       tokens at 1000, 2049 and 16384, padding, shuffled */
    int s64[64], p64[64], n = 0;
    for (int j = 0; j < 8; j++, n++) {
        s64[n] = 10;
        p64[n] = 16376 + j;
    }
    for (int j = 0; j < 8; j++, n++) {
        s64[n] = 11;
        p64[n] = 2044 + j;
    }
    for (int j = 0; j < 20; j++, n++) {
        s64[n] = 12;
        p64[n] = 4076 + j;
    }
    static const int singles[6] = {999, 2048, 16383, 2050, 5000, 9999};
    for (int j = 0; j < 6; j++, n++) {
        s64[n] = 13 + j;
        p64[n] = singles[j];
    }
    for (; n < 64; n++) {
        s64[n] = -1;
        p64[n] = irand(&e.rng, DSA_AB_LEN);
    }
    for (int i = 63; i > 0; i--) {
        int j = irand(&e.rng, i + 1), a = s64[i], b = p64[i];
        s64[i] = s64[j];
        p64[i] = p64[j];
        s64[j] = a;
        p64[j] = b;
    }
    dsa_ab_run(&e, 2, s64, p64, "mixed contexts");
    int pc[64];
    for (int t = 0; t < 64; t++)
        pc[t] = (t / 8) % 3 == 0 ? 2048 + t : (t / 8) % 3 == 1 ? 4095 + t : 16320 + t;
    dsa_ab_crafted(&e, pc);
    dsa_ab_bench(&e);
    dsa_ab_free(&e);
    printf("%-16s (forms %s, %s, %s: %.1f s)\n", "v32_dsa_ab", DSA_FORM_NAME[0], DSA_FORM_NAME[1],
           DSA_FORM_NAME[2], now_s() - t0);
}

int main(void)
{
    /* a line at a time: a run a time limit cuts keeps what it printed */
    setvbuf(stdout, NULL, _IOLBF, 0);
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        printf("SKIP: no CUDA device\n");
        return 0;
    }
    double t0 = now_s();
    cache_dir = t_tmpdir("gpu_kernels");
    const unsigned ALL = TM(1) | TM(8) | TM(64), SHORT = TM(1) | TM(2) | TM(8) | TM(16) | TM(64);
    if (getenv("MOEC_KERN_MOE_ONLY")) {
        /* tuning (scripts/gpu_moe_tune.sh): the real-shape MoE cases only,
           every bucket, with MOEC_KERN_BENCH for their times */
        const unsigned EVERY = TM(1) | TM(2) | TM(4) | TM(8) | TM(16) | TM(32) | TM(64);
        prog_add(&V2_MOE, IR_DTYPE_BF16, 64, EVERY);
        prog_add(&Q3_MOE, IR_DTYPE_BF16, 64, TM(8) | TM(32) | TM(64));
        progs_compile();
        moe_case(&V2_MOE, IR_DTYPE_BF16, EVERY, 1);
        moe_case(&Q3_MOE, IR_DTYPE_BF16, TM(8) | TM(32) | TM(64), 6);
        printf("total %.1f s\n", now_s() - t0);
        return t_finish("gpu_kernels (MoE only)");
    }
    if (getenv("MOEC_KERN_MOE_AB")) {
        /* the expert GEMMs' forms (scripts/gpu_moe_ab.sh): the first
           CUDA-core form against the streaming one and its shapes at
           V2-Lite's shape in bf16 and fp8, old and new at Qwen3-30B's and
           DeepSeek-V3's (16 of its experts) and the odd edges; every result
           checked, each expert GEMM timed in a CUDA graph
           (MOEC_KERN_MOE_AB=v2: V2-Lite's only) */
        const unsigned ABT = TM(1) | TM(2) | TM(3) | TM(8), EVERY_V = (1u << N_AB_VARIANTS) - 1;
        const unsigned OLD_NEW = 3u;
        const int n_ab = strcmp(getenv("MOEC_KERN_MOE_AB"), "v2") ? 8 : 0;
        const km_spec *tuned[] = {&V2_MOE, &F8_V2_MOE};
        const km_spec *ab[] = {&Q3_MOE, &F8_Q3_MOE, &V3_MOE, &F8_V3_MOE,
                               &GV_ODD, &GV_ODD_SPLIT, &F8_GV_ODD, &F8_ODD_MOE};
        for (int v = 0; v < N_AB_VARIANTS; v++) {
            ab_set(v);
            for (int i = 0; i < 2; i++)
                prog_add(tuned[i], IR_DTYPE_BF16, 64, ABT);
            for (int i = 0; i < n_ab && (OLD_NEW & (1u << v)); i++)
                prog_add(ab[i], IR_DTYPE_BF16, 64, ABT);
        }
        ab_set(-1);
        progs_compile();
        for (int i = 0; i < 2; i++)
            moe_case_run(tuned[i], IR_DTYPE_BF16, ABT, 60 + (uint64_t)i, FM(CG_FP8_AUTO), EVERY_V);
        for (int i = 0; i < n_ab; i++)
            moe_case_run(ab[i], IR_DTYPE_BF16, ABT, 62 + (uint64_t)i, FM(CG_FP8_AUTO), OLD_NEW);
        progs_free();
        printf("total %.1f s\n", now_s() - t0);
        return t_finish("gpu_kernels (MoE A/B)");
    }
    /* the fp8 kernels' buckets: one token, three, the default buckets' 8,
       32 and 64, and 128 (two token groups of the staged linear) */
    const unsigned F8T = TM(1) | TM(3) | TM(8) | TM(32) | TM(64) | TM(128);
    const unsigned OLD_TC = FM(CG_FP8_OLD) | FM(CG_FP8_TC);
    /* MOEC_KERN_FP8_LINEAR alone means this part too */
    if (getenv("MOEC_KERN_FP8") || getenv("MOEC_KERN_FP8_LINEAR")) {
        /* the fp8 kernels before and after the staged ones (scripts/
           gpu_fp8_tune.sh): DeepSeek-V2-Lite's linears and experts,
           Qwen3-30B's and DeepSeek-V3's experts, every fp8 bucket, both
           choices checked against one interpreter run, with
           MOEC_KERN_BENCH each kernel's time (auto: the old kernels up to
           4 tokens, the staged ones beyond) */
        const km_spec *v2[] = {&F8_V2_QKV_A, &F8_V2_O,    &F8_V2_SH_GU, &F8_V2_SH_DOWN,
                               &F8_V2_GATE,  &F8_V2_DOWN, &F8_V2_MOE};
        /* MOEC_KERN_FP8_LINEAR: the linears alone (V2-Lite's first 6) */
        int lin = getenv("MOEC_KERN_FP8_LINEAR") != NULL, nv2 = lin ? 6 : 7;
        for (int i = 0; i < nv2; i++)
            prog_add_modes(v2[i], IR_DTYPE_BF16, F8T, OLD_TC);
        if (!lin) {
            prog_add_modes(&F8_Q3_MOE, IR_DTYPE_BF16, F8T, OLD_TC);
            prog_add_modes(&F8_V3_MOE, IR_DTYPE_BF16, TM(1) | TM(8) | TM(64), OLD_TC);
        }
        progs_compile();
        e4m3_widen_case();
        for (int i = 0; i < nv2; i++)
            moe_case_modes(v2[i], IR_DTYPE_BF16, F8T, 40 + (uint64_t)i, OLD_TC);
        if (!lin) {
            moe_case_modes(&F8_Q3_MOE, IR_DTYPE_BF16, F8T, 47, OLD_TC);
            moe_case_modes(&F8_V3_MOE, IR_DTYPE_BF16, TM(1) | TM(8) | TM(64), 48, OLD_TC);
        }
        progs_free();
        printf("total %.1f s\n", now_s() - t0);
        return t_finish("gpu_kernels (fp8 old and staged)");
    }
    /* the router in the top-k kernel: its one-token form (T = 1), its
       tensor-core form (2 to 64; 3: a partial token tile) and none (128) */
    const unsigned ROUTER_T = TM(1) | TM(2) | TM(3) | TM(8) | TM(32) | TM(64) | TM(128);
    const km_spec *routers[4] = {&R_V2, &R_Q3, &R_V3, &R_ODD};
    if (getenv("MOEC_KERN_ROUTER_ONLY")) {
        /* those cases alone (with MOEC_KERN_BENCH, their times) */
        for (int i = 0; i < 4; i++)
            prog_add(routers[i], IR_DTYPE_BF16, 64, ROUTER_T);
        progs_compile();
        for (int i = 0; i < 4; i++)
            moe_case(routers[i], IR_DTYPE_BF16, ROUTER_T, 90 + (uint64_t)i);
        progs_free();
        printf("total %.1f s\n", now_s() - t0);
        return t_finish("gpu_kernels (router in the top-k)");
    }
    if (getenv("MOEC_KERN_GQA_PRO_ONLY")) {
        /* GQA's prologue and attention alone (the one-token bucket as one
           kernel, unless MOEC_ATTN_FUSE_PROLOGUE=0) */
        const km_spec *gp[3] = {&GPRO_Q3, &GPRO_ODD, &GPRO_ODD_NORM};
        for (int i = 0; i < 3; i++)
            for (int f32 = 0; f32 < 2; f32++)
                prog_add(gp[i], f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, i < 1 ? 64 : 16,
                         TM(1) | TM(64) | TM(3) | TM(8));
        progs_compile();
        for (int i = 0; i < 3; i++)
            for (int f32 = 0; f32 < 2; f32++)
                pro_case(gp[i], f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, i < 1 ? 64 : 16);
        progs_free();
        printf("total %.1f s\n", now_s() - t0);
        return t_finish("gpu_kernels (GQA prologue)");
    }
    if (getenv("MOEC_KERN_ATTN_ONLY")) {
        /* the GQA attention cases alone, under whatever knobs the
           environment sets at codegen (MOEC_ATTN_LPP, MOEC_ATTN_MERGE, ...) */
        prog_add(&Q3_ATTN, IR_DTYPE_BF16, 64, SHORT);
        prog_add(&ODD_ATTN, IR_DTYPE_BF16, 16, SHORT);
        prog_add(&ODD_ATTN, IR_DTYPE_F32, 16, SHORT);
        progs_compile();
        attn_case_interp(&Q3_ATTN, IR_DTYPE_BF16, 64, 1);
        attn_case_interp(&ODD_ATTN, IR_DTYPE_BF16, 16, 0);
        attn_case_interp(&ODD_ATTN, IR_DTYPE_F32, 16, 0);
        attn_case_long(&Q3_ATTN, IR_DTYPE_BF16, 64, LONG_Q3);
        attn_case_long(&ODD_ATTN, IR_DTYPE_F32, 16, LONG_ODD);
        progs_free();
        printf("total %.1f s\n", now_s() - t0);
        return t_finish("gpu_kernels (GQA attention)");
    }
    if (getenv("MOEC_KERN_MLA_ONLY")) {
        /* the MLA attention cases alone (V2-Lite's 16 heads, V3's 128, an
           odd shape on CUDA cores, V3.2's sparse form over its selection),
           under whatever knobs the environment sets at codegen
           (MOEC_MLA_WARPS, MOEC_MLA_PT, MOEC_MLA_SM2, ...) */
        prog_add(&V2_MLA, IR_DTYPE_BF16, 64, SHORT | TM(32));
        prog_add(&V3_MLA, IR_DTYPE_BF16, 64, SHORT);
        prog_add(&ODD_MLA, IR_DTYPE_BF16, 16, SHORT);
        prog_add(&V32_DSA, IR_DTYPE_BF16, 64, TM(1) | TM(2) | TM(8) | TM(64));
        progs_compile();
        attn_case_interp(&V2_MLA, IR_DTYPE_BF16, 64, 1);
        attn_case_interp(&V3_MLA, IR_DTYPE_BF16, 64, 0);
        attn_case_interp(&ODD_MLA, IR_DTYPE_BF16, 16, 0);
        attn_case_long(&V2_MLA, IR_DTYPE_BF16, 64, LONG_MLA);
        attn_case_long(&V3_MLA, IR_DTYPE_BF16, 64, LONG_MLA);
        dsa_case_interp(&V32_DSA, IR_DTYPE_BF16, 64);
        progs_free();
        printf("total %.1f s\n", now_s() - t0);
        return t_finish("gpu_kernels (MLA attention)");
    }
    if (getenv("MOEC_KERN_DSA_ONLY")) {
        /* the DSA indexer (scripts/gpu_dsa_ab.sh): the sparse MLA over its
           selection at V3.2's shape, then the fast kernels against the
           legacy ones (MOEC_KERN_BENCH: their times too); with
           MOEC_KERN_SANITIZE a sample small enough for compute-sanitizer */
        int san = getenv("MOEC_KERN_SANITIZE") != NULL;
        prog_add(&V32_DSA, IR_DTYPE_BF16, 64, TM(1) | TM(2) | TM(8) | TM(64));
        /* the fused indexer (fuse_dsa_indexer) */
        const unsigned FUSED_T = TM(1) | TM(3) | TM(8) | TM(64);
        prog_add(&V32_DSA_FUSED, IR_DTYPE_BF16, 64, FUSED_T);
        if (san) {
            progs_compile();
            dsa_case_interp(&V32_DSA, IR_DTYPE_BF16, 64);
            dsa_case_fused(&V32_DSA_FUSED, IR_DTYPE_BF16, 64);
            dsa_ab_case(1);
            progs_free();
            printf("total %.1f s\n", now_s() - t0);
            return t_finish("gpu_kernels (DSA sanitizer sample)");
        }
        prog_add(&V32_DSA_2K, IR_DTYPE_BF16, 64, TM(1) | TM(8) | TM(64));
        prog_add(&V32_DSA_FUSED, IR_DTYPE_F32, 64, FUSED_T);
        prog_add(&ODD_DSA_FUSED, IR_DTYPE_BF16, 64, FUSED_T);
        prog_add(&ODD_DSA_FUSED, IR_DTYPE_F32, 64, FUSED_T);
        progs_compile();
        dsa_case_interp(&V32_DSA, IR_DTYPE_BF16, 64);
        for (int f32 = 0; f32 < 2; f32++) {
            dsa_case_fused(&V32_DSA_FUSED, f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, 64);
            dsa_case_fused(&ODD_DSA_FUSED, f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, 64);
        }
        const int long_dsa[3] = {4200, 2049, 700};
        dsa_case_long(&V32_DSA_2K, IR_DTYPE_BF16, 64, long_dsa);
        dsa_ab_case(0);
        progs_free();
        printf("total %.1f s\n", now_s() - t0);
        return t_finish("gpu_kernels (DSA only)");
    }
    if (getenv("MOEC_KERN_SANITIZE")) {
        /* under compute-sanitizer (scripts/gpu_sanitize.sh): a sample of
           the real-shape cases, small buckets, no long contexts, so that
           racecheck finishes inside a device call */
        const unsigned FEW = TM(1) | TM(8), ATT = TM(1) | TM(2) | TM(8) | TM(16);
        prog_add(&V2_MOE, IR_DTYPE_BF16, 64, FEW);
        prog_add(&V3_TOPK, IR_DTYPE_BF16, 64, FEW);
        prog_add(&Q3_MOE, IR_DTYPE_BF16, 64, FEW);
        prog_add(&Q3_ATTN, IR_DTYPE_BF16, 64, ATT);
        prog_add(&V2_MLA, IR_DTYPE_BF16, 64, ATT);
        prog_add(&V2_MLA, IR_DTYPE_F32, 64, ATT);
        prog_add(&V3_MLA, IR_DTYPE_BF16, 64, ATT);
        prog_add(&V32_DSA, IR_DTYPE_BF16, 64, TM(1) | TM(2) | TM(8) | TM(64));
        prog_add(&PRO_V2, IR_DTYPE_BF16, 64, TM(1) | TM(64) | TM(3));
        prog_add(&GPRO_Q3, IR_DTYPE_BF16, 64, TM(1) | TM(64) | TM(3) | TM(8));
        prog_add(&F8_KV_A, IR_DTYPE_BF16, 64, FEW);
        prog_add(&F8_ODD_LINEAR, IR_DTYPE_BF16, 64, FEW);
        prog_add(&F8_ODD_MMA, IR_DTYPE_BF16, 64, FEW);
        /* the streaming expert GEMMs' edges (at T = 1) */
        prog_add(&GV_ODD, IR_DTYPE_BF16, 64, FEW);
        prog_add(&F8_GV_ODD, IR_DTYPE_BF16, 64, FEW);
        /* the staged fp8 kernels: at T = 1 (forced) and 8, K split over
           clusters of 8 */
        prog_add_modes(&F8_TC_ODD, IR_DTYPE_BF16, FEW, FM(CG_FP8_TC));
        prog_add_modes(&F8_TC_SPLIT, IR_DTYPE_BF16, FEW, FM(CG_FP8_TC));
        progs_compile();
        moe_case(&V2_MOE, IR_DTYPE_BF16, FEW, 1);
        moe_case(&V3_TOPK, IR_DTYPE_BF16, FEW, 4);
        moe_case(&Q3_MOE, IR_DTYPE_BF16, FEW, 6);
        attn_case_interp(&Q3_ATTN, IR_DTYPE_BF16, 64, 0);
        attn_case_interp(&V2_MLA, IR_DTYPE_BF16, 64, 0);
        attn_case_interp(&V2_MLA, IR_DTYPE_F32, 64, 0);
        attn_case_interp(&V3_MLA, IR_DTYPE_BF16, 64, 0);
        dsa_case_interp(&V32_DSA, IR_DTYPE_BF16, 64);
        pro_case(&PRO_V2, IR_DTYPE_BF16, 64);
        pro_case(&GPRO_Q3, IR_DTYPE_BF16, 64);
        dsa_ab_case(1);
        moe_case(&F8_KV_A, IR_DTYPE_BF16, FEW, 21);
        moe_case(&F8_ODD_LINEAR, IR_DTYPE_BF16, FEW, 22);
        moe_case(&F8_ODD_MMA, IR_DTYPE_BF16, FEW, 23);
        moe_case(&GV_ODD, IR_DTYPE_BF16, FEW, 50);
        moe_case(&F8_GV_ODD, IR_DTYPE_BF16, FEW, 53);
        moe_case_modes(&F8_TC_ODD, IR_DTYPE_BF16, FEW, 24, FM(CG_FP8_TC));
        moe_case_modes(&F8_TC_SPLIT, IR_DTYPE_BF16, FEW, 25, FM(CG_FP8_TC));
        progs_free();
        printf("total %.1f s\n", now_s() - t0);
        return t_finish("gpu_kernels (sanitizer sample)");
    }
    const km_spec *add3[3] = {&ADD3_V2, &ADD3_V3, &ADD3_ODD};
    if (getenv("MOEC_KERN_LINEAR_ONLY")) {
        linear_cases(0);
        progs_compile();
        linear_cases(1);
        progs_free();
        printf("total %.1f s\n", now_s() - t0);
        return t_finish("gpu_kernels (linears)");
    }
    const unsigned FUSE_T = TM(1) | TM(3) | TM(8);
    const km_spec *sums[5] = {&SUM_V2, &SUM_V3, &SUM_Q3, &SUM_V3_R256, &SUM_ODD};
    if (getenv("MOEC_KERN_NORM_ONLY")) {
        /* the residual add_rms_norms alone: the add3 cases (hidden 2048,
           7168, odd) and the routed sums' (fuse_moe_sum: 2048, 7168, 512,
           odd), whose long rows take a block each, bf16 and fp32 */
        for (int f32 = 0; f32 < 2; f32++) {
            ir_dtype cdt = f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16;
            for (int i = 0; i < 3; i++)
                prog_add(add3[i], cdt, 64, TM(1) | TM(8) | TM(64));
            for (int i = 0; i < 5; i++)
                prog_add(sums[i], cdt, 64, FUSE_T);
        }
        progs_compile();
        for (int f32 = 0; f32 < 2; f32++) {
            ir_dtype cdt = f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16;
            for (int i = 0; i < 3; i++)
                moe_case(add3[i], cdt, TM(1) | TM(8) | TM(64), 30 + (uint64_t)(2 * i + f32));
            for (int i = 0; i < 5; i++)
                moe_case(sums[i], cdt, FUSE_T, 60 + (uint64_t)(2 * i + f32));
        }
        progs_free();
        printf("total %.1f s\n", now_s() - t0);
        return t_finish("gpu_kernels (residual add_rms_norms)");
    }
    prog_add(&V2_MOE, IR_DTYPE_BF16, 64, ALL);
    prog_add(&V2_EXPERTS, IR_DTYPE_BF16, 64, TM(8));
    prog_add(&V3_MOE, IR_DTYPE_BF16, 64, TM(1) | TM(8));
    prog_add(&V3_TOPK, IR_DTYPE_BF16, 64, ALL);
    prog_add(&V2_GROUPED, IR_DTYPE_BF16, 64, TM(64));
    prog_add(&Q3_MOE, IR_DTYPE_BF16, 64, TM(1) | TM(8) | TM(32));
    prog_add(&Q3_MOE, IR_DTYPE_F32, 64, TM(8));
    prog_add(&ODD_EXPERTS, IR_DTYPE_BF16, 64, ALL);
    prog_add(&ODD_EXPERTS, IR_DTYPE_F32, 64, ALL);
    prog_add(&ODD_ROUTED, IR_DTYPE_F32, 64, ALL);
    prog_add(&Q3_ATTN, IR_DTYPE_BF16, 64, SHORT);
    prog_add(&Q3_ATTN, IR_DTYPE_F32, 64, SHORT);
    prog_add(&MHA_ATTN, IR_DTYPE_BF16, 64, SHORT);
    prog_add(&ODD_ATTN, IR_DTYPE_BF16, 16, SHORT);
    prog_add(&ODD_ATTN, IR_DTYPE_F32, 16, SHORT);
    prog_add(&V2_MLA, IR_DTYPE_BF16, 64, SHORT);
    prog_add(&V2_MLA, IR_DTYPE_F32, 64, SHORT);
    prog_add(&V3_MLA, IR_DTYPE_BF16, 64, SHORT);
    prog_add(&ODD_MLA, IR_DTYPE_BF16, 16, SHORT);
    prog_add(&ODD_MLA, IR_DTYPE_F32, 16, SHORT);
    const unsigned DSA_T = TM(1) | TM(2) | TM(8) | TM(64);
    prog_add(&V32_DSA, IR_DTYPE_BF16, 64, DSA_T);
    prog_add(&V32_DSA, IR_DTYPE_F32, 64, DSA_T);
    prog_add(&V32_DSA_2K, IR_DTYPE_BF16, 64, TM(1) | TM(8) | TM(64));
    prog_add(&ODD_DSA, IR_DTYPE_BF16, 16, DSA_T);
    prog_add(&ODD_DSA, IR_DTYPE_F32, 16, DSA_T);
    const unsigned FUSED_T = TM(1) | TM(3) | TM(8) | TM(64);
    for (int f32 = 0; f32 < 2; f32++) {
        prog_add(&V32_DSA_FUSED, f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, 64, FUSED_T);
        prog_add(&ODD_DSA_FUSED, f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, 64, FUSED_T);
    }
    for (int i = 0; i < 3; i++)
        for (int f32 = 0; f32 < 2; f32++)
            prog_add(add3[i], f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, 64, TM(1) | TM(8) | TM(64));
    /* the buckets of generated kernels: the tensor-core form from 3 tokens
       in bf16 where the sizes allow (cuBLASLt steps do not run here) */
    const km_spec *absorbs[4] = {&ABS_V2, &ABS_V3, &ABS_ODD, &ABS_MMA_ODD};
    const unsigned ABS_T = TM(1) | TM(2), ABS_MMA_T = ABS_T | TM(3) | TM(8) | TM(64);
#define ABS_MASK(i, f32) ((f32) || (i) == 2 ? ABS_T : ABS_MMA_T)
    if (getenv("MOEC_KERN_ABSORB_ONLY")) {
        /* those cases alone (bf16: both generated forms) */
        for (int i = 0; i < 4; i++)
            prog_add(absorbs[i], IR_DTYPE_BF16, 64, ABS_MASK(i, 0));
        progs_compile();
        for (int i = 0; i < 4; i++)
            moe_case(absorbs[i], IR_DTYPE_BF16, ABS_MASK(i, 0), 40 + (uint64_t)(2 * i));
        progs_free();
        printf("total %.1f s\n", now_s() - t0);
        return t_finish("gpu_kernels (MLA absorptions)");
    }
    for (int i = 0; i < 4; i++)
        for (int f32 = 0; f32 < 2; f32++)
            prog_add(absorbs[i], f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, 64, ABS_MASK(i, f32));
    /* issue 15's fused forms at T = 1, 3, 8 */
    for (int f32 = 0; f32 < 2; f32++)
        for (int i = 0; i < 5; i++)
            prog_add(sums[i], f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, 64, FUSE_T);
    linear_cases(0);
    for (int i = 0; i < 4; i++)
        prog_add(routers[i], IR_DTYPE_BF16, 64, ROUTER_T);
    const unsigned PRO_T = TM(1) | TM(64) | TM(3);
    const km_spec *pros[4] = {&PRO_V2, &PRO_V3, &PRO_ODD, &PRO_ODD_Q};
    for (int i = 0; i < 4; i++)
        for (int f32 = 0; f32 < 2; f32++)
            prog_add(pros[i], f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, i < 2 ? 64 : 16, PRO_T);
    const km_spec *gpros[3] = {&GPRO_Q3, &GPRO_ODD, &GPRO_ODD_NORM};
    for (int i = 0; i < 3; i++)
        for (int f32 = 0; f32 < 2; f32++)
            prog_add(gpros[i], f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, i < 1 ? 64 : 16,
                     PRO_T | TM(8));
    /* fp8: the few-rows kernel (T <= 4), the staged kernels beyond (auto)
       and the first tensor-core ones they replace (old), the staged ones
       at every bucket (tc), the few-rows kernel per 4 rows (f32, or K not
       in 32-wide chunks) */
    const unsigned LIN = TM(1) | TM(2) | TM(4) | TM(8) | TM(16) | TM(64);
    const unsigned AUTO_OLD = FM(CG_FP8_AUTO) | FM(CG_FP8_OLD), EVERY_FP8 = AUTO_OLD | FM(CG_FP8_TC);
    prog_add_modes(&F8_KV_A, IR_DTYPE_BF16, LIN, AUTO_OLD);
    prog_add(&F8_KV_A, IR_DTYPE_F32, 64, TM(1) | TM(8));
    prog_add_modes(&F8_QKV_A, IR_DTYPE_BF16, LIN, AUTO_OLD);
    prog_add_modes(&F8_O_PROJ, IR_DTYPE_BF16, TM(1) | TM(8) | TM(64), AUTO_OLD);
    prog_add_modes(&F8_V2_DOWN, IR_DTYPE_BF16, TM(1) | TM(32), AUTO_OLD);
    prog_add_modes(&F8_V2_GATE, IR_DTYPE_BF16, TM(8) | TM(32) | TM(64), AUTO_OLD);
    prog_add_modes(&F8_V2_O, IR_DTYPE_BF16, F8T, EVERY_FP8);
    prog_add(&F8_ODD_LINEAR, IR_DTYPE_BF16, 64, LIN);
    prog_add(&F8_ODD_LINEAR, IR_DTYPE_F32, 64, ALL);
    prog_add_modes(&F8_V3_MOE, IR_DTYPE_BF16, TM(1) | TM(2) | TM(8) | TM(64), AUTO_OLD);
    prog_add_modes(&F8_Q3_MOE, IR_DTYPE_BF16, TM(1) | TM(8) | TM(64), AUTO_OLD);
    prog_add_modes(&F8_V2_MOE, IR_DTYPE_BF16, F8T, EVERY_FP8);
    prog_add(&F8_ODD_MOE, IR_DTYPE_BF16, 64, ALL);
    prog_add(&F8_ODD_MOE, IR_DTYPE_F32, 64, ALL);
    const unsigned GVT = TM(1) | TM(2) | TM(3) | TM(8);
    prog_add(&GV_ODD, IR_DTYPE_BF16, 64, GVT);
    prog_add(&GV_ODD, IR_DTYPE_F32, 64, GVT);
    prog_add(&GV_ODD_SPLIT, IR_DTYPE_BF16, 64, GVT);
    prog_add(&F8_GV_ODD, IR_DTYPE_BF16, 64, GVT);
    prog_add(&F8_GV_ODD, IR_DTYPE_F32, 64, GVT);
    prog_add(&F8_ODD_MMA, IR_DTYPE_BF16, 64, ALL);
    prog_add_modes(&F8_TC_ODD, IR_DTYPE_BF16, F8T, EVERY_FP8);
    prog_add(&F8_TC_ODD, IR_DTYPE_F32, 64, ALL);
    prog_add_modes(&F8_TC_SPLIT, IR_DTYPE_BF16, F8T, EVERY_FP8);
    prog_add_modes(&F8_TC_EXPERTS, IR_DTYPE_BF16, ALL, EVERY_FP8);
    progs_compile();
    e4m3_widen_case();

    moe_case(&V2_MOE, IR_DTYPE_BF16, ALL, 1);
    moe_case(&V2_EXPERTS, IR_DTYPE_BF16, TM(8), 2);
    moe_case(&V3_MOE, IR_DTYPE_BF16, TM(1) | TM(8), 3);
    moe_case(&V3_TOPK, IR_DTYPE_BF16, ALL, 4);
    moe_case(&V2_GROUPED, IR_DTYPE_BF16, TM(64), 5);
    moe_case(&Q3_MOE, IR_DTYPE_BF16, TM(1) | TM(8) | TM(32), 6);
    moe_case(&Q3_MOE, IR_DTYPE_F32, TM(8), 7);
    moe_case(&ODD_EXPERTS, IR_DTYPE_BF16, ALL, 8);
    moe_case(&ODD_EXPERTS, IR_DTYPE_F32, ALL, 9);
    moe_case(&ODD_ROUTED, IR_DTYPE_F32, ALL, 10);
    moe_case_modes(&F8_KV_A, IR_DTYPE_BF16, LIN, 11, AUTO_OLD);
    moe_case(&F8_KV_A, IR_DTYPE_F32, TM(1) | TM(8), 12);
    moe_case_modes(&F8_QKV_A, IR_DTYPE_BF16, LIN, 13, AUTO_OLD);
    moe_case_modes(&F8_O_PROJ, IR_DTYPE_BF16, TM(1) | TM(8) | TM(64), 14, AUTO_OLD);
    moe_case_modes(&F8_V2_DOWN, IR_DTYPE_BF16, TM(1) | TM(32), 15, AUTO_OLD);
    moe_case_modes(&F8_V2_GATE, IR_DTYPE_BF16, TM(8) | TM(32) | TM(64), 23, AUTO_OLD);
    moe_case_modes(&F8_V2_O, IR_DTYPE_BF16, F8T, 24, EVERY_FP8);
    moe_case(&F8_ODD_LINEAR, IR_DTYPE_BF16, LIN, 16);
    moe_case(&F8_ODD_LINEAR, IR_DTYPE_F32, ALL, 17);
    moe_case_modes(&F8_V3_MOE, IR_DTYPE_BF16, TM(1) | TM(2) | TM(8) | TM(64), 18, AUTO_OLD);
    moe_case_modes(&F8_Q3_MOE, IR_DTYPE_BF16, TM(1) | TM(8) | TM(64), 19, AUTO_OLD);
    moe_case_modes(&F8_V2_MOE, IR_DTYPE_BF16, F8T, 25, EVERY_FP8);
    moe_case(&F8_ODD_MOE, IR_DTYPE_BF16, ALL, 20);
    moe_case(&F8_ODD_MOE, IR_DTYPE_F32, ALL, 21);
    moe_case(&GV_ODD, IR_DTYPE_BF16, GVT, 50);
    moe_case(&GV_ODD, IR_DTYPE_F32, GVT, 51);
    moe_case(&GV_ODD_SPLIT, IR_DTYPE_BF16, GVT, 52);
    moe_case(&F8_GV_ODD, IR_DTYPE_BF16, GVT, 53);
    moe_case(&F8_GV_ODD, IR_DTYPE_F32, GVT, 54);
    moe_case(&F8_ODD_MMA, IR_DTYPE_BF16, ALL, 22);
    moe_case_modes(&F8_TC_ODD, IR_DTYPE_BF16, F8T, 26, EVERY_FP8);
    moe_case(&F8_TC_ODD, IR_DTYPE_F32, ALL, 27);
    moe_case_modes(&F8_TC_SPLIT, IR_DTYPE_BF16, F8T, 28, EVERY_FP8);
    moe_case_modes(&F8_TC_EXPERTS, IR_DTYPE_BF16, ALL, 29, EVERY_FP8);

    attn_case_interp(&Q3_ATTN, IR_DTYPE_BF16, 64, 1);
    attn_case_interp(&Q3_ATTN, IR_DTYPE_F32, 64, 1);
    attn_case_interp(&MHA_ATTN, IR_DTYPE_BF16, 64, 1);
    attn_case_interp(&ODD_ATTN, IR_DTYPE_BF16, 16, 0);
    attn_case_interp(&ODD_ATTN, IR_DTYPE_F32, 16, 0);
    attn_case_interp(&V2_MLA, IR_DTYPE_BF16, 64, 1);
    attn_case_interp(&V2_MLA, IR_DTYPE_F32, 64, 1);
    attn_case_interp(&V3_MLA, IR_DTYPE_BF16, 64, 0);
    attn_case_interp(&ODD_MLA, IR_DTYPE_BF16, 16, 0);
    attn_case_interp(&ODD_MLA, IR_DTYPE_F32, 16, 0);
    attn_case_long(&Q3_ATTN, IR_DTYPE_BF16, 64, LONG_Q3);
    attn_case_long(&V2_MLA, IR_DTYPE_BF16, 64, LONG_MLA);
    attn_case_long(&V3_MLA, IR_DTYPE_BF16, 64, LONG_MLA);
    attn_case_long(&ODD_ATTN, IR_DTYPE_F32, 16, LONG_ODD);
    attn_case_long(&ODD_MLA, IR_DTYPE_F32, 16, LONG_ODD);

    dsa_case_interp(&V32_DSA, IR_DTYPE_BF16, 64);
    dsa_case_interp(&V32_DSA, IR_DTYPE_F32, 64);
    dsa_case_interp(&ODD_DSA, IR_DTYPE_BF16, 16);
    dsa_case_interp(&ODD_DSA, IR_DTYPE_F32, 16);
    const int long_dsa[3] = {4200, 2049, 700}, long_odd_dsa[3] = {200, 6, 5};
    dsa_case_long(&V32_DSA_2K, IR_DTYPE_BF16, 64, long_dsa);
    dsa_case_long(&ODD_DSA, IR_DTYPE_F32, 16, long_odd_dsa);
    for (int f32 = 0; f32 < 2; f32++) {
        dsa_case_fused(&V32_DSA_FUSED, f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, 64);
        dsa_case_fused(&ODD_DSA_FUSED, f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, 64);
    }
    dsa_ab_case(0);

    for (int i = 0; i < 4; i++)
        for (int f32 = 0; f32 < 2; f32++)
            pro_case(pros[i], f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, i < 2 ? 64 : 16);
    for (int i = 0; i < 3; i++)
        for (int f32 = 0; f32 < 2; f32++)
            pro_case(gpros[i], f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, i < 1 ? 64 : 16);
    for (int i = 0; i < 3; i++)
        for (int f32 = 0; f32 < 2; f32++)
            moe_case(add3[i], f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, TM(1) | TM(8) | TM(64),
                     30 + (uint64_t)(2 * i + f32));
    for (int i = 0; i < 4; i++)
        for (int f32 = 0; f32 < 2; f32++)
            moe_case(absorbs[i], f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, ABS_MASK(i, f32),
                     40 + (uint64_t)(2 * i + f32));
    for (int f32 = 0; f32 < 2; f32++)
        for (int i = 0; i < 5; i++)
            moe_case(sums[i], f32 ? IR_DTYPE_F32 : IR_DTYPE_BF16, FUSE_T,
                     60 + (uint64_t)(2 * i + f32));
    linear_cases(1);
    for (int i = 0; i < 4; i++)
        moe_case(routers[i], IR_DTYPE_BF16, ROUTER_T, 90 + (uint64_t)i);

    progs_free();
    printf("total %.1f s\n", now_s() - t0);
    return t_finish("gpu_kernels");
}

#else

int main(void)
{
    printf("SKIP: no CUDA device\n");
    return 0;
}

#endif
