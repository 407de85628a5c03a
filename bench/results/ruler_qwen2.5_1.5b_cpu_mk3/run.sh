#!/usr/bin/env bash
# Session 22: the niah_multikey_3 prompt at 8K the default loses on the GPU host (seed 3, sample 1;
# ../gpu_session21/: top-k writes 56dd8c5a-fff7-4780-... for ...-4805-...), on the CPU backend:
# does it fail here too, does exact top-k (flat) at 2% answer it, how much k does it take, and
# which layers' attention error and oracle top-k mass stand out (--error-steps 16).
set -u
cd "$(dirname "$0")/../../.." || exit 1
D=bench/results/ruler_qwen2.5_1.5b_cpu_mk3
build/bin/topkv eval ruler -m .models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --backend cpu --chat --lengths 8K \
  --tasks niah_multikey_3 --samples 2 --seed 3 --answer-tokens 48 --agreement-tokens 32 --error-steps 16 \
  --kv-type f16 --methods-index multipole:rerank_far=1,flat --methods-k 2%,5%,10% -q \
  --save-prompts $D/prompts.jsonl --json $D/mk3.json --csv $D/mk3.csv > $D/mk3.txt 2> $D/mk3.err
