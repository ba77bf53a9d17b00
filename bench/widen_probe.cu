// widen_probe.cu — how fast an SM widens e4m3 codes, each form alone: the
// integer and bf16x2 operations the staged fp8 kernels use
// (moec_e4m3x4_bf16: exact bf16 pairs), the conversion unit
// (cvt.rn.f16x2.e4m3x2: f16 pairs), and integer operations to f16 pairs
// without the exponent's bias (the value times 2^-8; the bias left to a
// power of two elsewhere). Every thread widens a chain of words and folds
// the pairs into a sink, so that nothing is optimized away; the sink's fold
// is one operation a pair in every form. Prints codes a second over the
// GPU, beside the rate the HBM brings them (codes = bytes).
//   nvcc -O3 -arch=sm_90 -o widen_probe bench/widen_probe.cu && ./widen_probe
#include <cstdio>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define CK(x)                                                                         \
    do {                                                                              \
        cudaError_t e_ = (x);                                                         \
        if (e_ != cudaSuccess) {                                                      \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

__device__ __forceinline__ unsigned bf16x2_exp120(unsigned v)
{
    unsigned r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(v), "r"(0x7b807b80u), "r"(0x80008000u));
    return r;
}

// form 0: as moec_e4m3x4_bf16
__device__ __forceinline__ void widen_bf16(unsigned w, unsigned &lo, unsigned &hi)
{
    const unsigned a = __byte_perm(w, 0u, 0x1404), b = __byte_perm(w, 0u, 0x3424);
    lo = bf16x2_exp120((a & 0x80008000u) | ((a >> 4) & 0x07f007f0u));
    hi = bf16x2_exp120((b & 0x80008000u) | ((b >> 4) & 0x07f007f0u));
}

// form 1: the conversion unit, codes 0,1 and 2,3
__device__ __forceinline__ void widen_cvt(unsigned w, unsigned &lo, unsigned &hi)
{
    unsigned short a = (unsigned short)(w & 0xffffu), b = (unsigned short)(w >> 16);
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(lo) : "h"(a));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(hi) : "h"(b));
}

// form 2: integer operations to f16 pairs of codes 1,3 and 0,2 (value
// times 2^-8)
__device__ __forceinline__ void widen_f16i(unsigned w, unsigned &lo, unsigned &hi)
{
    lo = (w & 0x80008000u) | ((w & 0x7f007f00u) >> 1);
    const unsigned v = w << 8;
    hi = (v & 0x80008000u) | ((v & 0x7f007f00u) >> 1);
}

// form 3: a byte permute with sign replication, an arithmetic shift and a
// mask: pairs of codes 1,3 and 0,2 (value times 2^-8)
__device__ __forceinline__ void widen_f16p(unsigned w, unsigned &lo, unsigned &hi)
{
    // bytes (3 .. 0): code 3, sign of code 1 replicated, code 1, 0
    unsigned a, b;
    asm("prmt.b32 %0, %1, 0, 0x3914;" : "=r"(a) : "r"(w));
    asm("prmt.b32 %0, %1, 0, 0x2804;" : "=r"(b) : "r"(w));
    lo = (unsigned)((int)a >> 1) & 0xbf80bf80u;
    hi = (unsigned)((int)b >> 1) & 0xbf80bf80u;
}

template <int F>
__global__ void probe(const unsigned *in, unsigned *out, int iters)
{
    unsigned w[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        w[i] = in[(threadIdx.x + i * 37) & 1023];
    unsigned s0 = 0, s1 = 0;
    for (int it = 0; it < iters; it++) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            unsigned lo, hi;
            if (F == 0)
                widen_bf16(w[i], lo, hi);
            else if (F == 1)
                widen_cvt(w[i], lo, hi);
            else if (F == 2)
                widen_f16i(w[i], lo, hi);
            else
                widen_f16p(w[i], lo, hi);
            s0 ^= lo;
            s1 ^= hi;
            w[i] += 0x01010101u; // the next word: one add, every form
        }
    }
    if ((s0 ^ s1) == 0x12345678u)
        out[threadIdx.x] = s0;
}

// every code of 0..255 widened by forms 2 and 3 agree with the conversion
// unit's f16 times 2^-8 (NaN codes 0x7f, 0xff aside)
__global__ void check(int *bad)
{
    const unsigned c = threadIdx.x;
    const unsigned w = c << 8; // code in byte 1
    unsigned lo, hi, l3, h3, cl, ch;
    widen_f16i(w, lo, hi);
    widen_f16p(w, l3, h3);
    widen_cvt(c, cl, ch);
    const float ref = __half2float(__ushort_as_half((unsigned short)(cl & 0xffffu)));
    const float a = __half2float(__ushort_as_half((unsigned short)(lo & 0xffffu))) * 256.0f;
    const float b = __half2float(__ushort_as_half((unsigned short)(l3 & 0xffffu))) * 256.0f;
    if ((c & 0x7f) != 0x7f && (a != ref || b != ref))
        atomicAdd(bad, 1);
}

int main()
{
    int dev = 0, sms = 0, clk = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev));
    unsigned *in, *out;
    int *bad;
    CK(cudaMalloc(&in, 4096));
    CK(cudaMalloc(&out, 4096));
    CK(cudaMalloc(&bad, 4));
    CK(cudaMemset(in, 0x5a, 4096));
    CK(cudaMemset(bad, 0, 4));
    check<<<1, 256>>>(bad);
    int hbad = -1;
    CK(cudaMemcpy(&hbad, bad, 4, cudaMemcpyDeviceToHost));
    printf("integer f16 forms against the conversion unit: %d of 254 codes differ\n", hbad);
    const char *names[4] = {"bf16 integer (moec_e4m3x4_bf16)", "conversion unit to f16",
                            "integer to f16 (masks)", "integer to f16 (permute, sar)"};
    const int iters = 4096, blocks = sms * 8, threads = 256;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    void (*const kernels[4])(const unsigned *, unsigned *, int) = {probe<0>, probe<1>, probe<2>,
                                                                   probe<3>};
    for (int f = 0; f < 4; f++) {
        for (int rep = 0; rep < 2; rep++) {
            CK(cudaEventRecord(e0));
            kernels[f]<<<blocks, threads>>>(in, out, iters);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            double codes = (double)blocks * threads * iters * 8 * 4;
            if (rep)
                printf("%-34s %8.3f ms  %7.2f T codes/s  %6.1f codes/clk/SM\n", names[f], ms,
                       codes / ms / 1e9, codes / (ms * 1e-3) / (clk * 1e3) / sms);
        }
    }
    printf("(HBM at 4.2 TB/s brings 4.2 T codes/s; %d SMs at %d MHz)\n", sms, clk / 1000);
    return 0;
}
