#!/usr/bin/env bash
# The 8-bit stores against f16 on the real Qwen2.5-Coder-0.5B, CPU, one binary, one run each.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=../../..
for st in f16 f8 q8_0; do
  $ROOT/build/bin/topkv eval ruler -m $ROOT/.models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --backend cpu --chat \
    --tasks niah_single_1,niah_multikey_2,niah_multivalue,vt,fwe --lengths 4K,8K --samples 1 \
    --answer-tokens 48 --agreement-tokens 64 --error-steps 4 \
    --methods-index multipole,multipole:rerank=4 --methods-k 2% --chunk 512 \
    --store-type $st --csv store_$st.csv --json store_$st.json -q
done
python3 compare.py f16 f8 q8_0 > compare.md
