#!/usr/bin/env bash
# Session 22, first hold (one GPU, idle): 1. the GPU tests of session 21's review commit (27df5ef:
# the device q8_0 decode in one home, gpu/cuda_common.cuh; cuda::convert one kernel over every
# store type), never run on a GPU before; 2. `bench gpu-ops --only rows` again; 3. the Llama-3-8B
# geometry at 512K under --gpu-mem-budget 24G with the q8_0 store on an idle machine (session 21
# ran it only beside three RULER jobs: 149.4 tok/s).
# (As run, the hold's common part was written out here; it moved to scripts/gpu-hold.sh after the
# session's review, the same commands.)
set -u
source scripts/gpu-hold.sh  # step, synth_l8, decode_l8
( synth_l8; step "synth rc=$?" ) &
for t in gpu_test_cuda_kernels gpu_test_gpu_offload gpu_test_gpu_search gpu_test_cuda_streamed; do
  /usr/bin/time -f "$t %e s" timeout 200 "$t" > "$O/test-$t.log" 2>&1
  step "$t rc=$? $(grep -E 'test cases|passed|failed' "$O/test-$t.log" | tail -1)"
done
timeout 60 topkv bench gpu-ops --only rows --reps 50 --out "$O/rows.jsonl" > "$O/rows.txt" 2>&1
step "rows rc=$?"; grep BENCH "$O/rows.txt"
wait
decode_l8 l512-q8_0 512K q8_0 330
step "l512-q8_0 rc=$?"; tail -4 "$O/l512-q8_0.txt"
