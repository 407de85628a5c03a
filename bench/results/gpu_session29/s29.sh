# Session 29 GPU work (the bundle's env), in the background while the Qwen parts go up and the RULER
# jobs run: the GPU tests of session 28's tables-by-budget and of session 27's threading commits, then
# a `bench decode` budget sweep that shows the choice (f16 -> i8 -> refused). (The 512K f16/i8 pair
# was dropped: three failed starts left too little device time for it beside the RULER cells.)
O=/tmp/q/out/s29; mkdir -p $O; S0=$(date +%s)
step() { echo "$(( $(date +%s) - S0 ))s $*" | tee -a $O/steps.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/gpu.txt
for t in gpu_test_gpu_table_budget gpu_test_cuda_model gpu_test_cuda_streamed gpu_test_gpu_search gpu_test_gpu_offload gpu_test_gpu_kmeans; do
  /usr/bin/time -f "$t %e s" timeout 300 $t > $O/test-$t.log 2>&1; step "$t rc=$? $(grep -E 'test cases' $O/test-$t.log | tail -1)"
done
topkv model synth --layers 4 --width 1024 --heads 16 --kv-heads 8 --head-dim 128 --ffn 2048 --vocab 2048 \
  --type q8_0 --context 300000 -o /tmp/q/tb.gguf -q --force
for b in 250M 350M 450M 600M 800M; do
  timeout 60 topkv bench decode -m /tmp/q/tb.gguf --backend cuda --contexts 128K --modes topk \
    --index quest:page=16,coarse_ratio=16 --k 256 --gpu-mem-budget $b --warmup 2 --steps 16 -q --no-plot \
    --out-dir $O/tb-$b > $O/tb-$b.txt 2>&1
  step "budget $b rc=$? $(python3 -c "import json;r=json.load(open('$O/tb-$b/decode.json'))['results'][0];print(r['memory']['device_table_type'] or '-', round(r['tok_s'],1), (r['skipped'] or '')[:200])" 2>&1)"
done
