/* cuda_device.c — asks the CUDA runtime how many devices there are, so that
 * every GPU entry point can answer "no CUDA device" cleanly on a machine
 * without one (CI, laptops) instead of failing deep inside a launch. */
#include "err.h"

#ifdef MOEC_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#ifdef MOEC_HAVE_CUDA
/* Why cudaGetDeviceCount failed, as someone at the keyboard needs it: the
 * runtime says "driver version is insufficient" also where there is no
 * driver at all (a machine without a GPU), which cudaDriverGetVersion tells
 * apart by reporting version 0. */
static moec_status no_device(cudaError_t e)
{
    int drv = 0, rt = 0;
    if (e == cudaErrorInsufficientDriver && cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0 &&
        cudaRuntimeGetVersion(&rt) == cudaSuccess)
        return MOEC_ERR(MOEC_ERR_NO_DEVICE,
                        "no CUDA device: the NVIDIA driver supports CUDA %d.%d, older than the "
                        "CUDA runtime moec was built with (%d.%d): update the driver "
                        "(cudaErrorInsufficientDriver)",
                        drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
    if (e == cudaErrorInsufficientDriver)
        return MOEC_ERR(MOEC_ERR_NO_DEVICE,
                        "no CUDA device: no NVIDIA driver or GPU was found (no driver is "
                        "installed: cudaErrorInsufficientDriver)");
    if (e == cudaErrorNoDevice)
        return MOEC_ERR(MOEC_ERR_NO_DEVICE,
                        "no CUDA device: no NVIDIA driver or GPU was found (the driver sees no "
                        "GPU: cudaErrorNoDevice)");
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: %s (%s)", cudaGetErrorString(e),
                    cudaGetErrorName(e));
}
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
        return no_device(e);
    if (n == 0)
        return MOEC_ERR(MOEC_ERR_NO_DEVICE,
                        "no CUDA device: no NVIDIA driver or GPU was found (the driver reports 0 "
                        "GPUs)");
    *count = n;
    return MOEC_OK;
#else
    return MOEC_ERR(MOEC_ERR_NO_DEVICE, "no CUDA device: moec was built without the CUDA toolkit");
#endif
}
