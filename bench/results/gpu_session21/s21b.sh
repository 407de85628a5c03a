#!/usr/bin/env bash
# Session 21, second hold (one GPU): the q8_0 rows read in one unit load per lane (Q8Unit,
# load_rows_lanes) in the row-list and rerank kernels. 1. their GPU tests against the CPU twins;
# 2. `bench gpu-ops --only rows`: the row-list kernel per store type at the Llama-3-8B layer shape,
# rows over PCIe and on the device, q8_0 also unaligned (the lane-at-a-time path) in the same run;
# 3. while the call's time lasts: the 8B geometry at 128K, q8_0 then f8 (synthetic fill).
# Logs under /tmp/b/out, packed into $OUT/r.tgz after every step (a timeout still returns them;
# a call returns at most 8 files).
set -u
R=$PWD; S0=$(date +%s); O=/tmp/b/out
mkdir -p $O && cd /tmp/b && tar -xJf "$R/.gpu/bundle.tar.xz" && source /tmp/b/bundle/env.sh
step() { echo "$(( $(date +%s) - S0 ))s $*" | tee -a "$O/steps.txt"; tar czf "$OUT/r.tgz" -C /tmp/b out; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$O/gpu.txt"
( topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o /tmp/b/l8.gguf -q; step "synth rc=$?" ) &
for t in gpu_test_gpu_offload gpu_test_gpu_search; do
  timeout 200 "$t" > "$O/test-$t.log" 2>&1; step "$t rc=$? $(grep -E 'test cases' "$O/test-$t.log" | tail -1)"
done
timeout 60 topkv bench gpu-ops --only rows --reps 50 --out "$O/rows.jsonl" > "$O/rows.txt" 2>&1
step "rows rc=$?"; grep BENCH "$O/rows.txt"
wait
for st in q8_0 f8; do
  timeout 150 topkv bench decode -m /tmp/b/l8.gguf --backend cuda --warmup 4 --steps 32 -q --no-plot --contexts 128K \
    --modes topk --index quest:page=16,coarse_ratio=16 --k 256 --gpu-mem-budget 24G --store-type $st \
    --out-dir "$O/l128-$st" > "$O/l128-$st.txt" 2>&1
  step "l128-$st rc=$?"; tail -3 "$O/l128-$st.txt" | head -2
done
