# lib.sh — sourced by the shell tests: the pass/fail counters, `expect`,
# and the closing line ctest and CI read.
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

# expect CODE NEEDLE -- CMD...: exit code CODE and NEEDLE in stdout+stderr,
# stdin empty; within EXPECT_TIMEOUT seconds when the test sets it (a
# command still running then exits 124; CMD must then be a program, not a
# shell function).
expect() {
  local code=$1 needle=$2; shift 3
  local out rc
  if [ -n "${EXPECT_TIMEOUT:-}" ]; then
    out=$(timeout "$EXPECT_TIMEOUT" "$@" 2>&1 </dev/null); rc=$?
  else
    out=$("$@" 2>&1 </dev/null); rc=$?
  fi
  if [ "$rc" != "$code" ]; then bad "$* -> exit $rc, want $code: $out"; return; fi
  case "$out" in *"$needle"*) ok ;; *) bad "$* -> output lacks '$needle': $out" ;; esac
}

# finish NAME: "NAME: P passed, F failed", and the test's status.
finish() {
  echo "$1: $pass passed, $fail failed"
  [ "$fail" = 0 ]
}
