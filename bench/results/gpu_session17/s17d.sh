#!/usr/bin/env bash
# Session 17, the same hold, after the timings: ThreadSanitizer over the CUDA
# offload runtime's fold thread (issue 17). A TSan build of the GPU tests
# (-DTOPKV_TSAN=ON with CUDA: our C++ instrumented, the kernels not) carried as
# a bundle; OpenMP and OpenBLAS at one thread (not instrumented, as in
# scripts/sanitize.sh); reports go to $S/tsan.<pid> and do not stop the run.
#   tar -xJf tsan.tar.xz -C /tmp/q; scripts/gpu-ruler.sh bg s17d 0 "bash /tmp/s17d.sh"
set -u
S=/tmp/q/out/s17/tsan
mkdir -p "$S"
step() { echo "$(date +%T) $*" >> "$S/steps.txt"; }
source /tmp/q/tsan/env.sh
export OMP_NUM_THREADS=1 OMP_THREAD_LIMIT=1 OPENBLAS_NUM_THREADS=1
export TSAN_OPTIONS="halt_on_error=0:suppressions=/tmp/tsan.supp:history_size=4:log_path=$S/tsan"
run() {  # NAME BINARY [TEST CASE]
  local n=$1; shift
  timeout 170 "$@" > "$S/$n.txt" 2>&1; local rc=$?
  if grep -q "unexpected memory mapping" "$S/$n.txt"; then  # high ASLR entropy: run without randomisation
    timeout 170 setarch "$(uname -m)" -R "$@" > "$S/$n.txt" 2>&1; rc=$?
  fi
  step "$n rc=$rc $(grep -E 'passed|failed' "$S/$n.txt" | tail -1) reports: $(cat "$S"/tsan.* 2>/dev/null | grep -c 'WARNING: ThreadSanitizer')"
}
run folds gpu_test_gpu_search "GpuOffloadRuntime folds on a host thread and stays exact while the folds run"
run async gpu_test_gpu_search "Async folds land at a fixed step: the same outputs however fast the host folds"
run cache gpu_test_gpu_search "The store cache serves the same attention as reading the host store"
run offload gpu_test_gpu_offload
step "s17d done"
