#!/usr/bin/env bash
# test_compile_valgrind.sh — `moec compile` (cubins from a warm cache) and
# `moec run PLAN` up to the device check under valgrind: no leak, no invalid
# access. Skips (loudly) without valgrind.
set -u
B=${MOEC_BUILD_DIR:?}/moec
D=${MOEC_SOURCE_DIR:?}/tests/data
if ! command -v valgrind >/dev/null; then
  echo "SKIP: valgrind is not installed (run scripts/install_deps.sh)"; exit 0
fi
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export MOEC_CACHE_DIR=$T/cubin
unset MOEC_ARCH MOEC_DTYPE
fail=0 n=0
# run RC CMD...: CMD exits RC under valgrind with no error and no leak
# (memory the CUDA libraries keep while loaded is reachable, not lost).
run() {
  local want=$1; shift
  n=$((n + 1))
  valgrind -q --leak-check=full --errors-for-leak-kinds=definite,indirect,possible \
    --error-exitcode=99 "$@" >/dev/null 2>"$T/vg"
  local rc=$?
  if [ "$rc" = "$want" ]; then
    echo "clean: $*"
  else
    echo "FAIL: valgrind exit $rc (want $want): $*"; cat "$T/vg"; fail=$((fail + 1))
  fi
}
if ! "$B" compile "$D/deepseek_v3" -o "$T/v3.moec" --batch-sizes 1 2>"$T/err"; then
  echo "FAIL: compile: $(cat "$T/err")"; exit 1
fi
run 0 "$B" compile "$D/deepseek_v3" -o "$T/vg.moec" --batch-sizes 1
# fp8 weights at 8 tokens: the staged kernels' generation (codegen/fp8_tc.c)
if ! "$B" compile "$D/deepseek_v3_fp8" -o "$T/f8.moec" --batch-sizes 8 2>"$T/err"; then
  echo "FAIL: compile: $(cat "$T/err")"; exit 1
fi
run 0 "$B" compile "$D/deepseek_v3_fp8" -o "$T/vgf8.moec" --batch-sizes 8
if command -v nvidia-smi >/dev/null 2>&1; then
  run 1 "$B" run "$T/v3.moec" --weights "$D/qwen3_moe" --prompt-ids 1 --max-new-tokens 1
else
  run 1 "$B" run "$T/v3.moec" --weights "$D/deepseek_v3" --prompt-ids 1 --max-new-tokens 1
fi
echo "test_compile_valgrind: $((n - fail)) passed, $fail failed"
[ "$fail" = 0 ]
