#!/usr/bin/env bash
# Session 15: the 16K fwe prompt every top-k method lost on the GPU host (seed 2, sample 0), on
# the CPU, k from 2% to 20%; and the 8K prompt again with its text saved (word counts).
set -u
cd "$(dirname "$0")/../../.." || exit 1
D=bench/results/ruler_qwen2.5_1.5b_cpu_fwe
M=.models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
build/bin/topkv eval ruler -m $M --backend cpu --chat --lengths 8K --tasks fwe --samples 1 --seed 1 \
  --answer-tokens 48 --agreement-tokens 8 --error-steps 0 --methods-index multipole:rerank_far=1 --methods-k 2% -q \
  --save-prompts $D/prompt8k.jsonl --json $D/p8k.json --csv $D/p8k.csv > $D/p8k.txt 2> $D/p8k.err
build/bin/topkv eval ruler -m $M --backend cpu --chat --lengths 16K --tasks fwe --samples 1 --seed 2 \
  --answer-tokens 48 --agreement-tokens 32 --error-steps 4 --methods-index multipole:rerank_far=1,flat \
  --methods-k 2%,10%,20% --save-prompts $D/prompt16k.jsonl -q \
  --json $D/r16k.json --csv $D/r16k.csv > $D/r16k.txt 2> $D/r16k.err
