/* cuda_blaslt.c — cuBLASLt, opened with dlopen when a context is made
 * (linking it would load half a gigabyte of library into every moec binary,
 * CPU-only runs included), and the GEMM steps prepared once at init:
 * descriptors, layouts and the algorithm the heuristic picks (with
 * MOEC_GEMM_TUNE, the fastest of its first candidates, timed). */
#ifdef MOEC_HAVE_CUDA

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda_internal.h"

moec_status rt_lt_open(rt_lt_api *lt)
{
    static const char *const names[] = {"libcublasLt.so." RT_CUDA_STR(CUBLAS_VER_MAJOR),
                                        "libcublasLt.so"};
    const char *err = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names && !lt->dl; i++) {
        lt->dl = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lt->dl && !err)
            err = dlerror();
    }
    /* Beside the CUDA runtime this binary uses, when that is not on the
     * loader's path. */
    Dl_info info;
    cudaError_t (*probe)(int *) = cudaGetDeviceCount;
    void *addr;
    memcpy(&addr, &probe, sizeof addr);
    if (!lt->dl && dladdr(addr, &info) && info.dli_fname) {
        char path[4096];
        const char *slash = strrchr(info.dli_fname, '/');
        if (slash) {
            snprintf(path, sizeof path, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname,
                     names[0]);
            lt->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        }
    }
    if (!lt->dl)
        return MOEC_ERR(MOEC_ERR_CUDA, "cannot load cuBLASLt (%s): %s", names[0],
                        err ? err : "not found");
#define RT_LT_LOAD(f)                                                                         \
    {                                                                                         \
        void *sym = dlsym(lt->dl, #f);                                                        \
        if (!sym)                                                                             \
            return MOEC_ERR(MOEC_ERR_CUDA, "cuBLASLt (%s) has no %s", names[0], #f);          \
        memcpy(&lt->f, &sym, sizeof sym);                                                     \
    }
    RT_LT_FUNCS(RT_LT_LOAD)
#undef RT_LT_LOAD
    return MOEC_OK;
}

cudaDataType_t rt_lt_type(ir_dtype dt)
{
    switch (dt) {
    case IR_DTYPE_F16: return CUDA_R_16F;
    case IR_DTYPE_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
    }
}

/* Checks that a matrix of rows x cols (column-major, leading dimension ld,
 * batch copies stride elements apart) of dtype dt lies inside r. */
static moec_status gemm_operand(const char *where, const char *what, const rt_cuda_ref *r,
                                ir_dtype dt, int64_t rows, int64_t cols, int64_t ld,
                                int64_t stride, int batch)
{
    if (!r->is_ptr)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: %s is not a device buffer", where, what);
    if (!rt_float_dtype(dt))
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: %s has dtype %s", where, what, ir_dtype_name(dt));
    if (r->dtype >= 0 && r->dtype != (int)dt)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: %s is stored as %s but the gemm reads it as %s",
                        where, what, ir_dtype_name((ir_dtype)r->dtype), ir_dtype_name(dt));
    if (ld < rows || stride < 0)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: %s: leading dimension %lld < %lld rows", where,
                        what, (long long)ld, (long long)rows);
    int64_t last = (int64_t)(batch - 1) * stride + (cols - 1) * ld + rows;
    size_t need = (size_t)last * ir_dtype_size(dt);
    if (need > r->avail)
        return MOEC_ERR(MOEC_ERR_INTERNAL,
                        "%s: %s spans %zu bytes but its buffer has %zu from there", where, what,
                        need, r->avail);
    return MOEC_OK;
}

/* The largest power of two (up to 256) dividing the address and, when
 * batched, the stride between batches. */
static uint32_t alignment(const void *p, int64_t stride_bytes, int batch)
{
    uintptr_t a = (uintptr_t)p | (batch > 1 ? (uintptr_t)stride_bytes : 0);
    uint32_t al = 256;
    while (al > 1 && (a & (al - 1)))
        al >>= 1;
    return al;
}

