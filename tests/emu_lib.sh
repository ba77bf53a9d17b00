# emu_lib.sh — sourced by the CPU-emulator tests (test_fp8_emu.sh,
# test_attn_emu.sh) after lib.sh: emu_check runs one generator's kernels on
# tests/cuda_emu.h under the address sanitizer (every case) and the thread
# sanitizer (the cases named, or every one), counting each step with ok/bad.
#   emu_check NAME TSAN_CASES: tests/NAME_gen writes the cases, tests/NAME.cc
#   is the harness, and its closing line reads "NAME: N of N cases passed";
#   TSAN_CASES is a comma-separated list of case numbers, or "all".
# Sets S (the source tree), B (the build tree) and CXX, and skips the test
# (exit 0) where there is no C++ compiler.
S=${MOEC_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
B=${MOEC_BUILD_DIR:-$S/build}
CXX=${CXX:-c++}
if ! command -v "$CXX" >/dev/null 2>&1; then
  echo "SKIP: no C++ compiler ($CXX; run scripts/install_deps.sh)"; exit 0
fi

# The emulated kernels run on one CPU (taskset, where there is one): the
# CUDA threads are fibers of one host thread under both sanitizers
# (cuda_emu.h). Every case under the address sanitizer: fp8's 18 s, the
# attention's 4; under the thread sanitizer, the attention's 50 in 20 s
# and fp8's 85 in 178, hence its list. (A host thread a CUDA thread, as
# the thread sanitizer's runs were until 2026-12-01, took 31 s for 7 of
# the attention's and 19 for 6 of fp8's.) The CPU is the one this shell's
# child runs on, so that two emulator tests side by side seldom share one.
EMU_PIN=()
if command -v taskset >/dev/null 2>&1; then
  emu_cpu=$(awk '{ print $39 }' /proc/self/stat 2>/dev/null)
  [[ $emu_cpu =~ ^[0-9]+$ ]] && taskset -c "$emu_cpu" true 2>/dev/null && EMU_PIN=(taskset -c "$emu_cpu")
fi

# emu_compile SAN OUT SRC [FLAG...]: tests/SRC built against cuda_emu.h
# under the SAN sanitizer into OUT, the compiler's messages in OUT.cxx.txt.
# -g1: line tables, all that a sanitizer's report shows (every frame's
# function, file and line, inlined ones too); without the locals' debug
# information a compile takes a sixth to nearly a third less time (the
# address sanitizer's: fp8's 36 s against 25, the attention's 49 and 37)
emu_compile() {
  local san=$1 out=$2 src=$3
  shift 3
  "$CXX" -std=c++17 -O1 -g1 -fsanitize="$san" -fno-omit-frame-pointer -pthread -w "$@" \
    -I"$S/tests" "$S/tests/$src" -o "$out" 2>"$out.cxx.txt"
}

emu_check() {
  local name=$1 tsan_cases=$2 T san cases rc
  T=$(mktemp -d)
  "$B/tests/${name}_gen" "$T/cases.inc" && ok || bad "${name}_gen failed"
  for san in address thread; do
    cases=
    [ $san = thread ] && [ "$tsan_cases" != all ] && cases=$tsan_cases
    if emu_compile $san "$T/emu_$san" "$name.cc" -DEMU_CASES="\"$T/cases.inc\""; then
      ok
    else
      bad "compiling the emulated kernels ($san): $(head -20 "$T/emu_$san.cxx.txt")"
      continue
    fi
    # shellcheck disable=SC2086 # the case list is one word or none
    ASAN_OPTIONS=detect_leaks=1 TSAN_OPTIONS=halt_on_error=1 "${EMU_PIN[@]}" "$T/emu_$san" $cases \
      >"$T/run_$san.txt" 2>&1
    rc=$?
    grep -E "^(ok|FAIL)|$name:|Sanitizer" "$T/run_$san.txt" | sed "s/^/$san: /"
    [ $rc = 0 ] && grep -qE "^$name: ([0-9]+) of \1 cases passed" "$T/run_$san.txt" && ok ||
      bad "the emulated kernels under the $san sanitizer (exit $rc): $(tail -30 "$T/run_$san.txt")"
  done
  rm -rf "$T"
}

# emu_race_check: tests/emu_race.cc under the thread sanitizer reports a
# race in each mode that leaves a barrier out (0: __syncthreads, 3:
# __syncwarp) and none where the barrier is there (1, 2), so that a clean
# run of the emulated kernels means what it says.
emu_race_check() {
  local T m out
  T=$(mktemp -d)
  if ! emu_compile thread "$T/race" emu_race.cc; then
    bad "compiling emu_race.cc: $(head -20 "$T/race.cxx.txt")"
    rm -rf "$T"
    return
  fi
  for m in 0 1 2 3; do
    out=$(TSAN_OPTIONS=halt_on_error=1 "${EMU_PIN[@]}" "$T/race" $m 2>&1)
    if [ $m = 0 ] || [ $m = 3 ]; then
      grep -q "WARNING: ThreadSanitizer: data race" <<<"$out" && ok ||
        bad "emu_race mode $m: no race reported where a barrier is missing: $out"
    else
      grep -q "emu_race: mode $m ran" <<<"$out" && ! grep -q "ThreadSanitizer" <<<"$out" && ok ||
        bad "emu_race mode $m: a report where the barrier orders the threads: $out"
    fi
  done
  rm -rf "$T"
}
