#!/usr/bin/env bash
# Call 2: GPU tests (store cache), memcheck with first reports, 8B quest k=256 under 24G at 32K/128K with the
# store cache (auto) beside llama.cpp at 128K on the same file.
set -uo pipefail
S0=$(date +%s); W=/tmp/s; mkdir -p $W/out $W/m; R=$W/out
[ -d $W/bundle ] || tar -xJf .gpu/bundle.tar.xz -C $W
[ -d $W/llama ] || { mkdir -p $W/llama && tar -xJf .gpu/llama-bench.tar.xz -C $W/llama; }
source $W/bundle/env.sh; export BUNDLE=$W/bundle
L=$W/m/llama3-8b-q4_k.gguf
( [ -s $L ] || topkv model synth --preset llama3-8b --type q4_k --context 1048640 -q -o $L ) > $R/synth.txt 2>&1 &
SP=$!
GPU_CHECK_BENCH=0 OUT=$R/check timeout 150 scripts/gpu-check.sh > $R/check.txt 2>&1; echo "gpu-check rc=$?" >> $R/check.txt
wait $SP; echo "t=$(( $(date +%s) - S0 )) tests+synth done" >> $R/time.txt
T="topkv bench decode -m $L --backend cuda -q --no-plot --warmup 4 --steps 32"
timeout 200 $T --contexts 32K,128K --modes topk --index quest --k 256 --gpu-mem-budget 24G --out-dir $R/l-topk > $R/l-topk.txt 2>&1
echo "t=$(( $(date +%s) - S0 )) topk done" >> $R/time.txt
timeout 130 bench/peers/llama_cpp.sh run -m $L --bin $W/llama/bundle/bin/llama-bench --contexts 128K --prefill none --reps 1 \
  --timeout 120 --out $R/llama-l > $R/llama-l.txt 2>&1
echo "t=$(( $(date +%s) - S0 )) llama done" >> $R/time.txt
left=$(( 560 - ($(date +%s) - S0) ))
[ $left -gt 40 ] && GPU_CHECK_TESTS=0 GPU_CHECK_BENCH=0 GPU_CHECK_SANITIZE=1 GPU_CHECK_SANITIZE_TOOLS=memcheck \
  GPU_CHECK_SANITIZE_TIMEOUT=40 OUT=$R/san timeout $left scripts/gpu-check.sh > $R/san.txt 2>&1
tar czf $OUT/d2.tgz -C $W out
cat $R/time.txt; sed -n '/gpu-check summary/,$p' $R/check.txt | grep -v " ok$" | tail -22
grep -E "^ +[0-9]+ topk|rror" $R/l-topk.txt; tail -4 $R/llama-l.txt; cut -d, -f1,4,5,6,7,8 $R/llama-l/runs.csv 2>/dev/null
cat $R/san/results.txt 2>/dev/null
for f in $R/san/*.log; do grep -m2 -A3 -E "Invalid|Error:|out of bounds" $f | head -8; done 2>/dev/null | head -40
