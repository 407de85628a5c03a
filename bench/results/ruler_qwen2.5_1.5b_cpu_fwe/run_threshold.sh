#!/usr/bin/env bash
# Session 15: the 16K fwe prompt with an adaptive budget: multipole's threshold mode (clusters
# whose keys' estimated attention share is >= T; no rerank), T = 1e-4 and 3e-5 (uniform: 6e-5).
set -u
cd "$(dirname "$0")/../../.." || exit 1
D=bench/results/ruler_qwen2.5_1.5b_cpu_fwe
M=.models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
for t in 1e-4 3e-5; do
  build/bin/topkv eval ruler -m $M --backend cpu --chat --lengths 16K --tasks fwe --samples 1 --seed 2 \
    --answer-tokens 48 --agreement-tokens 32 --error-steps 4 --threshold $t --methods-index multipole \
    --methods-k 2% -q --json $D/t16k-$t.json --csv $D/t16k-$t.csv > $D/t16k-$t.txt 2> $D/t16k-$t.err
done
