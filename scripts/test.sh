#!/usr/bin/env bash
# Set up (packages + Release build) and run the whole test suite with ctest; then build the CLI
# again with ASan + UBSan (build-san/, Debug) and run the CLI-level tests (tests/cli_*.sh: the
# server, engine, run, train, quantize, plan, MPI ...) on it, so that a memory error in a path
# only the CLI reaches fails the suite.  FITLLM_TEST_SANITIZE=0 skips that second pass (1-1.5
# minutes to build and 3-5.5 to run on 2 cores); extra arguments go to the first ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
(cd build && ctest --output-on-failure -j2 "$@")
if [ "${FITLLM_TEST_SANITIZE:-1}" = 1 ]; then
  WERROR=OFF; [ "${FITLLM_WERROR:-0}" = 1 ] && WERROR=ON
  cmake -S . -B build-san -G Ninja -DCMAKE_BUILD_TYPE=Debug -DFITLLM_SANITIZE=ON -DFITLLM_WERROR=$WERROR >/dev/null
  ninja -C build-san fitllm_cli >build-san/build.out 2>&1 || { cat build-san/build.out; exit 1; }
  # cli_fuzz builds its own instrumented tree (the first pass ran it)
  (cd build-san && ctest --output-on-failure -j2 -R '^cli_' -E '^cli_fuzz$')
fi
