#!/usr/bin/env bash
# q8_0 against f16 on the real Qwen2.5-Coder-1.5B (head_dim 128, GQA 6:1), CPU, 4K, one binary, back to back.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=../../..
for st in f16 q8_0; do
  $ROOT/build/bin/topkv eval ruler -m $ROOT/.models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --backend cpu --chat \
    --tasks niah_single_1,niah_multikey_2,niah_multivalue,vt,fwe --lengths 4K --samples 1 \
    --answer-tokens 48 --agreement-tokens 64 --error-steps 4 \
    --methods-index multipole --methods-k 2% --chunk 512 \
    --store-type $st --csv store_$st.csv --json store_$st.json -q
done
python3 ../store_q8_qwen0.5b_cpu/compare.py f16 q8_0 > compare.md
