#!/usr/bin/env bash
# The default (multipole) on indexes clustered as --build-on gpu clusters them (--build-on lloyd:
# LloydKMeans, the GPU engine's twin, whose labels the device's equal) against Faiss's (--build-on
# host), on the same prompts: Qwen2.5-Coder-0.5B on the CPU, one run after the other.
#   builds_ab.sh DIR EVAL_OPTIONS...   writes DIR/{lloyd,host}.{json,csv,txt,err} and DIR/times.txt
set -u
[ $# -ge 1 ] || { echo "usage: $0 DIR EVAL_OPTIONS..." >&2; exit 2; }
D=$1; shift
cd "$(dirname "$0")/../../.." || exit 1
for b in lloyd host; do
  start=$(date +%s)
  build/bin/topkv eval ruler -m .models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --backend cpu --chat \
    --methods-index multipole --build-on $b "$@" --json "$D/$b.json" --csv "$D/$b.csv" -q \
    > "$D/$b.txt" 2> "$D/$b.err"
  echo "$b rc $? $(( $(date +%s) - start )) s" >> "$D/times.txt"
done
