#!/usr/bin/env bash
# Session 33: the synthetic fill with each layer read in pieces of 64K positions (take_context,
# kContextPiece) on the same command as session 30's bench/results/fill_staging_cpu/ (the 8B
# attention geometry, 4 layers, 256K tokens, q8_0 store, CPU backend of this 2-core machine), twice,
# then 1M once: fill_s, read_s and peak RSS against the whole-layer staging of fill_staging_cpu.
set -euo pipefail
B=${B:-build/bin/topkv}
O=bench/results/fill_pieces_cpu
[ -f /tmp/l4.gguf ] && [ -n "${KEEP_MODEL:-}" ] || $B model synth -o /tmp/l4.gguf --layers 4 --width 1024 --heads 32 --kv-heads 8 --head-dim 128 --ffn 1024 \
  --type q4_k --context 1048640 --rope-base 500000 -q --force
for ctx in 256K 256K 1M; do
  d=$O/out-$ctx-$(date +%s)
  $B bench decode -m /tmp/l4.gguf --backend cpu --warmup 1 --steps 2 -q --no-plot --contexts $ctx \
    --modes topk --index quest:page=16,coarse_ratio=16 --k 256 --store-type q8_0 --out-dir $d > /dev/null
  python3 -c "import json;r=json.load(open('$d/decode.json'))['results'][0];m=r['memory'];print('$ctx', 'fill_s %.2f read_s %.2f host store %.2f GiB peak_rss %.2f GiB' % (r['fill_s'], r['read_s'], m['kv_host_bytes']/2**30, m['peak_rss_bytes']/2**30))"
done | tee -a $O/summary.txt
