#!/usr/bin/env bash
# Session 26: vt and fwe (the tasks of the 1.5B grid's near ties) x 3 samples at 8K, multipole at 1% and 2%.
D=bench/results/ruler_qwen2.5_0.5b_cpu/lloyd_vs_host_8k
exec "$(dirname "$0")/../builds_ab.sh" "$D" --lengths 8K --tasks vt,fwe --samples 3 --answer-tokens 48 \
  --agreement-tokens 32 --error-steps 4 --methods-k 1%,2%
