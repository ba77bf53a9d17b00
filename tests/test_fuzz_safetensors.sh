#!/usr/bin/env bash
# test_fuzz_safetensors.sh — runs the libFuzzer target fuzz_safetensors
# (rt_safetensors_check_buffer under ASan and UBSan) for a bounded time
# (tests/fuzz/run.sh) on a seed corpus: the files in tests/fuzz/corpus
# (written by rt_safetensors_write) plus a few hand-made headers written
# here. Fails if the fuzzer reports a crash, a sanitizer error, a leak or a
# timeout; the input that did it is kept in $MOEC_BUILD_DIR/fuzz-artifacts/.
# Without clang the target is not built and the test says SKIP.
set -u
. "$(dirname "$0")/fuzz/run.sh"
fuzz_begin fuzz_safetensors
cp "$src"/tests/fuzz/corpus/* "$work/corpus/" || exit 1

# The 8-byte little-endian length as printf escapes.
le64() {
    local n=$1 i
    for i in 0 1 2 3 4 5 6 7; do printf '\\x%02x' $(((n >> (8 * i)) & 255)); done
}
# seed NAME HEADER DATA: a safetensors image with that header and data.
seed() {
    { printf "$(le64 ${#2})"; printf '%s' "$2"; printf '%s' "$3"; } >"$work/corpus/$1"
}
seed meta '{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' 'abcdefgh'
seed two '{"a":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]},"b":{"dtype":"I64","shape":[],"data_offsets":[4,12]}}' '0123456789ab'
seed overlap '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}' '012345'
seed rank8 '{"r":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1],"data_offsets":[0,1]}}' 'z'
seed bigdims '{"b":{"dtype":"F64","shape":[4294967296,65536,0],"data_offsets":[0,0]}}' ''
seed f8 '{"x":{"dtype":"F8_E4M3","shape":[3,1],"data_offsets":[1,4]}}    ' 'wxyz'
# an fp8 weight and its block scales, the scale grid partial ([3, 5] in 2 x 2 blocks)
seed f8_scaled '{"w":{"dtype":"F8_E4M3","shape":[3,5],"data_offsets":[0,15]},"w_scale_inv":{"dtype":"F32","shape":[2,3],"data_offsets":[16,40]}}' '0123456789abcdefghijklmnopqrstuvwxyz0123'

cat >"$work/dict" <<'EOF'
"dtype"
"shape"
"data_offsets"
"__metadata__"
"F32"
"F16"
"BF16"
"F64"
"I64"
"I32"
"I16"
"I8"
"U8"
"U16"
"U32"
"U64"
"BOOL"
"F8_E4M3"
"F8_E5M2"
"_scale_inv"
"18446744073709551615"
"4294967296"
"9007199254740993"
"1e300"
"-0"
"\\u0000"
EOF

fuzz_run -max_len=4096 -dict="$work/dict"
