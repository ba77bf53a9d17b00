#!/usr/bin/env bash
# test_tokenizer_valgrind.sh — the tokenizer under valgrind: test_tokenizer
# (every golden, every refused file; shorter long inputs) and `moec
# tokenize` both ways, with no leak and no invalid access. Skips (loudly)
# without valgrind.
set -u
B=${MOEC_BUILD_DIR:?}
D=${MOEC_SOURCE_DIR:?}/tests/data/tokenizers
if ! command -v valgrind >/dev/null; then
  echo "SKIP: valgrind is not installed (run scripts/install_deps.sh)"; exit 0
fi
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0 runs=0
# run IN CMD...: CMD with stdin from IN exits 0 under valgrind, clean.
run() {
  local in=$1; shift
  runs=$((runs + 1))
  valgrind -q --leak-check=full --show-leak-kinds=all --errors-for-leak-kinds=all \
    --error-exitcode=99 "$@" <"$in" >"$T/out" 2>"$T/vg"
  local rc=$?
  if [ "$rc" = 0 ]; then
    echo "clean: $*"
  else
    echo "FAIL: valgrind exit $rc: $*"; tail -40 "$T/vg"; fail=$((fail + 1))
  fi
}
run /dev/null "$B/tests/test_tokenizer" --quick
printf '<|im_start|>user\nHello, wörld! 123 e\xcc\x81\xff<|im_end|>\n' >"$T/text"
run "$T/text" "$B/moec" tokenize "$D/qwen2"
cp "$T/out" "$T/ids"
run "$T/ids" "$B/moec" tokenize "$D/qwen2" --decode
echo "test_tokenizer_valgrind: $((runs - fail)) passed, $fail failed"
[ "$fail" = 0 ]
