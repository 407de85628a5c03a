#!/usr/bin/env bash
# Session 13: the Llama-8B geometry at 1M tokens under 24G (two-level quest,
# f8 store), host memory sampled every 5 s (VmRSS, VmHWM). Logs under $OUT.
set -u
R=$PWD
cd /tmp && rm -rf bundle && tar -xJf "$R/.gpu/bundle.tar.xz"
source /tmp/bundle/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"; free -g >> "$OUT/gpu.txt"
[ -f /tmp/l8.gguf ] || topkv model synth --preset llama3-8b --type q4_k -o /tmp/l8.gguf -q
spec=${SPEC:-quest:page=16,coarse_ratio=16}
timeout ${DEC_TIMEOUT:-540} topkv bench decode -m /tmp/l8.gguf --contexts ${CTX:-1M} --modes topk --index "$spec" --k 256 --beyond-trained \
  --gpu-mem-budget 24G --store-type f8 --steps 32 --warmup 4 --out-dir "$OUT/dec1m" > "$OUT/dec1m.txt" 2>&1 &
pid=$!
while kill -0 $pid 2>/dev/null; do
  p=$(pgrep -n -x topkv); [ -n "$p" ] && echo "$(date +%s) $(grep -E 'VmRSS|VmHWM' /proc/$p/status 2>/dev/null | tr -s ' ' | tr '\n' ' ')" >> "$OUT/rss.log"
  sleep 5
done
wait $pid; echo "rc $?"
grep -A2 " context" "$OUT/dec1m.txt"; tail -2 "$OUT/dec1m.txt"; tail -2 "$OUT/rss.log"
