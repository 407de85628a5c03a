# Session 29, second hold (the bundle's env): the fixed session test and the model's override-layer
# reserve test, the device search tests (DeviceSearchTables::upload takes a DeviceTableChoice now),
# then a `bench decode` budget sweep at 128K on a small synthetic model (4 layers, 8 KV heads of 128,
# quest page 16 / coarse 16, k = 256): the budget steps the tables down f16 -> i8 -> i8 pages x2 ->
# x4 -> refused.
O=/tmp/q/out/s29b; mkdir -p $O; S0=$(date +%s)
step() { echo "$(( $(date +%s) - S0 ))s $*" | tee -a $O/steps.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/gpu.txt
for t in gpu_test_gpu_table_budget gpu_test_cuda_model gpu_test_gpu_search; do
  timeout 120 $t > $O/test-$t.log 2>&1; step "$t rc=$? $(grep -E 'test cases' $O/test-$t.log | tail -1)"
done
topkv model synth --layers 4 --width 1024 --heads 16 --kv-heads 8 --head-dim 128 --ffn 2048 --vocab 2048 \
  --type q8_0 --context 300000 -o /tmp/q/tb.gguf -q --force
for b in $(seq 208 16 464); do
  timeout 40 topkv bench decode -m /tmp/q/tb.gguf --backend cuda --contexts 128K --modes topk \
    --index quest:page=16,coarse_ratio=16 --k 256 --gpu-mem-budget ${b}M --warmup 2 --steps 8 -q --no-plot \
    --out-dir $O/tb-$b > $O/tb-$b.txt 2>&1
  step "budget ${b}M rc=$? $(python3 -c "import json;r=json.load(open('$O/tb-$b/decode.json'))['results'][0];m=r['memory'];print(m.get('device_table_type') or '-', m.get('device_table_page_factor'), round(r['tok_s'],1), (r['skipped'] or '')[:160])" 2>&1 | tail -1)"
done
