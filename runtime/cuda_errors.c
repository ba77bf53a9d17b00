/* cuda_errors.c — CUDA and cuBLASLt failures reported with the call, the
 * error's name and text, and what was being done (the step, its op and
 * kernel). */
#ifdef MOEC_HAVE_CUDA

#include <ctype.h>

#include "runtime/cuda_internal.h"

/* The function name in a call's source text ("c->lt.cublasLtMatmul(...)"). */
static const char *call_name(const char *expr, int *len)
{
    const char *paren = strchr(expr, '(');
    const char *end = paren ? paren : expr + strlen(expr);
    const char *start = end;
    while (start > expr && (isalnum((unsigned char)start[-1]) || start[-1] == '_'))
        start--;
    *len = (int)(end - start);
    return start;
}

moec_status rt_cuda_fail(moec_status st, const char *file, int line, const char *where,
                                const char *expr, const char *name, const char *text)
{
    int len;
    const char *fn = call_name(expr, &len);
    return moec_err_set(st, file, line, "%s%s%.*s: %s: %s", where ? where : "", where ? ": " : "",
                        len, fn, name, text);
}

moec_status rt_cuda_check(cudaError_t e, const char *expr, const char *where, const char *file,
                              int line)
{
    if (e == cudaSuccess)
        return MOEC_OK;
    return rt_cuda_fail(e == cudaErrorMemoryAllocation ? MOEC_ERR_OOM : MOEC_ERR_CUDA, file, line,
                        where, expr, cudaGetErrorName(e), cudaGetErrorString(e));
}

moec_status rt_lt_check(const rt_cuda *c, cublasStatus_t s, const char *expr, const char *where,
                            const char *file, int line)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return MOEC_OK;
    return rt_cuda_fail(s == CUBLAS_STATUS_ALLOC_FAILED ? MOEC_ERR_OOM : MOEC_ERR_CUDA, file, line,
                        where, expr, c->lt.cublasLtGetStatusName(s),
                        c->lt.cublasLtGetStatusString(s));
}

/* "bucket T=8, step 17 (op moe_routed %l3.moe.routed, kernel moe_down_...)" */
const char *rt_cuda_step_where(const rt_cuda *c, const rt_cuda_bucket *cb, int i, char *buf,
                              size_t cap)
{
    const ir_step *s = &cb->b->steps[i];
    const ir_module *m = c->plan->module;
    const ir_op *op = s->op_id >= 0 && s->op_id < m->n_ops ? m->ops[s->op_id] : NULL;
    const char *kind = op ? ir_op_name(op->kind) : "?";
    const char *name = op && op->n_out > 0 ? op->out[0]->name : "?";
    int n = snprintf(buf, cap, "bucket T=%d, step %d (op %s %%%s, ", cb->b->T, i, kind, name);
    if (n < 0 || (size_t)n >= cap)
        return buf;
    switch (s->kind) {
    case IR_STEP_KERNEL:
        snprintf(buf + n, cap - (size_t)n, "kernel %s)",
                 s->kernel >= 0 && s->kernel < cb->b->n_kernels ? cb->b->kernel_names[s->kernel]
                                                                : "(bad index)");
        break;
    case IR_STEP_GEMM:
        snprintf(buf + n, cap - (size_t)n, "cuBLASLt gemm m=%d n=%d k=%d batch=%d)", s->gemm.m,
                 s->gemm.n, s->gemm.k, s->gemm.batch);
        break;
    case IR_STEP_FORK: snprintf(buf + n, cap - (size_t)n, "fork)"); break;
    case IR_STEP_JOIN: snprintf(buf + n, cap - (size_t)n, "join)"); break;
    default: snprintf(buf + n, cap - (size_t)n, "step kind %d)", (int)s->kind); break;
    }
    return buf;
}

#endif
