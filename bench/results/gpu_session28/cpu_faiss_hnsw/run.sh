#!/usr/bin/env bash
# faiss-hnsw at 16K on the grid's other three prompts (niah_single_1, niah_single_3, niah_multikey_2;
# --samples 1, seed 1), on the CPU backend of the 2-core dev machine; session 27 ran the first three
# (../../gpu_session27/cpu_faiss_hnsw/). Dense runs in the job, so each ratio is against the CPU's own
# dense on the same prompts.
set -euo pipefail
cd "$(dirname "$0")"
R=${REPO:-../../../..}
M=$R/.models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
/usr/bin/time -v nice -n 10 "$R/build/bin/topkv" eval ruler -m "$M" --backend cpu --chat --answer-tokens 48 \
  --agreement-tokens 64 --chunk 4096 --kv-type f16 --threads 2 --lengths 16K \
  --tasks niah_single_1,niah_single_3,niah_multikey_2 --samples 1 --error-steps 0 --methods-index faiss-hnsw \
  --methods-k 1%,2%,5% --csv g16K-b.csv --json g16K-b.json -q > g16K-b.txt 2> g16K-b.err
