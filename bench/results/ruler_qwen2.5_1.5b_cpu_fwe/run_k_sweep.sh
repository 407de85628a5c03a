#!/usr/bin/env bash
# Session 17: the 16K fwe prompt again (seed 2, sample 0) with multipole's new default
# (rerank_far=1) at k = 3%, 4%, 5%: the least k that answers it (2% fails, 10% answers).
set -u
cd "$(dirname "$0")/../../.." || exit 1
D=bench/results/ruler_qwen2.5_1.5b_cpu_fwe
M=.models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
build/bin/topkv eval ruler -m $M --backend cpu --chat --lengths 16K --tasks fwe --samples 1 --seed 2 \
  --answer-tokens 48 --agreement-tokens 32 --error-steps 4 --methods-index multipole \
  --methods-k 3%,4%,5% -q --json $D/k16k.json --csv $D/k16k.csv > $D/k16k.txt 2> $D/k16k.err
