# Session 28 GPU work (the bundle's env): the GPU tests of the device tables chosen by the budget, then
# a budget sweep of `bench decode` that shows the choice, as far as the call's time allows. Not run (no
# GPU host in session 28): the budgets are estimates meant to straddle the f16 and i8 tables.
O=${OUT:-/tmp/q/out}; mkdir -p $O
for t in gpu_test_gpu_table_budget gpu_test_cuda_model gpu_test_cuda_streamed; do
  /usr/bin/time -f "$t %e s" timeout 120 $t > $O/test-$t.log 2>&1; echo "$t rc=$? $(grep -E 'test cases' $O/test-$t.log | tail -1)"
done
topkv model synth --layers 4 --width 1024 --heads 16 --kv-heads 8 --head-dim 128 --ffn 2048 --vocab 2048 \
  --type q8_0 --context 300000 -o /tmp/q/tb.gguf -q --force
for b in 300M 400M 700M; do
  timeout 40 topkv bench decode -m /tmp/q/tb.gguf --backend cuda --contexts 128K --modes topk \
    --index quest:page=16,coarse_ratio=16 --k 256 --gpu-mem-budget $b --warmup 2 --steps 16 -q --no-plot \
    --out-dir $O/tb-$b > $O/tb-$b.txt 2>&1
  echo "budget $b rc=$? $(python3 -c "import json;r=json.load(open('$O/tb-$b/decode.json'))['results'][0];print(r['memory']['device_table_type'] or '-', round(r['tok_s'],1), (r['skipped'] or '')[:200])" 2>&1)"
done
