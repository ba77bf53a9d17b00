/* cuda_check.h — CK(call) for the GPU tests that call the CUDA runtime
 * themselves (gpu_kernels.c, gpu_sample.c): a failure is fatal, since after
 * a fault the context is gone. Include it where MOEC_HAVE_CUDA is defined. */
#ifndef MOEC_TEST_CUDA_CHECK_H
#define MOEC_TEST_CUDA_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#define CK(x) t_cuda_check((x), #x, __FILE__, __LINE__)
static inline void t_cuda_check(cudaError_t e, const char *what, const char *file, int line)
{
    if (e == cudaSuccess)
        return;
    fprintf(stderr, "%s:%d: %s: %s\n", file, line, what, cudaGetErrorString(e));
    exit(1);
}

#endif
