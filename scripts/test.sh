#!/usr/bin/env bash
# The test command: installs what the build needs, configures, builds and runs
# every test with CTest. Tests labelled `gpu` skip themselves when no GPU is
# present (exit code 77 -> CTest "Skipped").
#   scripts/test.sh            # Release build in build/
#   BUILD_DIR=build-dbg BUILD_TYPE=Debug scripts/test.sh
#   FUZZ=0 scripts/test.sh     # without the short fuzzer runs (label fuzz)
#   ASAN=0 scripts/test.sh     # without the CPU suite under ASan + UBSan
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The real models (Gemma 3 270M, Qwen2.5-Coder 0.5B and 1.5B) for the golden
# tests; without them those tests skip.
for m in gemma3-270m qwen2.5-coder-0.5b qwen2.5-coder-1.5b; do
  scripts/fetch-model.sh "$m" >/dev/null || echo "test.sh: $m could not be installed; tests that need it will skip" >&2
done
BUILD_DIR=${BUILD_DIR:-build}
BUILD_TYPE=${BUILD_TYPE:-Release}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
# The `openai` client for tests/test_serve.py, from the package index, into the
# build folder (never the system's Python); the serve tests fail without it.
# Installed with the interpreter CTest runs the tests with (tests/CMakeLists.txt:
# /usr/bin/python3 first), so that compiled dependencies match it.
PYDEPS="$BUILD_DIR/pydeps"
PY=$(grep -m1 '^TOPKV_TEST_PYTHON:' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null | cut -d= -f2)
PY=${PY:-python3}
if ! PYTHONPATH="$PYDEPS" "$PY" -c "import openai" 2>/dev/null; then
  "$PY" -m pip install --quiet --target "$PYDEPS" openai ||
    echo "test.sh: pip could not install the openai package into $PYDEPS; the test_serve tests will fail" >&2
fi
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS" -LE long ${CTEST_ARGS:-})
# A short run of each libFuzzer target (tests/fuzz: GGUF, packs, head
# patterns, policy JSON, tokenizers) from its committed seeds, built with clang
# and ASan + UBSan in its own folder (FUZZ=0 skips it).
if [ "${FUZZ:-1}" != 0 ]; then
  FUZZ_DIR=${FUZZ_DIR:-build-fuzz}
  cmake -S . -B "$FUZZ_DIR" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DTOPKV_FUZZ=ON -DTOPKV_CUDA=OFF -DTOPKV_TESTS=OFF >/dev/null
  cmake --build "$FUZZ_DIR" -j "$JOBS" --target topkv_fuzzers
  (cd "$FUZZ_DIR" && ctest --output-on-failure -L fuzz)
fi
# The CPU test suite again under AddressSanitizer + UndefinedBehaviorSanitizer
# (scripts/sanitize.sh: no CUDA, its own folder; any report fails its test).
# -O1 -g1 here: about twice as fast to build on CI's two cores as
# RelWithDebInfo, with the line tables the reports need (ASAN=0 skips it).
# The real models' forward passes are left to the run above
# (TOPKV_TEST_REAL_FORWARD=0, tests/real_models.h): ~3x slower under ASan,
# over code the synthetic models' tests run here too.
if [ "${ASAN:-1}" != 0 ]; then
  TOPKV_TEST_REAL_FORWARD=0 JOBS=$JOBS BUILD_DIR=${ASAN_DIR:-build-asan} BUILD_TYPE=None CXX_FLAGS="-O1 -g1" \
    CTEST_ARGS="-LE long" scripts/sanitize.sh
fi
