#!/usr/bin/env bash
# Session 29: the longer pages end to end, on the CPU backend of the 2-core dev machine: the 1.5B at 4K,
# all 11 RULER tasks x 1 prompt (seed 1), quest (one level) at pages 16 / 32 / 64 and k = 2%, the
# grid's options but --error-steps 0.
set -u
cd "$(dirname "$0")/../../.." || exit 1
D=bench/results/quest_longer_pages_qwen15
/usr/bin/time -v build/bin/topkv eval ruler -m .models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --backend cpu --chat \
  --answer-tokens 48 --agreement-tokens 64 --chunk 4096 --kv-type f16 --threads 2 --lengths 4K --samples 1 \
  --error-steps 0 --methods-index quest:page=16 --methods-index quest:page=32 --methods-index quest:page=64 \
  --methods-k 2% --csv $D/ruler4k.csv --json $D/ruler4k.json -q > $D/ruler4k.txt 2> $D/ruler4k.err
