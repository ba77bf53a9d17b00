// phase_sync.cu — what one dependent phase costs inside a CUDA graph, three
// ways: the latency a persistent kernel for a batch-1 layer's attention
// section (issue 15) would trade the kernel boundaries for.
//
// A phase: every block reads the whole vector the phase before wrote (N
// floats: a layer's hidden row, as each GEMV block reads x), sums it, and
// writes its own slice of the next vector from that sum, so each phase
// depends on every block of the one before, as a layer's kernels do.
//   chain:   a kernel a phase (griddepcontrol.wait, then launch_dependents,
//            as moec's generated kernels do), `grid` blocks of 256;
//   grid:    one cooperative kernel of `grid` blocks (all resident), the
//            phases apart by a grid-wide barrier (an arrival counter, then
//            each block spins on it with acquire loads);
//   cluster: one cluster of C blocks (the vector's slices in their shared
//            memory, each phase's reads by distributed shared memory),
//            the phases apart by the cluster's barrier;
//   block:   one block alone, the phases apart by __syncthreads (the
//            phases' own work, without any exchange between SMs).
// Each row: us a phase, the graph of `n` phases replayed, less the same
// graph of one phase, over n - 1.
//
//   nvcc -O3 -arch=sm_90 -o phase_sync bench/phase_sync.cu && ./phase_sync
#include <cooperative_groups.h>
#include <cstdio>
#include <cuda_runtime.h>

#include "cuda_check.h"

namespace cg = cooperative_groups;

constexpr int NT = 256;

// the sum of v[0 .. n) by the block (every thread gets it)
__device__ float block_sum_of(const float *v, int n)
{
    __shared__ float part[NT / 32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += NT)
        s += __ldcg(v + i);
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = s;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < NT / 32; w++)
        t += part[w];
    __syncthreads();
    return t;
}

// block b's slice of the next vector from the sum of the one before
__device__ void write_slice(float *next, int n, float sum, int b, int nb)
{
    const int per = (n + nb - 1) / nb;
    for (int i = b * per + threadIdx.x; i < (b + 1) * per && i < n; i += NT)
        next[i] = sum * 1e-3f + (float)i;
}

__global__ void __launch_bounds__(NT) chain_k(const float *prev, float *next, int n)
{
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    write_slice(next, n, block_sum_of(prev, n), blockIdx.x, gridDim.x);
}

__global__ void __launch_bounds__(NT) grid_k(float *a, float *b, int n, int phases,
                                             unsigned *count)
{
    for (int p = 0; p < phases; p++) {
        const float *prev = p % 2 ? b : a;
        float *next = p % 2 ? a : b;
        write_slice(next, n, block_sum_of(prev, n), blockIdx.x, gridDim.x);
        // the grid's barrier: every block's writes, then its arrival
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(count, 1u);
            const unsigned target = gridDim.x * (unsigned)(p + 1);
            unsigned seen;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(count)
                             : "memory");
            } while (seen < target);
        }
        __syncthreads();
    }
}

__global__ void __launch_bounds__(NT) cluster_k(float *out, int n, int phases)
{
    extern __shared__ float slice[]; // this block's slice of the vector
    cg::cluster_group cl = cg::this_cluster();
    const int nb = (int)cl.num_blocks(), b = (int)cl.block_rank(), per = (n + nb - 1) / nb;
    for (int i = threadIdx.x; i < per; i += NT)
        slice[i] = (float)(b * per + i);
    cl.sync();
    __shared__ float part[NT / 32];
    for (int p = 0; p < phases; p++) {
        // the whole vector from the cluster's blocks
        float s = 0.0f;
        for (int i = threadIdx.x; i < nb * per; i += NT)
            s += *cl.map_shared_rank(slice + i % per, i / per);
        for (int o = 16; o > 0; o >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, o);
        if ((threadIdx.x & 31) == 0)
            part[threadIdx.x >> 5] = s;
        __syncthreads();
        float t = 0.0f;
        for (int w = 0; w < NT / 32; w++)
            t += part[w];
        cl.sync(); // every block has read every slice
        for (int i = threadIdx.x; i < per; i += NT)
            slice[i] = t * 1e-3f + (float)(b * per + i);
        cl.sync(); // every slice written
    }
    for (int i = threadIdx.x; i < per && b * per + i < n; i += NT)
        out[b * per + i] = slice[i];
}

