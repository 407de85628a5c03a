#!/usr/bin/env bash
# The store type per layer on the real Qwen2.5-Coder-0.5B, CPU, one binary, the runs back to back
# (session 33): f16, q8_0 everywhere, and q8_0 with the layers whose keys hold outlier dimensions
# in f16 (0 and 8: bench/results/store_topk_error_qwen_cpu/), as session 20's store_q8_qwen0.5b_cpu
# ran f16 / f8 / q8_0 (its multipole:rerank=4 row is the default's, so one method here).
set -euo pipefail
cd "$(dirname "$0")"
ROOT=../../..
run() {  # name, store options
  local name=$1; shift
  $ROOT/build/bin/topkv eval ruler -m $ROOT/.models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --backend cpu --chat \
    --tasks niah_single_1,niah_multikey_2,niah_multivalue,vt,fwe --lengths 4K,8K --samples 1 \
    --answer-tokens 48 --agreement-tokens 64 --error-steps 4 \
    --methods-index multipole --methods-k 2% --chunk 512 \
    "$@" --csv store_$name.csv --json store_$name.json -q
}
run f16 --store-type f16
run q8_0 --store-type q8_0
run q8_0-l0l8f16 --store-type q8_0 --store-type-at 0=f16,8=f16
python3 ../store_q8_qwen0.5b_cpu/compare.py f16 q8_0 q8_0-l0l8f16 > compare.md  # reads store_<type>.csv here
