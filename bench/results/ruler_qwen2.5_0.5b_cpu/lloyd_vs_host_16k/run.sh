#!/usr/bin/env bash
# Session 26: the default as the GPU builds it (--build-on lloyd: the device engine's twin, whose
# labels the device's equal) against Faiss's (--build-on host) on the same prompts: Qwen2.5-Coder-0.5B
# on the CPU, vt (the task of the 1.5B grid's 16K near tie) x 3 samples at 16K, multipole at 2%.
set -u
cd "$(dirname "$0")/../../../.." || exit 1
D=bench/results/ruler_qwen2.5_0.5b_cpu/lloyd_vs_host_16k
for b in lloyd host; do
  start=$(date +%s)
  build/bin/topkv eval ruler -m .models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --backend cpu --chat \
    --lengths 16K --tasks vt --samples 3 --answer-tokens 48 --agreement-tokens 32 --error-steps 4 \
    --methods-index multipole --methods-k 2% --build-on $b --json $D/$b.json --csv $D/$b.csv -q \
    > $D/$b.txt 2> $D/$b.err
  echo "$b rc $? $(( $(date +%s) - start )) s" >> $D/times.txt
done
