#!/usr/bin/env bash
# Session 17, a second short hold: the device search's GPU tests with
# rerank_far as multipole's default, then compute-sanitizer (memcheck,
# racecheck, synccheck) over every test case of the two binaries whose kernels
# changed since the last full sanitizer pass (session 12): the MMVQ kernels and
# the fused forming kernel with two activation terms (session 16).
#   tar -xJf .up/vb.tar.xz -C /tmp/q; bash bench/results/gpu_session17/v1.sh
set -u
S=/tmp/q/out/v
mkdir -p "$S" /tmp/q/san/bin
ln -sfn /tmp/q/vbundle/lib /tmp/q/san/lib && cp /tmp/q/vbundle/env.sh /tmp/q/san/
ln -sf /tmp/q/vbundle/bin/gpu_test_cuda_mmvq /tmp/q/vbundle/bin/gpu_test_cuda_quant /tmp/q/san/bin/
source /tmp/q/vbundle/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$S/gpu.txt"
for t in gpu_test_gpu_search gpu_test_gpu_offload; do
  timeout 200 "$t" > "$S/$t.txt" 2>&1
  echo "$t rc=$? $(grep -E 'passed|failed' "$S/$t.txt" | tail -1)" | tee -a "$S/steps.txt"
done
BUNDLE=/tmp/q/san OUT=$S/san GPU_CHECK_SANITIZE=1 GPU_CHECK_SANITIZE_SPLIT=case GPU_CHECK_SANITIZE_JOBS=10 \
  GPU_CHECK_SANITIZE_TOOLS="memcheck racecheck synccheck" GPU_CHECK_SANITIZE_TIMEOUT=240 GPU_CHECK_TESTS=0 \
  GPU_CHECK_BENCH=0 timeout 330 bash scripts/gpu-check.sh > "$S/gpu-check.txt" 2>&1
echo "gpu-check rc=$?" | tee -a "$S/steps.txt"
cat "$S/san/sanitize-results.txt"
