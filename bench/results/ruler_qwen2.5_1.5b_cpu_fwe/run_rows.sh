#!/usr/bin/env bash
# Session 15: the 16K fwe prompt again, with eval ruler's rows_attended: how many store rows a KV
# head attends per layer and step under --threshold 3e-5 and under budgets of 2% and 10%.
set -u
cd "$(dirname "$0")/../../.." || exit 1
D=bench/results/ruler_qwen2.5_1.5b_cpu_fwe
M=.models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
common="--backend cpu --chat --lengths 16K --tasks fwe --samples 1 --seed 2 --answer-tokens 48 --agreement-tokens 8 --error-steps 0 -q"
build/bin/topkv eval ruler -m $M $common --threshold 3e-5 --methods-index multipole --methods-k 2% \
  --json $D/rows-t3e-5.json --csv $D/rows-t3e-5.csv > $D/rows-t3e-5.txt 2> $D/rows-t3e-5.err
build/bin/topkv eval ruler -m $M $common --methods-index multipole,multipole:rerank_far=1 --methods-k 2%,10% \
  --json $D/rows-budget.json --csv $D/rows-budget.csv > $D/rows-budget.txt 2> $D/rows-budget.err
