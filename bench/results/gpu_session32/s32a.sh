# Session 32, first call: quest's page bounds on the device (gpu/gpu_page_bounds.h; --build-on auto
# now hands quest the engine). GPU tests against the CPU twins (the engine's own test, the runtime
# tests, whose quest indexes now bound on the device); `bench gpu-ops --only bounds`; the Llama-8B
# geometry prefilled for real at ~131K with quest two-level, q8_0 store, the build streamed during
# the prefill: --build-on auto (device bounds) against host; then `bench decode` 512K q8_0,
# --build-on auto, programmatic launch on.
source scripts/gpu-hold.sh
gpu_tests gpu_test_gpu_page_bounds gpu_test_gpu_search gpu_test_gpu_offload gpu_test_gpu_table_budget \
  gpu_test_gpu_kmeans gpu_test_cuda_model gpu_test_cuda_streamed
timeout 90 topkv bench gpu-ops --only bounds --reps 20 --out $O/bounds.jsonl > $O/bounds.txt 2>&1; step "bounds rc=$?"
grep "BENCH bounds" $O/bounds.txt
synth_l8; step "synth rc=$?"
python3 .gpu/words.py 131000 > /tmp/b/p131k.txt; step "prompt $(wc -c < /tmp/b/p131k.txt) bytes"
for b in auto host; do
  /usr/bin/time -v timeout 150 topkv generate -m $L8 -f /tmp/b/p131k.txt -n 16 -c 140000 --attn topk \
    --index quest:page=16,coarse_ratio=16 --k 256 --gpu-mem-budget 24G --store-type q8_0 --chunk 8192 \
    --ignore-eos --build-on $b --json $O/gen-$b.json > $O/gen-$b.txt 2> $O/gen-$b.err
  step "generate build-on $b rc=$? $(grep -E 'Elapsed' $O/gen-$b.err)"
  grep -E "prefill|build|first token|index" $O/gen-$b.err | grep -v "^\s*$" | tail -6
done
TOPKV_PDL=1 decode_l8 p512-auto-pdl1 512K q8_0 200; step "decode p512-auto-pdl1 rc=$? $(grep -E '^ +524288' $O/p512-auto-pdl1.txt)"
