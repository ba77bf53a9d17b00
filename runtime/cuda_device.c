/* cuda_device.c — asks the CUDA runtime how many devices there are, so that
 * every GPU entry point can answer "no CUDA device" cleanly on a machine
 * without one (CI, laptops) instead of failing deep inside a launch. */
#include "err.h"

#ifdef MOEC_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

moec_status moec_cuda_device_count(int *count)
{
    if (!count)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_cuda_device_count: count is NULL");
    *count = 0;
#ifdef MOEC_HAVE_CUDA
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: %s (%s)", cudaGetErrorString(e),
                        cudaGetErrorName(e));
    if (n == 0)
        return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: the driver reports 0 devices");
    *count = n;
    return MOEC_OK;
#else
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
#endif
}
