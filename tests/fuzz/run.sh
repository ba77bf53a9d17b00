# run.sh — sourced by tests/test_fuzz_*.sh, each of which runs one libFuzzer
# target of tests/fuzz/ (under ASan and UBSan) for a bounded time:
#   fuzz_begin NAME  sets $src, $build, $bin (the target) and $work (a
#                    temporary directory, removed on exit, whose corpus/ the
#                    caller fills with seeds); without the target (it needs
#                    clang with -fsanitize=fuzzer and MOEC_FUZZ=ON) it says
#                    SKIP and exits 0.
#   fuzz_run FLAG... runs $bin on $work/corpus with the libFuzzer flags for
#                    $MOEC_FUZZ_SECONDS seconds (default 8: three targets in
#                    about half a minute of `make test`; more for a longer
#                    campaign) and exits: 0, or 1 on a crash, a sanitizer
#                    report, a leak or a timeout, printing the input that
#                    did it (kept in $build/fuzz-artifacts/).

fuzz_begin() {
    name=$1
    src=${MOEC_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
    build=${MOEC_BUILD_DIR:-$src/build}
    bin=$build/tests/fuzz/$name
    if [ ! -x "$bin" ]; then
        echo "SKIP: $bin was not built (it needs clang with -fsanitize=fuzzer and MOEC_FUZZ=ON);" \
             "$name did NOT run"
        exit 0
    fi
    work=$(mktemp -d "${TMPDIR:-/tmp}/moec-$name-XXXXXX") || exit 1
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/corpus" "$work/artifacts" || exit 1
}

fuzz_run() {
    local seconds=${MOEC_FUZZ_SECONDS:-8} rc f
    "$bin" -max_total_time="$seconds" -runs=3000000 -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$@" \
        "$work/corpus" >"$work/log" 2>&1
    rc=$?
    if [ $rc -ne 0 ] || [ -n "$(ls -A "$work/artifacts")" ]; then
        tail -n 60 "$work/log"
        mkdir -p "$build/fuzz-artifacts"
        for f in "$work"/artifacts/*; do
            [ -e "$f" ] || continue
            cp "$f" "$build/fuzz-artifacts/"
            echo "input $(basename "$f") (kept in $build/fuzz-artifacts):"
            od -A d -c "$f" | head -n 20
        done
        echo "FAIL: $name found a problem (exit $rc); reproduce with $bin <input>"
        exit 1
    fi
    grep -E '^(Done|stat::number_of_executed_units)' "$work/log"
    echo "$name: no crash in $seconds s"
    exit 0
}