static moec_status layout_init(rt_cuda *c, cublasLtMatrixLayout_t *l, ir_dtype dt, int64_t rows,
                               int64_t cols, int64_t ld, int batch, int64_t stride,
                               const char *where)
{
    MOEC_TRY(LT(c, c->lt.cublasLtMatrixLayoutCreate(l, rt_lt_type(dt), (uint64_t)rows, (uint64_t)cols, ld),
                where));
    if (batch > 1) {
        int32_t count = batch;
        MOEC_TRY(LT(c,
                    c->lt.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                           &count, sizeof count),
                    where));
        MOEC_TRY(LT(c,
                    c->lt.cublasLtMatrixLayoutSetAttribute(
                        *l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
                    where));
    }
    return MOEC_OK;
}

/* What makes two GEMM steps one shape to the tuning: every field of the
 * step's GEMM that reaches cuBLASLt but the pointers, their alignments and
 * the stream. Zeroed first (padding), compared with memcmp. */
typedef struct rt_gemm_key {
    int64_t m, n, k, batch, lda, ldb, ldc, sa, sb, sc;
    int32_t ta, tb, type_a, type_b, type_c, bias, type_bias, stream;
    uint32_t align[4];
    float alpha;
} rt_gemm_key;

struct rt_gemm_tuned {
    rt_gemm_key key;
    cublasLtMatmulAlgo_t algo;
};

static void gemm_key(const ir_step *s, const uint32_t align[4], rt_gemm_key *k)
{
    const ir_gemm *g = &s->gemm;
    memset(k, 0, sizeof *k);
    k->m = g->m;
    k->n = g->n;
    k->k = g->k;
    k->batch = g->batch;
    k->lda = g->lda;
    k->ldb = g->ldb;
    k->ldc = g->ldc;
    k->sa = g->stride_a;
    k->sb = g->stride_b;
    k->sc = g->stride_c;
    k->ta = g->trans_a;
    k->tb = g->trans_b;
    k->type_a = g->type_a;
    k->type_b = g->type_b;
    k->type_c = g->type_c;
    k->bias = g->has_bias;
    k->type_bias = g->has_bias ? g->type_bias : 0;
    k->stream = s->stream;
    memcpy(k->align, align, sizeof k->align);
    k->alpha = g->alpha;
}

/* The algorithm MOEC_GEMM_TUNE chose for a step of shape key before, or
 * NULL. */
static const cublasLtMatmulAlgo_t *tuned_algo(const rt_cuda *c, const rt_gemm_key *key)
{
    for (int i = 0; i < c->n_tuned; i++)
        if (!memcmp(&c->tuned[i].key, key, sizeof *key))
            return &c->tuned[i].algo;
    return NULL;
}

/* The fastest of the heuristic's n candidates into g->algo: each run once
 * and then timed over RT_GEMM_TUNE_REPS runs on the step's stream (on its
 * operands: set-up time, before any step or capture). A candidate cuBLASLt
 * will not run is passed over; g->algo stays as it was where none ran. */
#define RT_GEMM_TUNE_REPS 5
static moec_status fastest_algo(rt_cuda *c, const ir_step *s, rt_cuda_gemm *g,
                                const cublasLtMatmulHeuristicResult_t *res, int n,
                                const char *where)
{
    cudaStream_t st = c->stream[s->stream];
    cudaEvent_t ev[2] = {NULL, NULL};
    moec_status rc = CK(cudaEventCreate(&ev[0]), where);
    if (rc == MOEC_OK)
        rc = CK(cudaEventCreate(&ev[1]), where);
    float best = -1.0f;
    for (int i = 0; rc == MOEC_OK && i < n; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS)
            continue;
        int ok = 1;
        for (int r = 0; ok && rc == MOEC_OK && r <= RT_GEMM_TUNE_REPS; r++) {
            if (r == 1)
                rc = CK(cudaEventRecord(ev[0], st), where);
            if (rc == MOEC_OK)
                ok = c->lt.cublasLtMatmul(c->lt_handle[s->stream], g->desc, &g->alpha, g->a,
                                          g->la, g->b, g->lb, &g->beta, g->c, g->lc, g->c, g->lc,
                                          &res[i].algo, c->workspace[s->stream],
                                          RT_CUDA_WORKSPACE, st) == CUBLAS_STATUS_SUCCESS;
        }
        float ms = 0.0f;
        if (rc == MOEC_OK)
            rc = CK(cudaEventRecord(ev[1], st), where);
        if (rc == MOEC_OK)
            rc = CK(cudaEventSynchronize(ev[1]), where);
        if (rc == MOEC_OK && ok)
            rc = CK(cudaEventElapsedTime(&ms, ev[0], ev[1]), where);
        if (rc == MOEC_OK && ok && (best < 0.0f || ms < best)) {
            best = ms;
            g->algo = res[i].algo;
        }
    }
    for (int i = 0; i < 2; i++)
        if (ev[i])
            cudaEventDestroy(ev[i]);
    return rc;
}

