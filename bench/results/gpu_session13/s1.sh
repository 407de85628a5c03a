#!/usr/bin/env bash
# Session 13, call 1 (one GPU): the device-search tests (two-level quest
# included), the search kernels at 512K/1M, and the Llama-8B geometry at 512K
# under 24G with the two-level quest (f8 store). Logs under $OUT.
set -u
R=$PWD
cd /tmp && rm -rf bundle && tar -xJf "$R/.gpu/bundle.tar.xz"
source /tmp/bundle/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
[ "${TESTS:-1}" = 1 ] && ( time timeout 240 gpu_test_gpu_search ) > "$OUT/test_gpu_search.txt" 2>&1
[ "${TESTS:-1}" = 1 ] && tail -5 "$OUT/test_gpu_search.txt" && ( time timeout 200 gpu_test_gpu_offload ) > "$OUT/test_gpu_offload.txt" 2>&1; [ "${TESTS:-1}" = 1 ] && tail -3 "$OUT/test_gpu_offload.txt"
[ "${TESTS:-1}" = 1 ] && timeout 150 topkv bench gpu-ops --only search --out "$OUT/search.jsonl" > "$OUT/search.txt" 2>&1
[ "${TESTS:-1}" = 1 ] && grep -E "quest|device" "$OUT/search.txt"
[ -f /tmp/l8.gguf ] || topkv model synth --preset llama3-8b --type q4_k -o /tmp/l8.gguf > "$OUT/synth.txt" 2>&1
for spec in ${SPECS:-quest:page=16,coarse_ratio=16}; do
  tag=$(echo "$spec" | tr ':,=' '___')
  ( time timeout ${DEC_TIMEOUT:-330} topkv bench decode -m /tmp/l8.gguf --contexts ${CTX:-512K} --modes topk --index "$spec" --k 256 --beyond-trained \
      --gpu-mem-budget 24G --store-type f8 --steps 32 --warmup 4 --out-dir "$OUT/dec_$tag" ) > "$OUT/dec_$tag.txt" 2>&1
  grep -A2 " context" "$OUT/dec_$tag.txt"; tail -3 "$OUT/dec_$tag.txt"
done