__global__ void __launch_bounds__(NT) block_k(float *a, float *b, int n, int phases)
{
    for (int p = 0; p < phases; p++) {
        const float *prev = p % 2 ? b : a;
        float *next = p % 2 ? a : b;
        write_slice(next, n, block_sum_of(prev, n), 0, 1);
        __syncthreads();
    }
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

enum { CHAIN, GRID, CLUSTER, BLOCK };

struct bufs {
    float *a, *b;
    unsigned *count;
    int n;
};

// ms of one replay of a graph of `phases` phases of form `how` over `grid`
// blocks (the cluster's size for CLUSTER)
static float graph_ms(cudaStream_t st, const bufs &m, int how, int grid, int phases)
{
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.blockDim = dim3(NT);
    cfg.stream = st;
    cfg.attrs = at;
    if (how == CHAIN) {
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.gridDim = dim3(grid);
        cfg.numAttrs = 1;
        for (int p = 0; p < phases; p++)
            CK(cudaLaunchKernelEx(&cfg, chain_k, (const float *)(p % 2 ? m.b : m.a),
                                  p % 2 ? m.a : m.b, m.n));
    } else if (how == GRID) {
        CK(cudaMemsetAsync(m.count, 0, sizeof(unsigned), st));
        at[0].id = cudaLaunchAttributeCooperative;
        at[0].val.cooperative = 1;
        cfg.gridDim = dim3(grid);
        cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, grid_k, m.a, m.b, m.n, phases, m.count));
    } else if (how == CLUSTER) {
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = (unsigned)grid;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3(grid);
        cfg.numAttrs = 1;
        cfg.dynamicSmemBytes = (size_t)((m.n + grid - 1) / grid) * sizeof(float);
        CK(cudaLaunchKernelEx(&cfg, cluster_k, m.a, m.n, phases));
    } else {
        cfg.gridDim = dim3(1);
        cfg.numAttrs = 0;
        CK(cudaLaunchKernelEx(&cfg, block_k, m.a, m.b, m.n, phases));
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    float ms = replay_ms(ge, st, 50);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return ms;
}

// us a phase: (n phases - 1 phase) / (n - 1)
static float per_phase_us(cudaStream_t st, const bufs &m, int how, int grid, int n)
{
    float many = graph_ms(st, m, how, grid, n), one = graph_ms(st, m, how, grid, 1);
    return (many - one) * 1000.0f / (float)(n - 1);
}

int main()
{
    int dev, sms;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaFuncSetAttribute(cluster_k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    bufs m = {};
    const int max_n = 1 << 16;
    CK(cudaMalloc(&m.a, max_n * sizeof(float)));
    CK(cudaMalloc(&m.b, max_n * sizeof(float)));
    CK(cudaMalloc(&m.count, sizeof(unsigned)));
    CK(cudaMemset(m.a, 0, max_n * sizeof(float)));
    CK(cudaMemset(m.b, 0, max_n * sizeof(float)));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int phases = 64;
    printf("us a dependent phase (%d phases in one graph, less one phase), %d SMs\n", phases,
           sms);
    printf("%8s %14s %14s %14s %14s %14s %14s\n", "floats", "chain+PDL 132", "chain+PDL 264",
           "grid barrier", "cluster 8", "cluster 16", "one block");
    const int sizes[] = {512, 2048, 7168};
    for (int n : sizes) {
        m.n = n;
        float c132 = per_phase_us(st, m, CHAIN, sms, phases);
        float c264 = per_phase_us(st, m, CHAIN, 2 * sms, phases);
        float gb = per_phase_us(st, m, GRID, sms, phases);
        float cl8 = per_phase_us(st, m, CLUSTER, 8, phases);
        float cl16 = per_phase_us(st, m, CLUSTER, 16, phases);
        float blk = per_phase_us(st, m, BLOCK, 1, phases);
        printf("%8d %14.2f %14.2f %14.2f %14.2f %14.2f %14.2f\n", n, c132, c264, gb, cl8, cl16,
               blk);
    }
    CK(cudaFree(m.a));
    CK(cudaFree(m.b));
    CK(cudaFree(m.count));
    return 0;
}
