#!/usr/bin/env bash
# Session 15, while the 1.5B goes up (scripts/gpu-ruler.sh bg): the device search's GPU tests
# (kernels against their CPU twins, now with far_dropped; the GPU runtime against the CPU runtime).
W=${WORK:-/tmp/q}; R=$W/out
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$R/gpu.txt"
for t in gpu_test_gpu_search gpu_test_gpu_offload; do
  /usr/bin/time -f "$t %e s" timeout 600 "$W/bundle/bin/$t" 2>&1 | tail -25 > "$R/test-$t.txt"
done
