#!/usr/bin/env bash
# Installs what moec needs to build and test from Debian's packages, or says
# exactly what to run when it cannot (not root, no apt-get). The CUDA toolkit
# is expected at /usr/local/cuda; without it only the CPU paths build.
set -u
need=()
[ -f /usr/include/cjson/cJSON.h ] || need+=(libcjson-dev)
[ -f /usr/include/pcre2.h ] || need+=(libpcre2-dev)
[ -f /usr/include/utf8proc.h ] || need+=(libutf8proc-dev)
[ -f /usr/include/microhttpd.h ] || need+=(libmicrohttpd-dev)
command -v curl >/dev/null || need+=(curl)
command -v cmake >/dev/null || need+=(cmake)
command -v cc >/dev/null || need+=(gcc)
command -v c++ >/dev/null || need+=(g++)
command -v make >/dev/null || need+=(make)
command -v valgrind >/dev/null || need+=(valgrind)
command -v clang >/dev/null || need+=(clang)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v python3 >/dev/null || need+=(python3)
# tests/test_chat_template.py renders the chat templates with jinja2 too
python3 -c 'import jinja2' 2>/dev/null || need+=(python3-jinja2)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
echo "moec: installing missing packages: ${need[*]}"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null && exit 0
  echo "moec: apt-get failed; run: apt-get update && apt-get install -y ${need[*]}" >&2
  exit 1
fi
echo "moec: missing packages; run: sudo apt-get install -y ${need[*]}" >&2
exit 1
