#!/usr/bin/env bash
# The CPU test suite under a sanitizer: builds the CPU runtime (no CUDA) with
# AddressSanitizer + UndefinedBehaviorSanitizer (TOPKV_ASAN) or ThreadSanitizer
# (TOPKV_TSAN) in its own folder and runs `ctest -L cpu` there.
#   scripts/sanitize.sh              # ASan + UBSan in build-asan/
#   SAN=tsan scripts/sanitize.sh     # TSan in build-tsan/
#   CTEST_ARGS="-R hostile" scripts/sanitize.sh
#   TARGETS="topkv test_overlap_build" CTEST_ARGS="-R overlap" scripts/sanitize.sh   # build only these
# Any report fails the test it came from (halt_on_error, no recovery).
set -euo pipefail
cd "$(dirname "$0")/.."
SAN=${SAN:-asan}
case "$SAN" in
  asan) OPT=-DTOPKV_ASAN=ON ;;
  tsan) OPT=-DTOPKV_TSAN=ON ;;
  *) echo "sanitize.sh: SAN is asan or tsan, not '$SAN'" >&2; exit 2 ;;
esac
BUILD_DIR=${BUILD_DIR:-build-$SAN}
JOBS=${JOBS:-$(nproc)}
# BUILD_TYPE / CXX_FLAGS: scripts/test.sh (CI) builds with None and -O1 -g1.
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" ${CXX_FLAGS:+-DCMAKE_CXX_FLAGS="$CXX_FLAGS"} \
      -DTOPKV_CUDA=OFF "$OPT" >/dev/null
if [ -n "${TARGETS:-}" ]; then
  # One target at a time: several --target in one Makefile build race on the core library.
  for t in $TARGETS; do cmake --build "$BUILD_DIR" -j "$JOBS" --target "$t"; done
else
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi
# Leaks are reported too (detect_leaks); the OpenMP and TBB runtimes' own
# thread-local caches are not leaks of ours (suppressions below).
SUPP="$PWD/scripts/sanitizer.supp"
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:detect_leaks=1:handle_sigbus=0:allow_user_segv_handler=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$SUPP${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export TSAN_OPTIONS="halt_on_error=1:suppressions=$PWD/scripts/tsan.supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
if [ "$SAN" = tsan ]; then
  # libgomp and OpenBLAS are not instrumented: TSan cannot see their barriers
  # and hand-offs and reports races on every buffer their threads share. One
  # thread each keeps them out; what TSan checks is then our own threads (the
  # overlapped index build's tasks, on std::threads under TSan:
  # src/common/task_group.h; the GPU runtime's fold thread, the server's
  # worker and connection threads) and hnswlib's parallel inserts.
  # OMP_THREAD_LIMIT also caps the regions that ask for threads themselves
  # (num_threads clauses with --threads / BuildOptions::n_threads).
  export OMP_NUM_THREADS=1 OMP_THREAD_LIMIT=1 OPENBLAS_NUM_THREADS=1
fi
# The serve tests' `openai` package (scripts/test.sh installs it into build/pydeps).
[ -e "$BUILD_DIR/pydeps" ] || [ ! -d build/pydeps ] || ln -s "$PWD/build/pydeps" "$BUILD_DIR/pydeps"
cd "$BUILD_DIR"
ctest --output-on-failure -j "$JOBS" -L cpu ${CTEST_ARGS:-}
