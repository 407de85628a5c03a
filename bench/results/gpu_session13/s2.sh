#!/usr/bin/env bash
# Session 13, call 3: where the offloaded 8B step's time goes (nsys kernel
# and API sums) at 128K with the two-level quest; logs under $OUT.
set -u
R=$PWD
cd /tmp && rm -rf bundle && tar -xJf "$R/.gpu/bundle.tar.xz"
source /tmp/bundle/env.sh
which nsys ncu > "$OUT/tools.txt" 2>&1; ls /usr/local/cuda/bin | grep -i nsight >> "$OUT/tools.txt"
[ -f /tmp/l8.gguf ] || topkv model synth --preset llama3-8b --type q4_k -o /tmp/l8.gguf > "$OUT/synth.txt" 2>&1
NSYS=$(which nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: $NSYS" >> "$OUT/tools.txt"
spec=${SPEC:-quest:page=16,coarse_ratio=16}
timeout 400 $NSYS profile -t cuda -o /tmp/p128 -f true topkv bench decode -m /tmp/l8.gguf --contexts ${CTX:-128K} --modes topk \
  --index "$spec" --k 256 --beyond-trained --gpu-mem-budget 24G --store-type f8 --steps 16 --warmup 4 -q > "$OUT/dec.txt" 2>&1
cat "$OUT/dec.txt" | grep -A1 " context"
$NSYS stats --report cuda_gpu_kern_sum,cuda_api_sum,cuda_gpu_mem_time_sum --format csv -o /tmp/p128s /tmp/p128.nsys-rep > "$OUT/stats.log" 2>&1
cp /tmp/p128s* "$OUT/" 2>/dev/null
head -40 /tmp/p128s_cuda_gpu_kern_sum.csv | cut -c1-220
