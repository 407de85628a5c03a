#!/usr/bin/env bash
# Session 22, third hold (one H100, idle): the Llama-3-8B geometry at 1M under --gpu-mem-budget 24G
# with the q8_0 store (session 13 ran 1M with f8 only: 136.2 / 135.5 tok/s, peak RSS 92.79 GiB on
# an H100), two-level quest, k = 256, synthetic fill. Logs packed into $OUT/r.tgz after each step.
set -u
R=$PWD; S0=$(date +%s); O=/tmp/b/out
mkdir -p $O && cd /tmp/b && tar -xJf "$R/.gpu/bundle.tar.xz" && source /tmp/b/bundle/env.sh
step() { echo "$(( $(date +%s) - S0 ))s $*" | tee -a "$O/steps.txt"; tar czf "$OUT/r.tgz" -C /tmp/b out; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$O/gpu.txt"
topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o /tmp/b/l8.gguf -q; step "synth rc=$?"
timeout $(( 575 - ($(date +%s) - S0) )) topkv bench decode -m /tmp/b/l8.gguf --backend cuda --warmup 4 --steps 32 -q \
  --no-plot --contexts 1M --modes topk --index quest:page=16,coarse_ratio=16 --k 256 --gpu-mem-budget 24G \
  --store-type q8_0 --out-dir "$O/l1m-q8_0" > "$O/l1m-q8_0.txt" 2>&1
step "l1m-q8_0 rc=$?"; tail -4 "$O/l1m-q8_0.txt"
