#!/usr/bin/env bash
# faiss-hnsw at 32K on the grid's other five prompts (vt, fwe, niah_single_1, niah_single_3,
# niah_multikey_2; --samples 1, seed 1), one job a prompt so a stopped run keeps what finished, on the
# CPU backend of the 2-core dev machine: the fallback while no GPU host can be started (session 29).
# Session 27 ran niah_multivalue (../../gpu_session27/cpu_faiss_hnsw/g32K.*). Dense runs in each job, so
# each ratio is against the CPU's own dense on the same prompt.
set -uo pipefail
cd "$(dirname "$0")"
R=${REPO:-../../../..}
M=$R/.models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
for t in ${TASKS:-vt fwe niah_single_1 niah_single_3 niah_multikey_2}; do
  /usr/bin/time -v nice -n 10 "${TOPKV:-$R/build/bin/topkv}" eval ruler -m "$M" --backend cpu --chat --answer-tokens 48 \
    --agreement-tokens 64 --chunk 4096 --kv-type f16 --threads 2 --lengths 32K --tasks "$t" --samples 1 \
    --error-steps 0 --methods-index faiss-hnsw --methods-k 1%,2%,5% --csv "g32K-$t.csv" --json "g32K-$t.json" \
    -q > "g32K-$t.txt" 2> "g32K-$t.err"
  echo "$t rc=$? $(date -u +%H:%M)" >> run.log
done
