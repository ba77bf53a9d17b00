# gpu_build.sh — sourced by the GPU machine's scripts: builds moec in
# build-gpu (Release flags of CMAKE_BUILD_TYPE=RelWithDebInfo), using the
# cJSON, PCRE2, utf8proc and libmicrohttpd carried in .dev/ (extracted Debian
# packages: libcjson1 + libcjson-dev, libpcre2-8-0 + libpcre2-dev,
# libutf8proc2 + libutf8proc-dev, libmicrohttpd12 + libmicrohttpd-dev, and
# GnuTLS's libraries for it) where the machine has none, and one NVRTC cache
# for every program that runs.
# Defines gpu_build (returns non-zero on failure).
GPU_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GPU_CMAKE_ARGS=(-S "$GPU_ROOT" -B "$GPU_ROOT/build-gpu" -DMOEC_FUZZ=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo)
# The Debian packages the build needs, where the machine has none: each
# extracted (dpkg -x) under .dev/NAME/ (scripts/gpu_snapshot.sh carries .dev).
GPU_DEV_MISSING=()
gpu_dev() { # gpu_dev NAME HEADER LIB VAR: -D$VAR_INCLUDE_DIR/_LIBRARY from .dev/NAME
  local name=$1 header=$2 lib=$3 var=$4
  [ -f "/usr/include/$header" ] && return 0
  local root=$GPU_ROOT/.dev/$name/usr
  if [ ! -f "$root/include/$header" ]; then
    GPU_DEV_MISSING+=("$name")
    return 0
  fi
  GPU_CMAKE_ARGS+=(-D"${var}_INCLUDE_DIR=$root/include" -D"${var}_LIBRARY=$root/lib/x86_64-linux-gnu/$lib")
  export LD_LIBRARY_PATH=$root/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}
gpu_dev cjson cjson/cJSON.h libcjson.so CJSON
gpu_dev pcre2 pcre2.h libpcre2-8.so PCRE2
gpu_dev utf8proc utf8proc.h libutf8proc.so UTF8PROC
gpu_dev microhttpd microhttpd.h libmicrohttpd.so MHD
# libmicrohttpd needs GnuTLS (libgnutls.so.30): the copy carried in
# .dev/gnutls (with what it needs in turn) only where the machine has none,
# so that its programs keep their own.
if [ -d "$GPU_ROOT/.dev/microhttpd" ] && ! ldconfig -p 2>/dev/null | grep -q 'libgnutls[.]so[.]30 '; then
  if [ -d "$GPU_ROOT/.dev/gnutls" ]; then
    export LD_LIBRARY_PATH=$GPU_ROOT/.dev/gnutls/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
  else
    GPU_DEV_MISSING+=(gnutls)
  fi
fi
export MOEC_CACHE_DIR=${MOEC_CACHE_DIR:-$GPU_ROOT/build-gpu/nvrtc-cache}

gpu_build() {
  if [ ${#GPU_DEV_MISSING[@]} -gt 0 ]; then
    echo "not installed and not carried in .dev/: ${GPU_DEV_MISSING[*]}"
    return 1
  fi
  cmake "${GPU_CMAKE_ARGS[@]}" && cmake --build "$GPU_ROOT/build-gpu" -j"$(nproc)"
}

# gpu_out_build NAME [SUB]: OUT (default /tmp/moec-NAME, exported) and
# $OUT/SUB made, then gpu_build with its log in $OUT/SUB/build.txt (its
# tail shown where it fails, and non-zero then).
gpu_out_build() {
  OUT=${OUT:-/tmp/moec-$1}
  export OUT
  local dir=$OUT${2:+/$2}
  mkdir -p "$dir" || return 1
  gpu_build >"$dir/build.txt" 2>&1 || { tail -30 "$dir/build.txt"; return 1; }
}

# gpu_kern_parts DIR TAG PART...: gpu_kernels once for each PART alone
# (MOEC_KERN_<PART>_ONLY=1; FP8: MOEC_KERN_FP8=1, the fp8 kernels old and
# staged; in the caller's environment otherwise; KERN_S seconds at most,
# default 300), its output in DIR/kernels-PART<TAG>.txt and a line each on
# stdout; non-zero when one failed.
gpu_kern_parts() {
  local dir=$1 tag=$2 part rc=0 var
  shift 2
  for part in "$@"; do
    var="MOEC_KERN_${part}_ONLY=1"
    [ "$part" != FP8 ] || var=MOEC_KERN_FP8=1
    env "$var" timeout "${KERN_S:-300}" "$GPU_ROOT/build-gpu/tests/gpu_kernels" \
      >"$dir/kernels-$part$tag.txt" 2>&1 || rc=1
    echo "gpu_kernels, $part$tag: $(grep -E "passed|failed" "$dir/kernels-$part$tag.txt" | tail -1)"
  done
  return $rc
}

# gpu_sample_model CONFIG LAYERS DIR [fp8]: a model of CONFIG (a config.json)
# with random weights in DIR (moec-sample --fast; fp8: block-scaled fp8),
# cut to its first LAYERS layers where LAYERS > 0 (layer_types and
# mlp_layer_types cut alike). Needs the build (gpu_build).
gpu_sample_model() {
  local cfg=$1 layers=$2 dir=$3 fp8=${4:-}
  mkdir -p "$dir" || return 1
  python3 - "$cfg" "$layers" "$dir/config.json" <<'PY' || return 1
import json, sys
c = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
if n > 0:
    c["num_hidden_layers"] = n
    for k in ("layer_types", "mlp_layer_types"):
        if isinstance(c.get(k), list):
            c[k] = c[k][:n]
json.dump(c, open(sys.argv[3], "w"), indent=1)
PY
  "$GPU_ROOT/build-gpu/moec-sample" "$dir/config.json" "$dir" --fast --force ${fp8:+--fp8}
}

# gpu_logs NAME: OUT (default /tmp/moec-NAME) and a fresh LOGS folder
# .../NAME holding env.txt (the GPU, the date, the commit), packed into
# $OUT/NAME.tar.gz when the script exits.
gpu_logs() {
  OUT=${OUT:-/tmp/moec-$1}
  LOGS=$(mktemp -d)/$1
  mkdir -p "$OUT" "$LOGS" || return 1
  # shellcheck disable=SC2064 # the paths as they are now
  trap "tar czf '$OUT/$1.tar.gz' -C '$(dirname "$LOGS")' '$1'" EXIT
  { nvidia-smi; date -u; cat "$GPU_ROOT/COMMIT" 2>/dev/null || git -C "$GPU_ROOT" log -1 --oneline; } \
    >"$LOGS/env.txt" 2>&1
}

# gpu_ctests DIR TEST...: each GPU test (ctest name) alone, one at a time
# (gpu_graphs checks the device's free memory, which another process on
# the GPU breaks), its output in DIR/ctest_TEST.txt and a line each on
# stdout; non-zero when one failed.
gpu_ctests() {
  local dir=$1 t rc=0
  shift
  for t in "$@"; do
    (cd "$GPU_ROOT/build-gpu" && timeout "${CTEST_S:-300}" ctest -R "^$t\$" --output-on-failure \
      >"$dir/ctest_$t.txt" 2>&1) || rc=1
    echo "$t: $(grep -E "tests passed|tests failed" "$dir/ctest_$t.txt" | tail -1)"
  done
  return $rc
}