/* MOEC_GEMM_TUNE for a shape (key) not seen before: the fastest of the
 * heuristic's n candidates (g->algo, the first, where it gave one), kept
 * for every later step of the same shape (other layers, the same
 * bucket's twin). */
static moec_status gemm_tune(rt_cuda *c, const ir_step *s, rt_cuda_gemm *g,
                             const cublasLtMatmulHeuristicResult_t *res, int n,
                             const rt_gemm_key *key, const char *where)
{
    if (c->n_tuned == c->cap_tuned) {
        int cap = c->cap_tuned ? 2 * c->cap_tuned : 32;
        struct rt_gemm_tuned *t = realloc(c->tuned, (size_t)cap * sizeof *t);
        if (!t)
            return MOEC_ERR(MOEC_ERR_OOM, "%s: out of memory tuning the GEMM", where);
        c->tuned = t;
        c->cap_tuned = cap;
    }
    if (n > 1)
        MOEC_TRY(fastest_algo(c, s, g, res, n, where));
    c->tuned[c->n_tuned].key = *key;
    c->tuned[c->n_tuned].algo = g->algo;
    c->n_tuned++;
    return MOEC_OK;
}

/* Chooses the algorithm for g with pointers of the given alignments: the
 * heuristic's first, or with MOEC_GEMM_TUNE the fastest of its first
 * candidates (gemm_tune), chosen once a shape. */
