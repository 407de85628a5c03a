#!/usr/bin/env bash
# Session 25: the synthetic fill of the Llama-3-8B attention geometry (4 layers, 8 KV heads of 128),
# 64K tokens, q8_0 store, on the CPU backend of this 2-core machine; read_s splits it.
set -euo pipefail
B=${B:-build/bin/topkv}
$B model synth -o /tmp/l4.gguf --layers 4 --width 1024 --heads 32 --kv-heads 8 --head-dim 128 --ffn 1024 \
  --type q4_k --context 1048640 --rope-base 500000 -q --force
$B bench decode -m /tmp/l4.gguf --backend cpu --warmup 1 --steps 2 -q --no-plot --contexts 64K --modes topk \
  --index quest:page=16,coarse_ratio=16 --k 256 --store-type q8_0 --out-dir bench/results/fill_split_cpu/out
