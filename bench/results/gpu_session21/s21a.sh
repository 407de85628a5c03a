#!/usr/bin/env bash
# Session 21, GPU 0 of four, in the background (scripts/gpu-ruler.sh bg) while the 1.5B goes up:
# 1. the GPU tests of the q8_0 read path (row-list and rerank kernels, the runtimes, the prefill
#    rings, cuda::convert) against their CPU twins; 2. the Llama-3-8B geometry (Q4_K, random
#    weights) at 512K under --gpu-mem-budget 24G, two-level quest, k = 256, synthetic fill, with
#    the q8_0 store and then the f8 store (session 17's 150.4 tok/s run), one after the other.
W=${WORK:-/tmp/q}; R=$W/out; L=$W/m/l8.gguf
step() { echo "$(date +%T) $*" >> "$R/steps.txt"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$R/gpu.txt"
( topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o "$L" -q; step "synth rc=$?" ) &
for t in gpu_test_cuda_kernels gpu_test_gpu_offload gpu_test_gpu_search gpu_test_cuda_streamed; do
  /usr/bin/time -f "$t %e s" timeout 400 "$t" > "$R/test-$t.log" 2>&1
  step "$t rc=$? $(grep -E 'test cases|passed' "$R/test-$t.log" | tail -1)"
done
wait
for st in q8_0 f8; do
  timeout 420 topkv bench decode -m "$L" --backend cuda --warmup 4 --steps 32 -q --no-plot --contexts 512K \
    --modes topk --index quest:page=16,coarse_ratio=16 --k 256 --gpu-mem-budget 24G --store-type $st \
    --out-dir "$R/l512-$st" > "$R/l512-$st.txt" 2>&1
  step "l512-$st rc=$?"
done
