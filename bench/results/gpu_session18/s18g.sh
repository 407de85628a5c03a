#!/usr/bin/env bash
# Session 18, call 7: the runtime's planned GPU memory checked when the model is made (before a
# prefill): the Qwen2.5-1.5B geometry at -c 256K with multipole, a budget too small for its tables
# (an error before any prefill, with the numbers) and one that holds them (runs).
#   carry .gpu/b18g.tar.xz; bash bench/results/gpu_session18/s18g.sh
set -u
W=/tmp/q S=$OUT/s18g
mkdir -p "$W" "$S" /tmp/m
tar -xJf .gpu/b18g.tar.xz -C "$W"
source "$W/b18g/env.sh"
Q=/tmp/m/q15.gguf
topkv model synth --preset qwen2.5-1.5b --type q4_k --context 262144 -o $Q -q > "$S/synth.txt" 2>&1
for b in 1300M 6G; do
  /usr/bin/time -f "%e s" timeout 200 topkv generate -m $Q -p "def main():" -n 8 -c 262144 --backend cuda --attn topk \
    --index multipole --kv-type f16 --gpu-mem-budget $b > "$S/gen-$b.out" 2> "$S/gen-$b.err"
  echo "budget $b rc=$?"; grep -E "error|GPU memory|tok/s|^[0-9.]+ s" "$S/gen-$b.err" | cut -c1-600
done
