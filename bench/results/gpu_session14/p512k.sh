#!/usr/bin/env bash
# Session 14: a real prefill of 512K tokens on the Llama-8B geometry (Q4_K, random weights) under
# --gpu-mem-budget 24G with the f8 store and two-level quest, the index built while it prefills
# (generate's overlapped build), then 32 decoded tokens. The prompt: 322,300 words drawn from 16
# (seed 1, bench/results/gpu_session14/README.md), 524,156 tokens with the synthetic vocabulary.
# Host memory sampled every 5 s. Logs under $OUT.
set -u
R=$PWD
cd /tmp && rm -rf bundle && tar -xJf "$R/.gpu/bundle.tar.xz"
source /tmp/bundle/env.sh
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g; } > "$OUT/gpu.txt"
t0=$(date +%s)
[ -f /tmp/l8.gguf ] || topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o /tmp/l8.gguf -q
echo "synth $(( $(date +%s) - t0 )) s" > "$OUT/times.txt"
timeout ${GEN_TIMEOUT:-540} /usr/bin/time -v topkv generate -m /tmp/l8.gguf -f "$R/.gpu/p/p512k.txt" -n 32 -c 524352 \
  --attn topk --index quest:page=16,coarse_ratio=16 --k 256 --gpu-mem-budget 24G --store-type f8 \
  --chunk ${CHUNK:-8192} --kv-type f16 --ignore-eos --json "$OUT/gen.json" > "$OUT/gen.txt" 2> "$OUT/gen.err" &
pid=$!
while kill -0 $pid 2>/dev/null; do
  p=$(pgrep -n -x topkv); [ -n "$p" ] && echo "$(( $(date +%s) - t0 )) $(grep -E 'VmRSS|VmHWM' /proc/$p/status 2>/dev/null | tr -s ' ' | tr '\n' ' ')" >> "$OUT/rss.log"
  sleep 5
done
wait $pid; echo "rc $?" >> "$OUT/times.txt"
echo "total $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"
cat "$OUT/times.txt"; tail -c 1500 "$OUT/gen.err" | tr '\r' '\n' | tail -25; tail -3 "$OUT/rss.log"; head -c 3000 "$OUT/gen.json"
