# Session 32, third call: the device tables staged with the layer's KV heads in parallel
# (DeviceSearchTables::stage), and generate's split of what follows the prefill (layers_ready_s).
# GPU tests that upload tables; then the Llama-8B geometry prefilled for real at ~131K, quest
# two-level, q8_0 store, --build-on auto (the first call's run, before the change: 8.29 s after the
# last chunk).
source scripts/gpu-hold.sh
gpu_tests gpu_test_gpu_search gpu_test_gpu_offload gpu_test_gpu_table_budget
synth_l8; step "synth rc=$?"
python3 .gpu/words.py 131000 > /tmp/b/p131k.txt; step "prompt $(wc -c < /tmp/b/p131k.txt) bytes"
/usr/bin/time -v timeout 150 topkv generate -m $L8 -f /tmp/b/p131k.txt -n 16 -c 140000 --attn topk \
  --index quest:page=16,coarse_ratio=16 --k 256 --gpu-mem-budget 24G --store-type q8_0 --chunk 8192 \
  --ignore-eos --build-on auto --json $O/gen2-auto.json > $O/gen2-auto.txt 2> $O/gen2-auto.err
step "generate2 build-on auto rc=$? $(grep -E 'Elapsed' $O/gen2-auto.err)"
grep -E "keys indexed|first token" $O/gen2-auto.err | cut -c1-400
