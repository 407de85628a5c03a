#!/usr/bin/env bash
# Session 26: vt (the task of the 1.5B grid's 16K near tie) x 3 samples at 16K, multipole at 2%.
D=bench/results/ruler_qwen2.5_0.5b_cpu/lloyd_vs_host_16k
exec "$(dirname "$0")/../builds_ab.sh" "$D" --lengths 16K --tasks vt --samples 3 --answer-tokens 48 \
  --agreement-tokens 32 --error-steps 4 --methods-k 2%
