#!/usr/bin/env bash
# gpu_devpkgs.sh — run here (a Debian machine with apt): downloads the Debian
# packages the build needs that the GPU machine lacks (it has no apt and no
# network) and extracts each under .dev/NAME/, which scripts/gpu_snapshot.sh
# carries and scripts/gpu_build.sh uses. List /.dev/ in .git/info/exclude.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .dev/debs
# libmicrohttpd12 needs GnuTLS; these are libgnutls30 and what it needs, used
# there only where the machine has no libgnutls.so.30 (scripts/gpu_build.sh)
GNUTLS=(libgnutls30 libhogweed6 libnettle8 libgmp10 libidn2-0 libunistring2 libtasn1-6
  libp11-kit0 libffi8)
rm -f .dev/debs/*.deb
(cd .dev/debs && apt-get download libcjson1 libcjson-dev libpcre2-8-0 libpcre2-dev \
  libutf8proc2 libutf8proc-dev libmicrohttpd12 libmicrohttpd-dev \
  "${GNUTLS[@]}")
extract() { # extract NAME PKG...
  local name=$1; shift
  rm -rf ".dev/$name"
  for p in "$@"; do dpkg -x .dev/debs/"$p"_*.deb ".dev/$name"; done
}
extract cjson libcjson1 libcjson-dev
extract pcre2 libpcre2-8-0 libpcre2-dev
extract utf8proc libutf8proc2 libutf8proc-dev
extract microhttpd libmicrohttpd12 libmicrohttpd-dev
extract gnutls "${GNUTLS[@]}"
du -sh .dev
