#!/usr/bin/env bash
# Session 30: the synthetic fill before and after the staging buffers are kept from layer to layer
# (OffloadRuntime::take_context) and the generator's copy runs on every core (synthetic_key_values).
# The 8B attention geometry, 4 layers, 256K tokens, q8_0 store, CPU backend of this 2-core machine,
# each build twice, alternating. OLD: a build before the change (4ffbd1c here).
set -euo pipefail
B=${B:-build/bin/topkv}; OLD=${OLD:?a topkv built before the change}
O=bench/results/fill_staging_cpu
[ -f /tmp/l4.gguf ] && [ -n "${KEEP_MODEL:-}" ] || $B model synth -o /tmp/l4.gguf --layers 4 --width 1024 --heads 32 --kv-heads 8 --head-dim 128 --ffn 1024 \
  --type q4_k --context 1048640 --rope-base 500000 -q --force
for run in ${RUNS:-1 2}; do
  for which in old new; do
    bin=$B; [ $which = old ] && bin=$OLD
    $bin bench decode -m /tmp/l4.gguf --backend cpu --warmup 1 --steps 2 -q --no-plot --contexts 256K \
      --modes topk --index quest:page=16,coarse_ratio=16 --k 256 --store-type q8_0 --out-dir $O/$which-$run > /dev/null
    python3 -c "import json;r=json.load(open('$O/$which-$run/decode.json'))['results'][0];print('$which run $run', 'fill_s %.2f read_s %.2f peak_rss %.2f GiB' % (r['fill_s'], r['read_s'], r['memory']['peak_rss_bytes']/2**30))"
  done
done | tee -a $O/summary.txt
