#!/usr/bin/env bash
# Session 19: the fidelity suite on indexes clustered as --build-on gpu clusters them (LloydKMeans,
# the GPU engine's twin, whose labels the device's equal: --build-on lloyd) against Faiss's
# (--build-on host), Qwen2.5-Coder-0.5B on the CPU, all 11 tasks x 2 samples at 2K and 4K, the
# default multipole at k = 2%. Same prompts, one run after the other.
set -u
cd "$(dirname "$0")/../../../.." || exit 1
D=bench/results/ruler_qwen2.5_0.5b_cpu/build_on_lloyd
for b in lloyd host; do
  start=$(date +%s)
  build/bin/topkv eval ruler -m .models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --backend cpu --chat \
    --lengths 2K,4K --samples 2 --answer-tokens 48 --agreement-tokens 32 --error-steps 8 \
    --methods-index multipole --methods-k 2% --build-on $b --json $D/$b.json --csv $D/$b.csv -q \
    > $D/$b.txt 2> $D/$b.err
  echo "$b rc $? $(( $(date +%s) - start )) s" >> $D/times.txt
done
