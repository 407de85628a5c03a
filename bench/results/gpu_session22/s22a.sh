#!/usr/bin/env bash
# Session 22, first hold (one GPU, idle): 1. the GPU tests of session 21's review commit (27df5ef:
# the device q8_0 decode in one home, gpu/cuda_common.cuh; cuda::convert one kernel over every
# store type), never run on a GPU before; 2. `bench gpu-ops --only rows` again; 3. the Llama-3-8B
# geometry at 512K under --gpu-mem-budget 24G with the q8_0 store on an idle machine (session 21
# ran it only beside three RULER jobs: 149.4 tok/s).
# Logs under /tmp/b/out, packed into $OUT/r.tgz after every step (a timeout still returns them).
set -u
R=$PWD; S0=$(date +%s); O=/tmp/b/out
mkdir -p $O && cd /tmp/b && tar -xJf "$R/.gpu/bundle.tar.xz" && source /tmp/b/bundle/env.sh
step() { echo "$(( $(date +%s) - S0 ))s $*" | tee -a "$O/steps.txt"; tar czf "$OUT/r.tgz" -C /tmp/b out; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$O/gpu.txt"
( topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o /tmp/b/l8.gguf -q; step "synth rc=$?" ) &
for t in gpu_test_cuda_kernels gpu_test_gpu_offload gpu_test_gpu_search gpu_test_cuda_streamed; do
  /usr/bin/time -f "$t %e s" timeout 200 "$t" > "$O/test-$t.log" 2>&1
  step "$t rc=$? $(grep -E 'test cases|passed|failed' "$O/test-$t.log" | tail -1)"
done
timeout 60 topkv bench gpu-ops --only rows --reps 50 --out "$O/rows.jsonl" > "$O/rows.txt" 2>&1
step "rows rc=$?"; grep BENCH "$O/rows.txt"
wait
timeout 330 topkv bench decode -m /tmp/b/l8.gguf --backend cuda --warmup 4 --steps 32 -q --no-plot --contexts 512K \
  --modes topk --index quest:page=16,coarse_ratio=16 --k 256 --gpu-mem-budget 24G --store-type q8_0 \
  --out-dir "$O/l512-q8_0" > "$O/l512-q8_0.txt" 2>&1
step "l512-q8_0 rc=$?"; tail -4 "$O/l512-q8_0.txt"
