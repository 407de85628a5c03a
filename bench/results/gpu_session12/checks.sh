#!/usr/bin/env bash
# Session 12, on one GPU while the model goes up (scripts/gpu-ruler.sh bg): the device search's
# GPU tests (kernels against their CPU twins, the GPU runtime against the CPU runtime), the search
# benchmark (rerank and spread rows at the million-token shapes), then compute-sanitizer over the
# listed cases (sanitize_cases.tsv: the search kernels incl. rerank and spread, and the two
# racecheck runs session 10 left unfinished).
W=${WORK:-/tmp/q}; R=$W/out
mkdir -p "$W/scripts" && cp scripts/gpu-check.sh "$W/scripts/" && cp bench/results/gpu_session12/sanitize_cases.tsv "$W/"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$R/gpu.txt"
for t in gpu_test_gpu_search gpu_test_gpu_offload; do
  /usr/bin/time -f "$t %e s" timeout 600 "$W/bundle/bin/$t" 2>&1 | tail -25 > "$R/test-$t.txt"
done
timeout 300 topkv bench gpu-ops --only search --out "$R/search.jsonl" > "$R/search.txt" 2>&1
GPU_CHECK_SANITIZE=1 GPU_CHECK_TESTS=0 GPU_CHECK_BENCH=0 GPU_CHECK_SANITIZE_CASES="$W/sanitize_cases.tsv" \
  GPU_CHECK_SANITIZE_TIMEOUT=${SANITIZE_TIMEOUT:-1200} GPU_CHECK_SANITIZE_JOBS=6 BUNDLE="$W/bundle" OUT="$R/sanitize" \
  bash "$W/scripts/gpu-check.sh" > "$R/sanitize.log" 2>&1
