#!/usr/bin/env bash
# Session 18: a finer far field for the 16K fwe prompt: multipole with 8 and 4 keys a
# centroid (ratio=8, ratio=4; the default is 16) at k = 2%.
set -u
cd "$(dirname "$0")/../../.." || exit 1
D=bench/results/ruler_qwen2.5_1.5b_cpu_fwe
M=.models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
build/bin/topkv eval ruler -m $M --backend cpu --chat --lengths 16K --tasks fwe --samples 1 --seed 2 \
  --answer-tokens 48 --agreement-tokens 16 --error-steps 2 --methods-index multipole:ratio=8,multipole:ratio=4 \
  --methods-k 2% -q --json $D/ratio16k.json --csv $D/ratio16k.csv > $D/ratio16k.txt 2> $D/ratio16k.err
