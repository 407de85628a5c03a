#!/usr/bin/env bash
# Session 18, call 1 (one H100): the GPU k-means against its twin, the MMVQ
# kernels after the review's q8_row/with_q8_terms change, then the blockwise
# k-means of a multipole build at the Llama-8B geometry on the GPU
# (--build-on gpu) and on the host cores (Faiss, the default), one run each.
#   carry .gpu/b18.tar.xz; bash bench/results/gpu_session18/s18a.sh
set -u
W=/tmp/q S=$OUT/s18a
mkdir -p "$W" "$S" /tmp/m
tar -xJf .gpu/b18.tar.xz -C "$W"
source "$W/b18/env.sh"
step() { echo "$(date +%T) $*" | tee -a "$S/steps.txt"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$S/gpu.txt"; nproc >> "$S/gpu.txt"
L=/tmp/m/l8.gguf
( topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o $L -q; echo "synth rc=$?" >> "$S/steps.txt" ) \
  > "$S/synth.txt" 2>&1 &
for t in gpu_test_gpu_kmeans gpu_test_cuda_mmvq; do
  timeout 200 "$t" > "$S/test-$t.txt" 2>&1
  step "$t rc=$? $(grep -E 'passed|failed' "$S/test-$t.txt" | tail -1)"
done
grep SUMMARY "$S/test-gpu_test_gpu_kmeans.txt" | tee "$S/kmeans-summary.txt"
wait
B="topkv bench decode -m $L --backend cuda --modes topk --index multipole --k 1024 --gpu-mem-budget 24G --steps 8 --warmup 2 -q"
for ctx in 64K 128K; do
  for where in gpu host; do
    [ $ctx = 128K ] && [ $where = host ] && [ $SECONDS -gt 300 ] && { step "128K host skipped (time)"; continue; }
    timeout $((570 - SECONDS)) $B --contexts $ctx --build-on $where --out-dir "$S/b-$ctx-$where" > "$S/b-$ctx-$where.txt" 2>&1
    step "bench $ctx build-on $where rc=$? $(python3 -c "import json;r=json.load(open('$S/b-$ctx-$where/decode.json'))['results'][0];print('fill_s',round(r['fill_s'],1),'build_s',round(r['build_s'],2),'keys',r['keys_indexed'],'tok/s',round(r['tok_s'],1))" 2>&1 | tail -1)"
  done
done
cat "$S/steps.txt"
