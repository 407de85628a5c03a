#!/usr/bin/env bash
# Session 19, call A: the prefill rings on the GPU. gpu_test_cuda_streamed (the ring case: CUDA
# ring = full host caches bit for bit, f8 store close, CPU backend's ring within tolerance), then
# the Llama-8B geometry (Q4_K, synthetic weights) prefilled for real at 256K under 24G with
# --prefill-kv host (rings: the past from the f8 store) against host-copy (the full pinned copy),
# the index built during the prefill, 16 tokens decoded. Host RSS sampled every 2 s. Logs in $OUT.
set -u
R=$PWD
mkdir -p /tmp/q && cd /tmp/q && rm -rf b19 && tar -xJf "$R/.gpu/b19.tar.xz" && source /tmp/q/b19/env.sh
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g; } > "$OUT/gpu.txt"
gpu_test_cuda_streamed > "$OUT/test_streamed.txt" 2>&1; echo "test rc $?" >> "$OUT/times.txt"
grep -E 'SUMMARY|passed|failed' "$OUT/test_streamed.txt"
t0=$(date +%s)
[ -f /tmp/m/l8.gguf ] || { mkdir -p /tmp/m; topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o /tmp/m/l8.gguf -q; }
python3 "$R/bench/results/gpu_session19/words.py" ${WORDS:-161150} > /tmp/m/prompt.txt
echo "synth+prompt $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"
run() {  # name, --prefill-kv value
  local t=$(date +%s)
  /usr/bin/time -v topkv generate -m /tmp/m/l8.gguf -f /tmp/m/prompt.txt -n 16 -c ${CTX:-270000} \
    --attn topk --index quest:page=16,coarse_ratio=16 --k 256 --gpu-mem-budget 24G --store-type f8 \
    --chunk 8192 --kv-type f16 --ignore-eos --prefill-kv $2 --json "$OUT/$1.json" > "$OUT/$1.txt" 2> "$OUT/$1.err" &
  local pid=$!
  while kill -0 $pid 2>/dev/null; do
    p=$(pgrep -n -x topkv); [ -n "$p" ] && echo "$(( $(date +%s) - t )) $(grep -E 'VmRSS' /proc/$p/status 2>/dev/null | tr -s ' ')" >> "$OUT/$1.rss"
    sleep 2
  done
  wait $pid; echo "$1 rc $? wall $(( $(date +%s) - t )) s" >> "$OUT/times.txt"
}
for m in ${MODES:-host host-copy}; do run "$(echo ${TAG:-c161k}-$m)" $m; done
cat "$OUT/times.txt"
for f in "$OUT"/*.err; do echo "== $f"; grep -E 'topkv:|Maximum resident|Elapsed' "$f" | grep -v '^\s*$' | tail -12; done
