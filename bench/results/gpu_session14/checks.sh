#!/usr/bin/env bash
# Session 14, in the background while the 1.5B goes up (scripts/gpu-ruler.sh bg): the device
# search's GPU tests (kernels against their CPU twins, the GPU runtime against the CPU runtime)
# on the final build of session 13 (its last review commit was compiled, not run).
W=${WORK:-/tmp/q}; R=$W/out
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$R/gpu.txt"
for t in gpu_test_gpu_search gpu_test_gpu_offload; do
  /usr/bin/time -f "$t %e s" timeout 600 "$W/bundle/bin/$t" 2>&1 | tail -25 > "$R/test-$t.txt"
done
