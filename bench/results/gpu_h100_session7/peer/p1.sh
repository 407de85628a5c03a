#!/usr/bin/env bash
# Peer session, call 1: setup, llama.cpp on both files, topkv on the Gemma-3-270M geometry (Q8_0).
set -uo pipefail
W=/tmp/s; mkdir -p $W/out $W/m; R=$W/out
[ -d $W/bundle ] || tar -xJf .gpu/bundle.tar.xz -C $W
[ -d $W/llama ] || { mkdir -p $W/llama && tar -xJf .gpu/llama-bench.tar.xz -C $W/llama; }
source $W/bundle/env.sh
LB=$W/llama/bundle/bin/llama-bench
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/machine.txt; nproc >> $R/machine.txt
G=$W/m/gemma3-270m-q8_0.gguf; L=$W/m/llama3-8b-q4_k.gguf
[ -s $G ] || topkv model synth --preset gemma3-270m --type q8_0 --context 1048640 -q -o $G &
[ -s $L ] || topkv model synth --preset llama3-8b --type q4_k --context 1048640 -q -o $L &
wait; ls -la $W/m > $R/models.txt; date +%s > $R/t0
P=bench/peers/llama_cpp.sh
timeout 100 $P run -m $L --bin $LB --contexts 0,32K --prefill 4K,32K --timeout 60 --out $R/llama-l > $R/llama-l.txt 2>&1
timeout 120 $P run -m $L --bin $LB --contexts 128K --prefill none --reps 1 --timeout 110 --out $R/llama-l > $R/llama-l2.txt 2>&1
timeout 30 $P run -m $G --bin $LB --contexts 0,4K,32K,128K --prefill 4K,32K --timeout 25 --out $R/llama-g > $R/llama-g.txt 2>&1
timeout 150 $P run -m $G --bin $LB --contexts 512K,1M --prefill none --reps 1 --timeout 140 --decode-ubatch 4096 --keep-going --out $R/llama-g > $R/llama-g2.txt 2>&1
T="topkv bench decode -m $G --backend cuda --warmup 4 -q --no-plot"
timeout 90 $T --steps 32 --contexts 0,4K,32K,128K,512K,1M --modes dense --out-dir $R/g-dense > $R/g-dense.txt 2>&1
timeout 150 $T --steps 32 --contexts 32K,128K,512K,1M --modes topk --index quest --k 1024 --out-dir $R/g-topk > $R/g-topk.txt 2>&1
timeout 40 $T --steps 4 --contexts 4K,32K --modes dense --fill prefill --chunk 4096 --out-dir $R/g-prefill > $R/g-prefill.txt 2>&1
tar czf $OUT/p1.tgz -C $W out
for f in g-dense g-topk g-prefill; do grep -E "^ +[0-9]+ (dense|topk)|rror" $R/$f.txt; done
cut -d, -f1,4,5,6,7,8 $R/llama-l/runs.csv $R/llama-g/runs.csv; tail -2 $R/llama-g2.txt
