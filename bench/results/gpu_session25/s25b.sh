#!/usr/bin/env bash
# Session 25, one H200: the pinned chunk pool (src/common/buffer_pool.h). The GPU tests with it,
# then eval ruler's restore time before (.gpu/topkv-old.xz: the build of the commit before)
# and after, on the Qwen2.5-Coder-1.5B geometry (random Q4_K weights, made here) at 8K.
source scripts/gpu-hold.sh
xz -dc .gpu/topkv-old.xz > /tmp/b/topkv-old && chmod +x /tmp/b/topkv-old
gpu_tests gpu_test_gpu_offload gpu_test_gpu_search
topkv model synth --preset qwen2.5-1.5b --type q4_k --context 32768 -o /tmp/b/q15s.gguf -q --force
step "synth rc=$?"
ab() {  # NAME BINARY
  timeout 100 "$2" eval ruler -m /tmp/b/q15s.gguf --backend cuda --lengths 8K --tasks niah_single_1,niah_single_3 \
    --samples 1 --answer-tokens 16 --agreement-tokens 16 --error-steps 0 --chunk 4096 --kv-type f16 \
    --methods-index multipole --methods-k 1%,2%,5% --tmp-dir /tmp/b/tmp-$1 --json "$O/ab-$1.json" -q > "$O/ab-$1.txt" 2>&1
  step "ab $1 rc=$? restore_s $(python3 -c "
import json,statistics as s;r=[x['restore_s'] for x in json.load(open('$O/ab-$1.json'))['rows'] if x['method']!='dense']
print(len(r),'median %.3f'%s.median(r),'min %.3f max %.3f'%(min(r),max(r)))")"
}
mkdir -p /tmp/b/tmp-old /tmp/b/tmp-new /tmp/b/tmp-old2 /tmp/b/tmp-new2
ab old /tmp/b/topkv-old
ab new topkv
ab old2 /tmp/b/topkv-old
ab new2 topkv
gpu_tests gpu_test_cuda_kernels gpu_test_cuda_streamed gpu_test_gpu_kmeans gpu_test_cuda_backend gpu_test_cuda_decode_attention
cat "$O/steps.txt"
