#!/usr/bin/env bash
# Session 19, call F: `topkv index build` (the host runtime: its stores are heap memory, so a
# ring's past goes up from pageable memory) of the Llama-8B geometry (Q4_K, synthetic weights),
# a real prefill of ~161K tokens under 24G, quest two-level, f8 store: --prefill-kv host (rings)
# against host-copy. Logs in $OUT.
set -u
R=$PWD
mkdir -p /tmp/q && cd /tmp/q && rm -rf b19e && tar -xJf "$R/.gpu/b19e.tar.xz" && source /tmp/q/b19e/env.sh
t0=$(date +%s)
[ -f /tmp/m/l8.gguf ] || { mkdir -p /tmp/m; topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o /tmp/m/l8.gguf -q; }
python3 "$R/bench/results/gpu_session19/words.py" ${WORDS:-161150} > /tmp/m/prompt.txt
echo "synth+prompt $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"
for m in ${MODES:-host host-copy}; do
  t=$(date +%s)
  /usr/bin/time -v topkv index build -m /tmp/m/l8.gguf -f /tmp/m/prompt.txt -o /tmp/m/p.pack -q \
    --index quest:page=16,coarse_ratio=16 --gpu-mem-budget 24G --store-type f8 --chunk 8192 --kv-type f16 \
    --prefill-kv $m --json "$OUT/index-$m.json" > "$OUT/index-$m.txt" 2> "$OUT/index-$m.err"
  echo "index build --prefill-kv $m rc $? wall $(( $(date +%s) - t )) s" >> "$OUT/times.txt"
  rm -f /tmp/m/p.pack
done
cat "$OUT/times.txt"
for f in "$OUT"/*.err; do echo "== $f"; grep -E 'topkv:|Maximum resident|Elapsed' "$f" | tail -6; done