static moec_status gemm_algo(rt_cuda *c, const ir_step *s, rt_cuda_gemm *g,
                             cublasLtMatmulPreference_t pref, const uint32_t align[4],
                             const char *where)
{
    rt_gemm_key key;
    if (c->gemm_tune > 1) {
        gemm_key(s, align, &key);
        const cublasLtMatmulAlgo_t *a = tuned_algo(c, &key);
        if (a) {
            g->algo = *a;
            return MOEC_OK;
        }
    }
    uint64_t ws = RT_CUDA_WORKSPACE;
    MOEC_TRY(LT(c,
                c->lt.cublasLtMatmulPreferenceSetAttribute(
                    pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                where));
    static const cublasLtMatmulPreferenceAttributes_t keys[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        MOEC_TRY(LT(c,
                    c->lt.cublasLtMatmulPreferenceSetAttribute(pref, keys[i], &align[i],
                                                               sizeof align[i]),
                    where));
    cublasLtMatmulHeuristicResult_t res[RT_GEMM_TUNE_MAX];
    int found = 0, want = c->gemm_tune > 1 ? c->gemm_tune : 1;
    memset(res, 0, sizeof res);
    MOEC_TRY(LT(c,
                c->lt.cublasLtMatmulAlgoGetHeuristic(c->lt_handle[s->stream], g->desc, g->la, g->lb,
                                                     g->lc, g->lc, pref, want, res, &found),
                where));
    if (found < 1)
        return MOEC_ERR(MOEC_ERR_CUDA,
                        "%s: cuBLASLt has no algorithm for A %s, B %s, C %s%s%s (alignments %u, "
                        "%u, %u bytes)",
                        where, ir_dtype_name(s->gemm.type_a), ir_dtype_name(s->gemm.type_b),
                        ir_dtype_name(s->gemm.type_c), s->gemm.has_bias ? ", bias " : "",
                        s->gemm.has_bias ? ir_dtype_name(s->gemm.type_bias) : "", align[0],
                        align[1], align[2]);
    g->algo = res[0].algo;
    return c->gemm_tune > 1 ? gemm_tune(c, s, g, res, found, &key, where) : MOEC_OK;
}

moec_status rt_cuda_prepare_gemm(rt_cuda *c, rt_cuda_bucket *cb, const ir_step *s,
                                rt_cuda_launch *L, const char *where)
{
    const ir_gemm *gm = &s->gemm;
    rt_cuda_gemm *g = &L->gemm;
    if (gm->m < 1 || gm->n < 1 || gm->k < 1 || gm->batch < 1)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: empty gemm", where);
    int64_t ar = gm->trans_a ? gm->k : gm->m, ac = gm->trans_a ? gm->m : gm->k;
    int64_t br = gm->trans_b ? gm->n : gm->k, bc = gm->trans_b ? gm->k : gm->n;
    rt_cuda_ref ra, rb, rc, rbias;
    MOEC_TRY(rt_cuda_resolve_arg(c, cb->b, &gm->a, &ra, where, 0));
    MOEC_TRY(rt_cuda_resolve_arg(c, cb->b, &gm->b, &rb, where, 1));
    MOEC_TRY(rt_cuda_resolve_arg(c, cb->b, &gm->c, &rc, where, 2));
    MOEC_TRY(gemm_operand(where, "A", &ra, gm->type_a, ar, ac, gm->lda, gm->stride_a, gm->batch));
    MOEC_TRY(gemm_operand(where, "B", &rb, gm->type_b, br, bc, gm->ldb, gm->stride_b, gm->batch));
    MOEC_TRY(gemm_operand(where, "C", &rc, gm->type_c, gm->m, gm->n, gm->ldc, gm->stride_c,
                          gm->batch));
    g->a = ra.val.p;
    g->b = rb.val.p;
    g->c = rc.val.p;
    g->alpha = gm->alpha;
    g->beta = 0.0f;

    MOEC_TRY(LT(c, c->lt.cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), where));
    int32_t ta = gm->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = gm->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    MOEC_TRY(LT(c,
                c->lt.cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                     sizeof ta),
                where));
    MOEC_TRY(LT(c,
                c->lt.cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                     sizeof tb),
                where));
    if (gm->has_bias) {
        MOEC_TRY(rt_cuda_resolve_arg(c, cb->b, &gm->bias, &rbias, where, 3));
        MOEC_TRY(gemm_operand(where, "the bias", &rbias, gm->type_bias, gm->m, 1, gm->m, 0, 1));
        g->bias = rbias.val.p;
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        int32_t bias_type = (int32_t)rt_lt_type(gm->type_bias);
        MOEC_TRY(LT(c,
                    c->lt.cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                         &epi, sizeof epi),
                    where));
        MOEC_TRY(LT(c,
                    c->lt.cublasLtMatmulDescSetAttribute(
                        g->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias),
                    where));
        MOEC_TRY(LT(c,
                    c->lt.cublasLtMatmulDescSetAttribute(
                        g->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type),
                    where));
    }
    MOEC_TRY(layout_init(c, &g->la, gm->type_a, ar, ac, gm->lda, gm->batch, gm->stride_a, where));
    MOEC_TRY(layout_init(c, &g->lb, gm->type_b, br, bc, gm->ldb, gm->batch, gm->stride_b, where));
    MOEC_TRY(layout_init(c, &g->lc, gm->type_c, gm->m, gm->n, gm->ldc, gm->batch, gm->stride_c,
                         where));
    uint32_t align[4] = {
        alignment(g->a, gm->stride_a * (int64_t)ir_dtype_size(gm->type_a), gm->batch),
        alignment(g->b, gm->stride_b * (int64_t)ir_dtype_size(gm->type_b), gm->batch),
        alignment(g->c, gm->stride_c * (int64_t)ir_dtype_size(gm->type_c), gm->batch), 0};
    align[3] = align[2];
    cublasLtMatmulPreference_t pref = NULL;
    MOEC_TRY(LT(c, c->lt.cublasLtMatmulPreferenceCreate(&pref), where));
    moec_status st = gemm_algo(c, s, g, pref, align, where);
    c->lt.cublasLtMatmulPreferenceDestroy(pref);
    return st;
}

#endif
