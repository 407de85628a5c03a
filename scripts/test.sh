#!/usr/bin/env bash
# The test command: installs what the build needs, configures, builds and runs
# every test with CTest. Tests labelled `gpu` skip themselves when no GPU is
# present (exit code 77 -> CTest "Skipped").
#   scripts/test.sh            # Release build in build/
#   BUILD_DIR=build-dbg BUILD_TYPE=Debug scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The real model (Gemma 3 270M) for the golden tests; without it they skip.
scripts/fetch-model.sh >/dev/null || echo "test.sh: the model could not be installed; tests that need it will skip" >&2
BUILD_DIR=${BUILD_DIR:-build}
BUILD_TYPE=${BUILD_TYPE:-Release}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
cd "$BUILD_DIR"
ctest --output-on-failure -j "$JOBS" ${CTEST_ARGS:-}
