#!/usr/bin/env bash
# Session 18: multipole indexes clustered by Faiss (the host build) and by LloydKMeans (the
# --build-on gpu engine's twin, whose labels the GPU's equal) on real keys: Qwen2.5-Coder-0.5B,
# 8,192 tokens of this repository's C++ sources, every layer and KV head, k = 1% / 2% / 5%.
#   ls src/*/*.cpp index/*.cpp offload/*.cpp gpu/*.cpp | head -200 | xargs cat > /tmp/long.txt
#   topkv kv dump -m .models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf -f /tmp/long.txt --max-tokens 8192 \
#     --layers 0,...,23 --queries 32 --chunk 1024 -o /tmp/q05_8k.safetensors
set -u
cd "$(dirname "$0")/../../.." || exit 1
D=bench/results/kmeans_lloyd_vs_faiss_qwen05
mkdir -p $D/csv
for L in $(seq 0 23); do
  for H in 0 1; do
    for E in faiss lloyd; do
      build/bin/topkv bench recall --dump /tmp/q05_8k.safetensors --skip-keys 4 --layer $L --head $H \
        --index multipole --sweep k=82,164,410 --kmeans $E --threads 2 --quiet --csv $D/csv/l${L}_h${H}_$E.csv > /dev/null
    done
  done
done
