#!/usr/bin/env bash
# Install the Debian packages fitllm needs (idempotent, quiet when all are present) and build
# in Release with CMake + Ninja into ./build.  Run as root (or with sudo available).
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake ninja-build pkg-config libcmocka-dev libmicrohttpd-dev libcjson-dev
      libxxhash-dev libpcre2-dev libopenmpi-dev openmpi-bin gnuplot-nox curl clang wrk python3 openssl)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

BUILD_TYPE="${FITLLM_BUILD_TYPE:-Release}"
WERROR=OFF; [ "${FITLLM_WERROR:-0}" = 1 ] && WERROR=ON
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" -DFITLLM_WERROR=$WERROR ${FITLLM_CMAKE_ARGS:-} >/dev/null
ninja -C build ${NINJA_QUIET:+>/dev/null}
