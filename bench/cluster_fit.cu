// cluster_fit.cu — how many thread block clusters of each size the GPU at
// hand holds at once, for kernels that fit 1 to 4 blocks of 128 threads on
// an SM (set by their dynamic shared memory), as cudaOccupancyMaxActiveClusters
// answers. The staged fp8 linear (codegen/fp8_tc.c) splits K over a cluster
// of S blocks; a grid of more clusters than fit runs a second wave.
// Prints per blocks-per-SM and cluster size: the clusters that fit, the
// blocks they hold, and that as a share of the SMs' block slots.
//
//   nvcc -O3 -arch=sm_90 -o cluster_fit bench/cluster_fit.cu && ./cluster_fit
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#include "cuda_check.h"

__global__ void __launch_bounds__(128) probe(float *out)
{
    extern __shared__ float sm[];
    sm[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    if (out)
        out[blockIdx.x] = sm[(threadIdx.x + 1) & 127];
}

int main()
{
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    CK(cudaFuncSetAttribute(probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)p.sharedMemPerBlockOptin));
    printf("%s: %d SMs, %zu bytes of shared memory a block at most\n", p.name,
           p.multiProcessorCount, (size_t)p.sharedMemPerBlockOptin);
    printf("blocks/SM  cluster  clusters  blocks  of slots\n");
    for (int per = 1; per <= 4; per++) {
        size_t smem = p.sharedMemPerMultiprocessor / per - 2048;
        if (smem > p.sharedMemPerBlockOptin)
            smem = p.sharedMemPerBlockOptin;
        for (int s = 1; s <= 8; s++) {
            cudaLaunchConfig_t cfg = {};
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeClusterDimension;
            at[0].val.clusterDim.x = s;
            at[0].val.clusterDim.y = 1;
            at[0].val.clusterDim.z = 1;
            cfg.gridDim = dim3(s * 64, 1, 1);
            cfg.blockDim = dim3(128, 1, 1);
            cfg.dynamicSmemBytes = smem;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            int n = 0;
            CK(cudaOccupancyMaxActiveClusters(&n, probe, &cfg));
            printf("%9d  %7d  %8d  %6d  %7.1f%%\n", per, s, n, n * s,
                   100.0 * n * s / (per * p.multiProcessorCount));
        }
    }
    return 0;
}
