#!/usr/bin/env bash
# Session 18: which layers the 16K fwe prompt needs more k in. k = 4% with a weights
# schedule that gives one quarter of the 28 layers 10% of the context and the rest 2%
# (weights 5 and 1, mean 2: the same total as uniform 4%), one method a quarter.
set -u
cd "$(dirname "$0")/../../.." || exit 1
D=bench/results/ruler_qwen2.5_1.5b_cpu_fwe
M=.models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
Q=$(python3 -c "print(','.join('weights:'+'/'.join('5' if q*7<=l<q*7+7 else '1' for l in range(28)) for q in range(4)))")
build/bin/topkv eval ruler -m $M --backend cpu --chat --lengths 16K --tasks fwe --samples 1 --seed 2 \
  --answer-tokens 48 --agreement-tokens 16 --error-steps 0 --methods-index multipole --methods-k 4% \
  --methods-k-schedule "$Q" -q --json $D/quarters16k.json --csv $D/quarters16k.csv > $D/quarters16k.txt 2> $D/quarters16k.err
