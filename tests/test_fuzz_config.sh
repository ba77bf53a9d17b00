#!/usr/bin/env bash
# test_fuzz_config.sh — runs the libFuzzer target fuzz_config (fe_config_build,
# the frontend's config.json reader, under ASan and UBSan) for a bounded time
# (tests/fuzz/run.sh) on a seed corpus: every config in tests/data (the real
# models' and the tiny ones'), with a dictionary of every string they hold
# (the field names and values the frontend looks for) and a few edge values.
# Fails if the fuzzer reports a crash, a sanitizer error, a leak or a
# timeout; the input that did it is kept in $MOEC_BUILD_DIR/fuzz-artifacts/.
# Without clang the target is not built and the test says SKIP.
set -u
. "$(dirname "$0")/fuzz/run.sh"
fuzz_begin fuzz_config
n=0
for f in "$src"/tests/data/configs/*.json "$src"/tests/data/*/config.json; do
    cp "$f" "$work/corpus/seed$n.json" || exit 1
    n=$((n + 1))
done
[ "$n" -ge 10 ] || { echo "FAIL: only $n seed configs in $src/tests/data"; exit 1; }

{
    cat "$work"/corpus/*.json | grep -o '"[A-Za-z0-9_.]*"' | sort -u
    printf '%s\n' '"null"' '"true"' '"false"' '"[]"' '"{}"' '"0"' '"-1"' '"1e308"' \
        '"4294967296"' '"9223372036854775808"' '"0.5"' '"-0"' '"\\u0000"'
} >"$work/dict"

fuzz_run -max_len=8192 -dict="$work/dict"
