#!/usr/bin/env bash
# test_install.sh — `cmake --install` gives a tree a program can embed: the
# runtime library alone (libmoec_rt, moec_rt.h), found both through
# pkg-config and through find_package(moec), builds samples/embed/generate.c,
# and the program holds no compiler symbol. Run on a plan of the tiny
# qwen3_moe: with a GPU it generates transformers' greedy ids (fp32 plan);
# without one it fails with the runtime's no-device error, exit 1.
set -u
S=${MOEC_SOURCE_DIR:?}
B=${MOEC_BUILD_DIR:?}
D=$S/tests/data
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0 passes=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

P=$T/prefix
if cmake --install "$B" --prefix "$P" >"$T/install.log" 2>&1; then ok; else bad "cmake --install: $(tail -5 "$T/install.log")"; fi
for f in include/moec_rt.h include/moec.h lib/libmoec_rt.a lib/libmoec.a lib/pkgconfig/moec_rt.pc \
         lib/pkgconfig/moec.pc lib/cmake/moec/moecConfig.cmake bin/moec bin/moec-serve; do
  [ -f "$P/$f" ] && ok || bad "not installed: $f"
done

# pkg-config
if PKG_CONFIG_PATH=$P/lib/pkgconfig pkg-config --exists moec_rt; then
  flags=$(PKG_CONFIG_PATH=$P/lib/pkgconfig pkg-config --cflags --libs moec_rt)
  # shellcheck disable=SC2086
  if cc -std=c17 -Wall -Werror -o "$T/gen_pc" "$S/samples/embed/generate.c" $flags 2>"$T/cc.err"; then ok
  else bad "cc with pkg-config moec_rt: $(cat "$T/cc.err")"; fi
else
  bad "pkg-config finds no moec_rt in $P/lib/pkgconfig"
fi

# find_package(moec)
if cmake -S "$S/samples/embed" -B "$T/embed" -DCMAKE_PREFIX_PATH="$P" >"$T/embed.log" 2>&1 &&
   cmake --build "$T/embed" >>"$T/embed.log" 2>&1; then ok
else bad "samples/embed against the installed tree: $(tail -5 "$T/embed.log")"; fi

# No compiler in what the runtime library links.
for g in "$T/gen_pc" "$T/embed/generate"; do
  [ -x "$g" ] || continue
  hit=$(nm "$g" | grep -E ' [TtDdBb] (fe_|pass_|cg_|moec_model_|moec_compile)' | head -3)
  [ -z "$hit" ] && ok || bad "$(basename "$g") links compiler symbols: $hit"
done

# A plan of the tiny qwen3_moe, generated from.
golden() { tr -d ' \n' <"$D/$1/golden.json" | sed -n "s/.*\"$2\":\[\([0-9,]*\)\].*/\1/p"; }
if "$B/moec" compile "$D/qwen3_moe" -o "$T/q3.moec" --dtype fp32 --buckets 1,8 2>"$T/compile.err"; then
  ok
  prompt=$(golden qwen3_moe prompt_ids | tr ',' ' ')
  want=$(golden qwen3_moe greedy_ids | cut -d, -f1-4 | tr ',' ' ')
  for g in "$T/gen_pc" "$T/embed/generate"; do
    [ -x "$g" ] || continue
    # shellcheck disable=SC2086
    out=$("$g" "$T/q3.moec" "$D/qwen3_moe" 4 $prompt 2>&1); rc=$?
    if [ "$rc" = 0 ]; then
      [ "$out" = "$want" ] && ok || bad "$(basename "$g") generated '$out', transformers '$want'"
    else
      case "$out" in
        *"no CUDA"*) [ "$rc" = 1 ] && ok || bad "$(basename "$g") exit $rc: $out" ;;
        *) bad "$(basename "$g") exit $rc: $out" ;;
      esac
    fi
  done
  out=$("$T/embed/generate" "$T/missing.moec" "$D/qwen3_moe" 4 1 2 2>&1); rc=$?
  case "$out" in *"$T/missing.moec"*) [ "$rc" = 1 ] && ok || bad "exit $rc: $out" ;; *) bad "no error naming the missing plan: $out" ;; esac
else
  bad "moec compile: $(cat "$T/compile.err")"
fi

echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
