#!/usr/bin/env bash
# Session 15: --threshold 3e-5 at 8K on the tasks where selection matters (fwe, vt, cwe,
# niah_multikey_3), one prompt each (seed 1, sample 0: fwe's is the hard 8K prompt).
set -u
cd "$(dirname "$0")/../../.." || exit 1
D=bench/results/ruler_qwen2.5_1.5b_cpu_fwe
build/bin/topkv eval ruler -m .models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --backend cpu --chat --lengths 8K \
  --tasks fwe,vt,cwe,niah_multikey_3 --samples 1 --seed 1 --answer-tokens 48 --agreement-tokens 32 --error-steps 4 \
  --threshold 3e-5 --methods-index multipole --methods-k 2% -q \
  --json $D/t8k-3e-5.json --csv $D/t8k-3e-5.csv > $D/t8k-3e-5.txt 2> $D/t8k-3e-5.err
