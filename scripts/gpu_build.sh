# gpu_build.sh — sourced by the GPU machine's scripts: builds moec in
# build-gpu (Release flags of CMAKE_BUILD_TYPE=RelWithDebInfo), using the
# cJSON carried in .dev/cjson/ (an extracted libcjson1 + libcjson-dev) where
# the machine has none, and one NVRTC cache for every program that runs.
# Defines gpu_build (returns non-zero on failure).
GPU_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GPU_CMAKE_ARGS=(-S "$GPU_ROOT" -B "$GPU_ROOT/build-gpu" -DMOEC_FUZZ=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo)
if [ ! -f /usr/include/cjson/cJSON.h ]; then
  GPU_CJ=$GPU_ROOT/.dev/cjson/usr
  GPU_CJLIB=$GPU_CJ/lib/x86_64-linux-gnu
  GPU_CMAKE_ARGS+=(-DCJSON_INCLUDE_DIR="$GPU_CJ/include" -DCJSON_LIBRARY="$GPU_CJLIB/libcjson.so")
  export LD_LIBRARY_PATH=$GPU_CJLIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export MOEC_CACHE_DIR=${MOEC_CACHE_DIR:-$GPU_ROOT/build-gpu/nvrtc-cache}

gpu_build() {
  if [ -n "${GPU_CJ:-}" ] && [ ! -f "$GPU_CJ/include/cjson/cJSON.h" ]; then
    echo "cJSON is not installed and .dev/cjson/ was not carried"
    return 1
  fi
  cmake "${GPU_CMAKE_ARGS[@]}" && cmake --build "$GPU_ROOT/build-gpu" -j"$(nproc)"
}
