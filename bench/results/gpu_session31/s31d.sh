# Session 31, second hold: the one-level gather in two launches (mark with each tile's rows, write with
# the prefix of the earlier tiles: no block walks a KV head's groups). GPU tests against the CPU twin
# (the search's new capped cases, the row-list kernel's page layouts); `bench gpu-ops --only search`
# with this build and with the build before (topkv-old = 299f41d, the same machine); Gemma 3 270M
# geometry, quest k = 1024 (one level) at 128K / 512K / 1M, alternating builds.
source scripts/gpu-hold.sh
for tl in gpu_test_gpu_search:120 gpu_test_gpu_offload:60; do
  t=${tl%:*}; timeout ${tl#*:} $t > $O/test-$t.log 2>&1; rc=$?
  step "$t rc=$rc $(grep -E 'test cases' $O/test-$t.log | tail -1)"
done
grep -h "SUMMARY" $O/test-*.log
for b in topkv topkv-old; do
  timeout 80 $b bench gpu-ops --only search --reps 30 --out $O/search-$b.jsonl > $O/search-$b.txt 2>&1
  step "search $b rc=$?"
done
grep -h "gather alone\|cut alone" $O/search-topkv.txt $O/search-topkv-old.txt | sed 's/BENCH search *//'
G=/tmp/b/g270m.gguf
ls $G 2>/dev/null || topkv model synth --preset gemma3-270m --type q8_0 --context 1048640 -o $G -q; step "synth g rc=$?"
for b in topkv topkv-old topkv topkv-old; do
  n=g-$b-$(date +%s)  # renamed after the call: g-new-1, g-old-1, g-new-2, g-old-2 in run order
  timeout 150 $b bench decode --backend cuda --warmup 4 -q --no-plot -m $G --steps 32 --contexts 128K,512K,1M \
    --modes topk --index quest --k 1024 --out-dir "$O/$n" > "$O/$n.txt" 2>&1
  step "$n rc=$? $(grep -E '^ +1048576' $O/$n.txt)"
done
