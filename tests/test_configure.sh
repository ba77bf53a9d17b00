#!/usr/bin/env bash
# test_configure.sh — cmake's configure step as a user reads it: the CUDA
# toolkit line names a version and the header and library folders it found
# (each an existing folder, never empty), or says the toolkit is missing.
set -u
S=${MOEC_SOURCE_DIR:?}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# shellcheck source=tests/lib.sh
source "$S/tests/lib.sh"

out=$(cmake -S "$S" -B "$T/build" 2>&1) && ok || bad "configure failed: $out"
line=$(grep -- "-- CUDA toolkit" <<<"$out")
re='^-- CUDA toolkit [0-9][0-9.]*: headers (/[^ ,]+), libraries (/[^ ,]+)$'
if [[ $line =~ $re ]]; then
  ok
  for d in "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"; do
    [ -d "$d" ] && ok || bad "the CUDA toolkit line names $d, not a folder: $line"
  done
elif [ "$line" = "-- CUDA toolkit not found: building the CPU paths only" ]; then
  ok
else
  bad "the CUDA toolkit line is '$line'"
fi

finish test_configure
