#!/usr/bin/env bash
# Gemma-3-270M geometry (Q8_0) at 1M beside llama.cpp, same call: llama.cpp's 1M fill first, then topkv dense + quest.
set -uo pipefail
S0=$(date +%s); W=/tmp/s; mkdir -p $W/out $W/m; R=$W/out
tar -xJf .gpu/bundle.tar.xz -C $W || exit 1
mkdir -p $W/llama && tar -xJf .gpu/llama-bench.tar.xz -C $W/llama
source $W/bundle/env.sh
G=$W/m/gemma3-270m-q8_0.gguf
topkv model synth --preset gemma3-270m --type q8_0 --context 1048640 -q -o $G
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/machine.txt
timeout 245 bench/peers/llama_cpp.sh run -m $G --bin $W/llama/bundle/bin/llama-bench --contexts 1M --prefill none --reps 1 \
  --timeout 240 --decode-ubatch 4096 --out $R/llama-g1m > $R/llama-g1m.txt 2>&1
echo "t=$(( $(date +%s) - S0 )) llama" >> $R/time.txt
timeout 75 topkv bench decode -m $G --backend cuda -q --no-plot --warmup 4 --steps 32 --contexts 1M --modes dense,topk \
  --index quest --k 1024 --out-dir $R/g1m > $R/g1m.txt 2>&1
echo "t=$(( $(date +%s) - S0 )) topkv" >> $R/time.txt
tar czf $OUT/g1m.tgz -C $W out
cat $R/time.txt; tail -3 $R/llama-g1m.txt; cut -d, -f1,2,3,4,5,6 $R/llama-g1m/runs.csv; grep -E "^ +[0-9]+ (dense|topk)|rror" $R/g1m.txt
