# emu_lib.sh — sourced by the CPU-emulator tests (test_fp8_emu.sh,
# test_attn_emu.sh) after lib.sh: emu_check runs one generator's kernels on
# tests/cuda_emu.h under the address sanitizer (every case) and the thread
# sanitizer (the cases named), counting each step with ok/bad.
#   emu_check NAME TSAN_CASES: tests/NAME_gen writes the cases, tests/NAME.cc
#   is the harness, and its closing line reads "NAME: N of N cases passed".
# Sets S (the source tree), B (the build tree) and CXX, and skips the test
# (exit 0) where there is no C++ compiler.
S=${MOEC_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
B=${MOEC_BUILD_DIR:-$S/build}
CXX=${CXX:-c++}
if ! command -v "$CXX" >/dev/null 2>&1; then
  echo "SKIP: no C++ compiler ($CXX; run scripts/install_deps.sh)"; exit 0
fi

# The emulated kernels run on one CPU (taskset, where there is one). Under
# the address sanitizer that changes nothing: the CUDA threads are fibers
# of one host thread (cuda_emu.h; every case: fp8's 18 s, the attention's
# 4). Under the thread sanitizer a CUDA thread is a host thread, and
# hundreds of them spread over the CPUs spend most of their time in the
# kernel (threads started and ended, barrier wake-ups across CPUs): on 2
# CPUs the attention's cases took 44 s of wall time and 46 of CPU
# unpinned, 31 and 29 pinned; fp8's 18 and 22, 19 and 18. The CPU is the
# one this shell's child runs on, so that two emulator tests side by side
# seldom share one.
EMU_PIN=()
if command -v taskset >/dev/null 2>&1; then
  emu_cpu=$(awk '{ print $39 }' /proc/self/stat 2>/dev/null)
  [[ $emu_cpu =~ ^[0-9]+$ ]] && taskset -c "$emu_cpu" true 2>/dev/null && EMU_PIN=(taskset -c "$emu_cpu")
fi

emu_check() {
  local name=$1 tsan_cases=$2 T san cases rc
  T=$(mktemp -d)
  "$B/tests/${name}_gen" "$T/cases.inc" && ok || bad "${name}_gen failed"
  for san in address thread; do
    cases=
    [ $san = thread ] && cases=$tsan_cases
    # -g1: line tables, all that a sanitizer's report shows (every frame's
    # function, file and line, inlined ones too); without the locals' debug
    # information a compile takes a sixth to nearly a third less time (the
    # address sanitizer's: fp8's 36 s against 25, the attention's 49 and 37)
    if "$CXX" -std=c++17 -O1 -g1 -fsanitize=$san -fno-omit-frame-pointer -pthread -w \
        -DEMU_CASES="\"$T/cases.inc\"" -I"$S/tests" "$S/tests/$name.cc" -o "$T/emu_$san" \
        2>"$T/cxx_$san.txt"; then
      ok
    else
      bad "compiling the emulated kernels ($san): $(head -20 "$T/cxx_$san.txt")"
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
