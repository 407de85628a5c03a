#!/usr/bin/env bash
# Session 15: the 0.5B's remaining 8K tasks and 2K, default vs rerank_far (CPU, 2 cores).
set -u
cd "$(dirname "$0")/../../../.." || exit 1
D=bench/results/ruler_qwen2.5_0.5b_cpu/rerank_far_rest
M=.models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
common="--backend cpu --chat --samples 2 --answer-tokens 48 --agreement-tokens 32 --error-steps 8 --methods-index multipole --methods-index multipole:rerank_far=1 --methods-k 2% -q"
build/bin/topkv eval ruler -m $M --lengths 8K --tasks niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multivalue,niah_multiquery $common --json $D/r8k.json --csv $D/r8k.csv > $D/r8k.txt 2> $D/r8k.err
build/bin/topkv eval ruler -m $M --lengths 2K $common --json $D/r2k.json --csv $D/r2k.csv > $D/r2k.txt 2> $D/r2k.err
