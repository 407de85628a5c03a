#!/usr/bin/env bash
# Session 18, call 4: the GPU k-means after the empty-cluster split (kmeans_split_empty on
# the host between rounds): its test against the twin, its time per block, and the 8B
# geometry's multipole build at 128K (synthetic) again.
#   carry .gpu/b18d.tar.xz; bash bench/results/gpu_session18/s18d.sh
set -u
W=/tmp/q S=$OUT/s18d
mkdir -p "$W" "$S" /tmp/m
tar -xJf .gpu/b18d.tar.xz -C "$W"
source "$W/b18d/env.sh"
step() { echo "$(date +%T) $*" | tee -a "$S/steps.txt"; }
L=/tmp/m/l8.gguf
( [ -e $L ] || topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o $L -q ) > "$S/synth.txt" 2>&1 &
timeout 200 gpu_test_gpu_kmeans > "$S/test-kmeans.txt" 2>&1
step "gpu_test_gpu_kmeans rc=$? $(grep -E 'passed|failed' "$S/test-kmeans.txt" | tail -1)"
grep SUMMARY "$S/test-kmeans.txt"
topkv bench gpu-ops --only kmeans --reps 50 > "$S/kmeans.txt" 2>&1
step "gpu-ops kmeans rc=$?"; grep "BENCH kmeans" "$S/kmeans.txt"
wait
timeout 300 topkv bench decode -m $L --backend cuda --modes topk --index multipole --k 1024 --gpu-mem-budget 24G \
  --steps 8 --warmup 2 -q --no-plot --contexts 128K --build-on gpu --out-dir "$S/mp-gpu-128K" > "$S/mp-gpu-128K.txt" 2>&1
step "mp-gpu-128K rc=$? $(grep -A1 'context mode' "$S/mp-gpu-128K.txt" | tail -1 | cut -c1-60,150-)"
