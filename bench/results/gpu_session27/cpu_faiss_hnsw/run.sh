#!/usr/bin/env bash
# faiss-hnsw at 16K and 32K on the grid's prompts that tell the backends apart (session 10's
# niah_multivalue, vt, fwe; --samples 1, seed 1), on the CPU backend of the 2-core dev machine:
# the GPU host's device time went to the suite of record. Dense runs in each job, so each ratio
# is against the CPU's own dense on the same prompts.
set -euo pipefail
cd "$(dirname "$0")"
M=../../../../.models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
for L in 16K 32K; do
  /usr/bin/time -v nice -n 10 ../../../../build/bin/topkv eval ruler -m "$M" --backend cpu --chat --answer-tokens 48 \
    --agreement-tokens 64 --chunk 4096 --kv-type f16 --threads 2 --lengths "$L" --tasks niah_multivalue,vt,fwe \
    --samples 1 --error-steps 0 --methods-index faiss-hnsw --methods-k 1%,2%,5% \
    --csv "g${L}.csv" --json "g${L}.json" -q > "g${L}.txt" 2> "g${L}.err"
done
