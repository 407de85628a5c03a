#!/usr/bin/env bash
# Session 22, fourth hold (one H100, idle): the Llama-3-8B geometry at 512K under --gpu-mem-budget 24G,
# f8 then q8_0 one after the other on the same machine (two-level quest, k = 256, synthetic fill), so
# that the two stores' decode speeds compare within one run. Logs packed into $OUT/r.tgz after each step.
set -u
R=$PWD; S0=$(date +%s); O=/tmp/b/out
mkdir -p $O && cd /tmp/b && tar -xJf "$R/.gpu/bundle.tar.xz" && source /tmp/b/bundle/env.sh
step() { echo "$(( $(date +%s) - S0 ))s $*" | tee -a "$O/steps.txt"; tar czf "$OUT/r.tgz" -C /tmp/b out; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$O/gpu.txt"
topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o /tmp/b/l8.gguf -q; step "synth rc=$?"
for st in f8 q8_0; do
  timeout 280 topkv bench decode -m /tmp/b/l8.gguf --backend cuda --warmup 4 --steps 32 -q --no-plot \
    --contexts 512K --modes topk --index quest:page=16,coarse_ratio=16 --k 256 --gpu-mem-budget 24G \
    --store-type $st --out-dir "$O/l512-$st" > "$O/l512-$st.txt" 2>&1
  step "l512-$st rc=$?"; tail -3 "$O/l512-$st.txt" | head -1
done
