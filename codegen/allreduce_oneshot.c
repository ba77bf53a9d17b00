/* allreduce_oneshot.c — the kernel of the one-shot all-reduce
 * (docs/PARALLEL.md, "Small all-reduces"; runtime/cuda_oneshot.c runs it):
 * for the few tokens of a decode step's all-reduce, where NCCL's latency
 * dominates, every rank copies its part into its staging buffer, which
 * every peer can read (peer access, or one device), flags each peer, waits
 * for every peer's flag and sums all the ranks' buffers itself, in fp32 and
 * in rank order, so every rank gets the same bits.
 *
 * Why it is right under CUDA Graph replay: the arguments are fixed, so the
 * epoch a call waits for cannot be one; each block keeps its own counter in
 * device memory (epochs[b]) and bumps it every call, and the ranks' block b
 * counters advance together because every rank makes the same calls. A
 * call's staging half is its epoch's parity: a rank can only overwrite the
 * half a peer may still read once that peer has flagged the next epoch,
 * which it does after it has finished this one.
 *
 * A peer that never arrives (it failed) must not keep the others spinning:
 * once a wait has lasted 20 us, it polls an abort word (host memory, set by
 * rt_comm_abort) and gives up after timeout_ns of the GPU's global timer,
 * recording why in err (1: timed out, 2: aborted), which the runtime
 * reports after the step. (The first form read the abort word every 64
 * spins from the start and fenced at system scope in every thread; this
 * one measured the same: two H200s over NVLink, 2026-11-28, V2-Lite at tp
 * 2, batch 1, 2.409 ms a step, 0.99 ms of it all-reduces, against 2.435
 * and 1.02 before and NCCL's 2.328 and 0.59. So NCCL is the default,
 * runtime/cuda_comm.c.)
 *
 *   allreduce_oneshot_r<R>_<dtype>(const T *x, T *y, unsigned long long n,
 *       T *const *bufs, unsigned *const *flags, unsigned *epochs, int rank,
 *       unsigned long long half, const volatile int *abort_word, int *err,
 *       unsigned long long timeout_ns)
 *   grid ceil(n / IR_ONESHOT_CHUNK), block IR_ONESHOT_THREADS;
 *   bufs[p]: rank p's staging, two halves of `half` elements; flags[p]: rank
 *   p's flags, [block][source rank]; epochs: this rank's, one per block. */
#include <stdio.h>

#include "codegen/cg.h"
#include "err.h"

void cg_oneshot_source(moec_buf *src, int ranks, ir_dtype dt)
{
    char name[96];
    ir_oneshot_kernel_name(name, sizeof name, ranks, dt);
    const char *t = cg_ctype(dt);
    moec_buf_printf(
        src,
        "// one-shot all-reduce over %d ranks (codegen/allreduce_oneshot.c)\n"
        "extern \"C\" __global__ void __launch_bounds__(%d)\n"
        "%s(const %s *__restrict__ x, %s *__restrict__ y, unsigned long long n,\n"
        "    %s *const *bufs, unsigned *const *flags, unsigned *epochs, int rank,\n"
        "    unsigned long long half, const volatile int *abort_word, int *err,\n"
        "    unsigned long long timeout_ns)\n"
        "{\n"
        "    constexpr int R = %d;\n"
        "    constexpr unsigned long long CH = %d, ABORT_AFTER_NS = 20000;\n"
        "    __shared__ unsigned s_epoch;\n"
        "    __shared__ int s_fail;\n"
        "    const unsigned long long lo = (unsigned long long)blockIdx.x * CH;\n"
        "    const unsigned long long hi = lo + CH < n ? lo + CH : n;\n"
        "    if (threadIdx.x == 0) {\n"
        "        s_epoch = epochs[blockIdx.x] + 1u;\n"
        "        epochs[blockIdx.x] = s_epoch;\n"
        "        s_fail = 0;\n"
        "    }\n"
        "    __syncthreads();\n"
        "    const unsigned e = s_epoch;\n"
        "    const unsigned long long base = (e & 1u) * half;\n"
        "    %s *mine = bufs[rank] + base;\n"
        "    for (unsigned long long i = lo + threadIdx.x; i < hi; i += blockDim.x)\n"
        "        mine[i] = x[i];\n"
        "    __syncthreads();\n"
        "    if (threadIdx.x < R) {\n"
        "        /* this block's part of this rank's data is in place (the barrier,\n"
        "           then this thread's system fence, orders every thread's stores\n"
        "           before the flag): tell rank threadIdx.x */\n"
        "        __threadfence_system();\n"
        "        *(volatile unsigned *)(flags[threadIdx.x] + blockIdx.x * R + rank) = e;\n"
        "        const volatile unsigned *f = flags[rank] + blockIdx.x * R + threadIdx.x;\n"
        "        unsigned long long t0, t;\n"
        "        asm volatile(\"mov.u64 %%0, %%%%globaltimer;\" : \"=l\"(t0));\n"
        "        for (unsigned spins = 1; (int)(*f - e) < 0; spins++) {\n"
        "            if (spins %% 64)\n"
        "                continue;\n"
        "            asm volatile(\"mov.u64 %%0, %%%%globaltimer;\" : \"=l\"(t));\n"
        "            /* the abort word lives in host memory, a bus read away: only\n"
        "               once the wait has lasted (ABORT_AFTER_NS) */\n"
        "            if (t - t0 < ABORT_AFTER_NS)\n"
        "                continue;\n"
        "            int why = *abort_word ? 2 : t - t0 > timeout_ns ? 1 : 0;\n"
        "            if (why) {\n"
        "                atomicCAS(err, 0, why);\n"
        "                s_fail = 1;\n"
        "                break;\n"
        "            }\n"
        "        }\n"
        "        __threadfence_system();\n"
        "    }\n"
        "    __syncthreads();\n"
        "    if (s_fail)\n"
        "        return;\n"
        "    for (unsigned long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {\n"
        "        float acc = 0.0f;\n"
        "#pragma unroll\n"
        "        for (int p = 0; p < R; p++) {\n"
        "            const %s v = __ldcv(bufs[p] + base + i);\n"
        "            acc += ld(&v);\n"
        "        }\n"
        "        st(y + i, acc);\n"
        "    }\n"
        "}\n\n",
        ranks, IR_ONESHOT_THREADS, name, t, t, t, ranks, IR_ONESHOT_CHUNK, t, t);
}

moec_status cg_emit_oneshot(cg_ctx *c, int ranks, ir_dtype dt)
{
    if (dt != IR_DTYPE_F32 && dt != IR_DTYPE_BF16 && dt != IR_DTYPE_F16)
        return MOEC_OK; /* NCCL alone */
    char name[96];
    ir_oneshot_kernel_name(name, sizeof name, ranks, dt);
    int is_new;
    if (cg_kernel(c, name, &is_new) < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "the one-shot all-reduce's kernel: out of memory");
    if (is_new)
        cg_oneshot_source(&c->src, ranks, dt);
    return MOEC_OK;
}
