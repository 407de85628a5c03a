#!/usr/bin/env bash
# Session 13: the session 7/8 peer rows whose code this session changed, with
# this build (no regression check): Llama-8B geometry quest k=256 under 24G at
# 32K/128K (f16 store, as session 8), Gemma-3-270M geometry quest k=1024 at 512K
# (as session 7). Logs under $OUT.
set -u
R=$PWD
cd /tmp && rm -rf bundle && tar -xJf "$R/.gpu/bundle.tar.xz"
source /tmp/bundle/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
[ -f /tmp/l8c.gguf ] || topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o /tmp/l8c.gguf -q
[ -f /tmp/g.gguf ] || topkv model synth --preset gemma3-270m --type q8_0 --context 1048640 -o /tmp/g.gguf -q
T="topkv bench decode --backend cuda --warmup 4 --steps 32 --no-plot"
timeout 200 $T -m /tmp/l8c.gguf --contexts 32K,128K --modes topk --index quest --k 256 --gpu-mem-budget 24G \
  --out-dir "$OUT/l-topk" > "$OUT/l-topk.txt" 2>&1
timeout 150 $T -m /tmp/g.gguf --contexts 512K --modes topk --index quest --k 1024 --out-dir "$OUT/g-topk" > "$OUT/g-topk.txt" 2>&1
grep -hE "^ +[0-9]+ topk|rror" "$OUT/l-topk.txt" "$OUT/g-topk.txt"
