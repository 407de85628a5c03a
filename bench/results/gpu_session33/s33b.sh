# Session 33, second call: the 512K real-prefill timeline on the current build (issue 15): the
# Llama-8B geometry prefilled for real over 524,000 words (session 19's prompt), q8_0 store with
# layer 0 in f16, two-level quest k = 256, 24G, prefill rings (the past from the store), the index
# built during the prefill (quest's bounds on the device, --build-on auto), 16 tokens decoded.
# Host RSS sampled every 2 s.
source scripts/gpu-hold.sh
[ -f $L8 ] || { synth_l8; step "synth rc=$?"; }
python3 .gpu/words.py 524000 > /tmp/b/p512k.txt; step "prompt $(wc -c < /tmp/b/p512k.txt) bytes"
t=$(date +%s)
/usr/bin/time -v timeout 570 topkv generate -m $L8 -f /tmp/b/p512k.txt -n 16 -c 524352 --attn topk \
  --index quest:page=16,coarse_ratio=16 --k 256 --gpu-mem-budget 24G --store-type q8_0 --store-type-at 0=f16 \
  --chunk 8192 --kv-type f16 --ignore-eos --build-on auto --json $O/gen512.json > $O/gen512.txt 2> $O/gen512.err &
pid=$!
while kill -0 $pid 2>/dev/null; do
  p=$(pgrep -n -x topkv); [ -n "$p" ] && echo "$(( $(date +%s) - t )) $(grep VmRSS /proc/$p/status 2>/dev/null | tr -s ' ')" >> $O/gen512.rss
  sleep 2
done
wait $pid; step "generate 512K rc=$? wall $(( $(date +%s) - t )) s $(grep -E 'Maximum resident' $O/gen512.err | tr -s ' ')"
grep -E "keys indexed|first token|after the last|readying" $O/gen512.err | tail -5
