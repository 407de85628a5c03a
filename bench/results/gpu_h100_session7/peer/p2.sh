#!/usr/bin/env bash
# Peer session, call 2: topkv on the Llama-3-8B geometry (Q4_K), then the table.
set -uo pipefail
W=/tmp/s; R=$W/out; source $W/bundle/env.sh
L=$W/m/llama3-8b-q4_k.gguf
T="topkv bench decode -m $L --backend cuda --warmup 4 -q --no-plot"
timeout 100 $T --steps 32 --contexts 0,32K,128K --modes dense --out-dir $R/l-dense > $R/l-dense.txt 2>&1
timeout 60 $T --steps 32 --contexts 128K --modes dense --gpu-mem-budget 24G --out-dir $R/l-dense24 > $R/l-dense24.txt 2>&1
timeout 280 $T --steps 32 --contexts 32K,128K --modes topk --index quest --k 256 --gpu-mem-budget 24G --out-dir $R/l-topk > $R/l-topk.txt 2>&1
timeout 60 $T --steps 4 --contexts 4K,32K --modes dense --fill prefill --chunk 4096 --out-dir $R/l-prefill > $R/l-prefill.txt 2>&1
python3 bench/peers/compare.py --llama $R/llama-g --llama $R/llama-l --topkv $R/g-dense --topkv $R/g-topk \
  --topkv $R/g-prefill --topkv $R/l-dense --topkv $R/l-dense24 --topkv $R/l-topk --topkv $R/l-prefill --out $R/peer > $R/peer.txt 2>&1
tar czf $OUT/p2.tgz -C $W out
for f in l-dense l-dense24 l-topk l-prefill; do grep -E "^ +[0-9]+ (dense|topk)|rror" $R/$f.txt; done
tail -40 $R/peer.txt
