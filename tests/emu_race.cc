// emu_race.cc — that the thread sanitizer still sees the CUDA threads of
// tests/cuda_emu.h apart (tests/emu_lib.sh, emu_race_check): one block of
// 64 threads, each writing its word of shared memory and reading another
// warp's (mode 0: with no barrier between, a race; 1: with __syncthreads,
// none), or lane 0 writing a word lane 1 reads (2: after __syncwarp,
// none; 3: with no barrier, a race). The harness runs each mode and
// expects the thread sanitizer's report exactly where a barrier is
// missing.
#include "cuda_emu.h"

int main(int argc, char **argv)
{
    const int mode = argc > 1 ? atoi(argv[1]) : 0;
    float out[64] = {0};
    emu_launch(1, 1, 64, 256, 1, [&] {
        float *s = (float *)emu_smem();
        const int t = threadIdx.x;
        if (mode >= 2) {
            if (t == 0)
                s[0] = 1.0f;
            if (mode == 2)
                __syncwarp();
            if (t == 1)
                out[1] = s[0];
            return;
        }
        s[t] = (float)t;
        if (mode == 1)
            __syncthreads();
        out[t] = s[(t + 32) % 64];
    });
    printf("emu_race: mode %d ran (%g)\n", mode, out[1]);
    return 0;
}
