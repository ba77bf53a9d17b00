/* fuzz_safetensors.c — libFuzzer target: every input is a candidate
 * safetensors image, validated by the same code that opens checkpoints. The
 * only acceptable outcomes are MOEC_OK or an error status; a crash, a
 * sanitizer report or a leak is a bug. */
#include <stddef.h>
#include <stdint.h>

#include "runtime/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    moec_status st = rt_safetensors_check_buffer(data, size, "fuzz.safetensors");
    if (st != MOEC_OK && st != MOEC_ERR_FORMAT && st != MOEC_ERR_OOM)
        __builtin_trap(); /* a bad buffer is a format error, nothing else */
    return 0;
}
