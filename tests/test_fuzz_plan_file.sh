#!/usr/bin/env bash
# test_fuzz_plan_file.sh — runs the libFuzzer target fuzz_plan_file
# (ir_plan_read, the plan file reader, under ASan and UBSan) for a bounded
# time (tests/fuzz/run.sh). The seed is a plan `moec compile` writes now
# (DeepSeek-V2's tiny model, buckets 1 and 8: kernel and GEMM steps, two
# streams), cut down by plan_seed (16-byte cubins) and without its
# checksum, which fuzz_plan_file appends; without NVRTC only a bare
# hand-made header seeds it (said loudly). The dictionary is every quoted
# string in the seed, the IR's keywords and numbers no field can hold.
# Fails if the fuzzer reports a crash, a sanitizer error, a leak or a
# timeout; the input that did it is kept in $MOEC_BUILD_DIR/fuzz-artifacts/.
# Without clang the target is not built and the test says SKIP.
set -u
. "$(dirname "$0")/fuzz/run.sh"
fuzz_begin fuzz_plan_file
moec=$build/moec
if "$moec" compile "$src/tests/data/deepseek_v2" -o "$work/v2.moec" --batch-sizes 1,8 \
        >"$work/compile.log" 2>&1 &&
    "$build/tests/fuzz/plan_seed" "$work/v2.moec" "$work/seed.moec"; then
    head -c -8 "$work/seed.moec" >"$work/corpus/deepseek_v2" || exit 1
    rm -f "$work/v2.moec"
else
    echo "NOTE: no compiled seed plan (moec compile or plan_seed failed:" \
         "$(tail -n 2 "$work/compile.log")); fuzzing from a bare header only"
    hdr='{"arch":"sm_90","compute_dtype":"bf16","config_hash":"0","weights_hash":"0","moec":"0"}'
    { printf 'MOECPLAN\001\000\000\000\000\000\000\000'
      printf "$(printf '\\x%02x' ${#hdr})\\000\\000\\000\\000\\000\\000\\000"
      printf '%s' "$hdr"; } >"$work/corpus/bare"
fi

{
    grep -ao '"[A-Za-z0-9_.{}]*"' "$work"/corpus/* | sed 's/^[^:]*://' | sort -u
    printf '"%s"\n' module meta input weight output stream T % \
        1e300 -1e300 4294967296 -2147483649 9007199254740993 0.5 -0
} >"$work/dict"

fuzz_run -max_len=65536 -dict="$work/dict"
