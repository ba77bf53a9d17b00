#!/usr/bin/env bash
# test_layers.sh — the layers of docs/DESIGN.md, enforced: ir/ (with common/)
# includes nothing above it; runtime/ includes neither graphs/, engine/,
# compiler/ nor codegen/; graphs/ nothing of engine/, compiler/ or codegen/;
# engine/ nothing of compiler/ or codegen/; codegen/ nothing of runtime/,
# graphs/ or engine/; the runtime library (libmoec_rt) and moec-serve
# define and need no symbol of the compiler (every global that compiler/
# and codegen/ define: frontend, passes, codegen, NVRTC). The checker is
# first run on a planted bad include, so that it is seen to fail.
set -u
S=${MOEC_SOURCE_DIR:?}
B=${MOEC_BUILD_DIR:?}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0 passes=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

# forbidden ROOT DIR PATTERN...: the lines of ROOT/DIR's sources that include
# a header under one of the PATTERN folders.
forbidden() {
  local root=$1 dir=$2; shift 2
  local re
  re=$(printf '|%s/' "$@"); re=${re:1}
  grep -nE "^[[:space:]]*#[[:space:]]*include[[:space:]]+\"($re)" "$root/$dir"/*.[ch] 2>/dev/null
}

check_tree() {
  local root=$1 found=""
  found+=$(forbidden "$root" ir compiler codegen runtime graphs engine)
  found+=$(forbidden "$root" common compiler codegen runtime graphs engine ir)
  found+=$(forbidden "$root" runtime compiler codegen graphs engine)
  found+=$(forbidden "$root" graphs compiler codegen engine)
  found+=$(forbidden "$root" engine compiler codegen)
  found+=$(forbidden "$root" codegen runtime graphs engine)
  printf '%s' "$found"
}

# The checker sees a planted runtime -> codegen include.
mkdir -p "$T/tree/runtime"
printf '#include "codegen/cg.h"\n' >"$T/tree/runtime/x.c"
[ -n "$(check_tree "$T/tree")" ] && ok || bad "the include check missed a planted runtime/ -> codegen/ include"

found=$(check_tree "$S")
[ -z "$found" ] && ok || bad "includes that cross a layer:
$found"

# Symbols: every global that compiler/ and codegen/ objects define.
objs=$(find "$B/CMakeFiles/moec_cc_obj.dir" -name '*.o' 2>/dev/null)
if [ -z "$objs" ]; then
  bad "no compiler objects under $B/CMakeFiles/moec_cc_obj.dir"
else
  # shellcheck disable=SC2086
  nm -g --defined-only $objs 2>/dev/null | awk 'NF == 3 {print $3}' | sort -u >"$T/compiler_syms"
  [ "$(wc -l <"$T/compiler_syms")" -gt 50 ] && ok || bad "too few compiler symbols found: $(wc -l <"$T/compiler_syms")"
  grep -qx cg_plan_build "$T/compiler_syms" && grep -qx moec_model_open "$T/compiler_syms" && ok ||
    bad "cg_plan_build or moec_model_open is not among the compiler's symbols"
  # Any symbol of libmoec_rt (defined or needed) or of moec-serve that the compiler defines.
  for f in "$B/libmoec_rt.a" "$B/moec-serve"; do
    if [ ! -f "$f" ]; then bad "$f was not built"; continue; fi
    nm "$f" 2>/dev/null | awk '{print $NF}' | sort -u >"$T/syms"
    hit=$(comm -12 "$T/syms" "$T/compiler_syms" | head -20)
    [ -z "$hit" ] && ok || bad "$(basename "$f") holds compiler symbols: $hit"
    hit=$(grep -i nvrtc "$T/syms" | head -5)
    [ -z "$hit" ] && ok || bad "$(basename "$f") holds NVRTC symbols: $hit"
  done
fi

echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
