#!/usr/bin/env bash
# Session 15: the fwe prompt at 8K that every top-k method loses on the GPU host (seed 1, sample
# 0), on the CPU: how much k does it take? multipole:rerank_far=1 and flat (exact top-k per head).
set -u
cd "$(dirname "$0")/../../.." || exit 1
D=bench/results/ruler_qwen2.5_1.5b_cpu_fwe
build/bin/topkv eval ruler -m .models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --backend cpu --chat --lengths 8K \
  --tasks fwe --samples 1 --seed 1 --answer-tokens 48 --agreement-tokens 32 --error-steps 4 \
  --methods-index multipole:rerank_far=1,flat --methods-k 2%,10%,30% -q \
  --json $D/r8k.json --csv $D/r8k.csv > $D/r8k.txt 2> $D/r8k.err
