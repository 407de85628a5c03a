#!/usr/bin/env bash
# Session 19, call E: the default k-means place (--build-on auto: the GPU engine for multipole on the
# CUDA runtime) against --build-on host (Faiss on the 16 cores), `generate` with the build overlapped
# with a real prefill of the Llama-8B geometry (Q4_K, synthetic weights) at ~131K tokens under 24G,
# multipole at k = 2%, 16 tokens decoded. Logs in $OUT.
set -u
R=$PWD
mkdir -p /tmp/q && cd /tmp/q && rm -rf b19e && tar -xJf "$R/.gpu/b19e.tar.xz" && source /tmp/q/b19e/env.sh
t0=$(date +%s)
[ -f /tmp/m/l8.gguf ] || { mkdir -p /tmp/m; topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o /tmp/m/l8.gguf -q; }
python3 "$R/bench/results/gpu_session19/words.py" ${WORDS:-131000} > /tmp/m/p131k.txt
echo "synth+prompt $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"
for b in ${MODES:-auto host}; do
  t=$(date +%s)
  /usr/bin/time -v topkv generate -m /tmp/m/l8.gguf -f /tmp/m/p131k.txt -n 16 -c 140000 --attn topk \
    --index multipole --k-fraction 0.02 --gpu-mem-budget 24G --chunk 8192 --kv-type f16 --ignore-eos \
    --build-on $b --json "$OUT/build-$b.json" > "$OUT/build-$b.txt" 2> "$OUT/build-$b.err"
  echo "build-on $b rc $? wall $(( $(date +%s) - t )) s" >> "$OUT/times.txt"
done
cat "$OUT/times.txt"
for f in "$OUT"/*.err; do echo "== $f"; grep -E 'topkv:|Maximum resident|Elapsed' "$f" | tail -9; done
