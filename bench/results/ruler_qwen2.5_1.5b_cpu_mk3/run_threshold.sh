#!/usr/bin/env bash
# Session 22: the lost niah_multikey_3 prompt at 8K (seed 3 sample 1) with multipole's threshold mode
# (--threshold 3e-5: per query head the clusters whose keys' estimated attention share is at least
# 3e-5; the adaptive budget that answered fwe's hard 16K prompt in session 15), on the CPU.
set -u
cd "$(dirname "$0")/../../.." || exit 1
D=bench/results/ruler_qwen2.5_1.5b_cpu_mk3
build/bin/topkv eval ruler -m .models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --backend cpu --chat --lengths 8K \
  --tasks niah_multikey_3 --samples 2 --seed 3 --answer-tokens 48 --agreement-tokens 32 --error-steps 0 \
  --kv-type f16 --methods-index multipole:rerank_far=1 --methods-k 2% --threshold 3e-5 -q \
  --json $D/t3e-5.json --csv $D/t3e-5.csv > $D/t3e-5.txt 2> $D/t3e-5.err
