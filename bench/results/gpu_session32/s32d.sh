# Session 32, fourth call: generate after a real ~131K prefill of the Llama-8B geometry (quest
# two-level, q8_0, --build-on auto), this build (ebdc64d: tables staged with the heads in parallel)
# against 4f0c60a (one thread a layer), alternating on one machine: the seconds between the last
# chunk and the first token.
source scripts/gpu-hold.sh
xz -dc .gpu/old/topkv-4f0c60a.xz > /tmp/b/bundle/bin/topkv-old && chmod +x /tmp/b/bundle/bin/topkv-old
[ -f $L8 ] || { synth_l8; step "synth rc=$?"; }
[ -f /tmp/b/p131k.txt ] || python3 .gpu/words.py 131000 > /tmp/b/p131k.txt
for b in topkv-old topkv topkv-old topkv; do
  n=gen-$b-$(date +%s)
  timeout 150 $b generate -m $L8 -f /tmp/b/p131k.txt -n 16 -c 140000 --attn topk \
    --index quest:page=16,coarse_ratio=16 --k 256 --gpu-mem-budget 24G --store-type q8_0 --chunk 8192 \
    --ignore-eos --build-on auto --json $O/$n.json > $O/$n.txt 2> $O/$n.err
  step "$n rc=$? $(grep -oE 'keys indexed in [0-9.]+ s|first token after [0-9.]+ s' $O/$n.err | tr '\n' ' ')"
done
