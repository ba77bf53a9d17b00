// boundary.cu — what a kernel boundary costs inside a CUDA Graph on this GPU.
//
// A chain of N kernels, each streaming `bytes` of a buffer (16-byte loads,
// summed, one word written a block), is captured in a graph and replayed;
// the same total work as ONE kernel (N times the bytes) is the reference.
// (chain - one) / N is the cost of a boundary: launch, ramp-up, drain and
// the dependency wait. Rows with and without programmatic dependent launch
// (PDL: griddepcontrol.wait then launch_dependents first thing, as moec's
// generated kernels do), for a few grid sizes and sizes per kernel.
//
//   nvcc -O3 -arch=sm_90 -o boundary bench/boundary.cu && ./boundary
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#include "cuda_check.h"

template <bool PDL>
__global__ void __launch_bounds__(256) stream_k(const uint4 *__restrict__ src, long long n16,
                                                float *__restrict__ out)
{
    if (PDL) {
        asm volatile("griddepcontrol.wait;\n" ::: "memory");
        asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    }
    float s = 0.0f;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16;
         i += (long long)gridDim.x * blockDim.x) {
        uint4 v = __ldcs(src + i);
        s += __uint_as_float(v.x) + __uint_as_float(v.y) + __uint_as_float(v.z) +
             __uint_as_float(v.w);
    }
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0 && s == 12345.0f) // never true on zeros: keeps the loads
        out[blockIdx.x] = s;
}

static float replay_ms(cudaGraphExec_t ge, cudaStream_t st, int reps)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++)
        CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < reps; i++)
        CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return ms / reps;
}

template <bool PDL>
static float chain_ms(cudaStream_t st, const uint4 *src, float *out, int n, int grid,
                      long long bytes)
{
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < n; i++) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(256);
        cfg.stream = st;
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = PDL ? 1 : 0;
        // each kernel its own slice, so that L2 does not serve the next one
        const uint4 *p = src + (long long)(i % 16) * (bytes / 16);
        CK(cudaLaunchKernelEx(&cfg, stream_k<PDL>, p, bytes / 16, out));
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    float ms = replay_ms(ge, st, 20);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return ms;
}

int main()
{
    const long long max_bytes = 16ll * (8ll << 20);
    uint4 *src;
    float *out;
    CK(cudaMalloc(&src, max_bytes));
    CK(cudaMemset(src, 0, max_bytes));
    CK(cudaMalloc(&out, 1 << 20));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int n = 200;
    printf("chain of %d kernels in one graph; us a kernel; boundary = (chain - one kernel of all "
           "the work) / n\n",
           n);
    printf("%8s %6s %10s %10s %12s %12s %12s\n", "KB/kern", "grid", "chain", "chain+PDL", "one kernel",
           "boundary", "bound.+PDL");
    const long long sizes[] = {0, 16ll << 10, 1ll << 20, 4ll << 20, 8ll << 20};
    const int grids[] = {1, 132, 264, 528};
    for (long long bytes : sizes)
        for (int grid : grids) {
            float c0 = chain_ms<false>(st, src, out, n, grid, bytes) * 1000.0f / n;
            float c1 = chain_ms<true>(st, src, out, n, grid, bytes) * 1000.0f / n;
            // the same bytes at full bandwidth: one kernel of 1056 blocks over 16
            // slices, per slice
            float one = 0.0f;
            if (bytes > 0) {
                long long all = 16 * bytes;
                one = chain_ms<false>(st, src, out, 1, 1056, all) * 1000.0f / 16;
            }
            printf("%8lld %6d %10.2f %10.2f %12.2f %12.2f %12.2f\n", bytes >> 10, grid, c0, c1, one,
                   c0 - one, c1 - one);
        }
    CK(cudaFree(src));
    CK(cudaFree(out));
    return 0;
}
