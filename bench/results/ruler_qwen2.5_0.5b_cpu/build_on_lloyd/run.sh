#!/usr/bin/env bash
# Session 19: the fidelity suite on the indexes --build-on gpu clusters against Faiss's: all 11
# tasks x 2 samples at 2K and 4K, the default multipole at k = 2%.
D=bench/results/ruler_qwen2.5_0.5b_cpu/build_on_lloyd
exec "$(dirname "$0")/../builds_ab.sh" "$D" --lengths 2K,4K --samples 2 --answer-tokens 48 --agreement-tokens 32 \
  --error-steps 8 --methods-k 2%
