#!/usr/bin/env bash
# Session 29: what the budget's longer Quest pages cost (DeviceTableChoice::page_factor: the device
# holds SummaryTables::coarsened(f), exactly quest with page 16*f), on real keys: Qwen2.5-Coder-1.5B,
# 8,192 tokens of this repository's C++ sources, every layer (28) and KV head (2), 32 decode queries,
# the first 4 keys left out as the runtime's sinks; quest one level at pages 16 / 32 / 64, and flat
# (the exact top-k) beside, at k = 1% / 2% / 5% (82 / 164 / 410 keys).
#   ls src/*/*.cpp index/*.cpp offload/*.cpp gpu/*.cpp | head -200 | xargs cat > /tmp/long.txt
#   topkv kv dump -m .models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf -f /tmp/long.txt --max-tokens 8192 \
#     --queries 32 --chunk 1024 --threads 2 -o /tmp/q15_8k.safetensors
set -u
cd "$(dirname "$0")/../../.." || exit 1
D=bench/results/quest_longer_pages_qwen15
mkdir -p $D/csv
for L in $(seq 0 27); do
  for H in 0 1; do
    build/bin/topkv bench recall --dump /tmp/q15_8k.safetensors --skip-keys 4 --layer $L --head $H \
      --index flat --index quest:page=16 --index quest:page=32 --index quest:page=64 --sweep k=82,164,410 \
      --threads 2 --quiet --csv $D/csv/l${L}_h${H}.csv > /dev/null || echo "layer $L head $H failed" >&2
  done
done
