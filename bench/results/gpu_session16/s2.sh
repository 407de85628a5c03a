#!/usr/bin/env bash
# Session 16, second hold (one H100): the GPU tests of this build (the MMVQ
# twins with one and two activation terms, the device search and offload
# runtime with session 15's rerank_far changes, the decode graphs) while
# llama.cpp's llama-bench builds on the host's cores; once it is built, decode
# speed of topkv (TOPKV_Q8_TERMS=1 and 2, alternating) and of llama.cpp on the
# same `model synth` files, one after the other on the idle GPU. Logs and
# tables under /tmp/q/out/s16b (packed into a call's $OUT by `gpu-ruler.sh wait`).
set -u
R=$PWD W=/tmp/q
S=$W/out/s16b
mkdir -p "$S" /tmp/m
step() { echo "$(date +%T) $*" >> "$S/steps.txt"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$S/gpu.txt"; nproc >> "$S/gpu.txt"

cp -r "$R/.peers/llama.cpp" /tmp/llama-src
( LLAMA_SRC=/tmp/llama-src JOBS=12 bash "$R/bench/peers/llama_cpp.sh" build > "$S/llama-build.txt" 2>&1
  step "llama build rc=$?" ) &
( topkv model synth --preset gemma3-270m --type q8_0 --context 1048640 -o /tmp/m/g270m.gguf -q &&
  topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o /tmp/m/llama8b.gguf -q
  step "synth rc=$?" ) > "$S/synth.txt" 2>&1 &

for t in gpu_test_cuda_mmvq gpu_test_cuda_quant gpu_test_cuda_model_graphs gpu_test_gpu_search gpu_test_gpu_offload; do
  step "start $t"
  timeout 600 "$t" > "$S/test-$t.txt" 2>&1
  step "$t rc=$? $(tail -2 "$S/test-$t.txt" | tr '\n' ' ')"
done
wait
step "tests, build and synth done"

D="topkv bench decode --backend cuda --warmup 4 --steps 32 --no-plot -q"
for rep in 1 2; do
  for terms in 1 2; do
    n=t$terms-r$rep
    TOPKV_Q8_TERMS=$terms timeout 120 $D -m /tmp/m/g270m.gguf --contexts 0,4K,32K,128K --modes dense \
      --out-dir "$S/topkv-g-$n" > "$S/topkv-g-$n.txt" 2>&1; step "topkv g $n rc=$?"
    TOPKV_Q8_TERMS=$terms timeout 120 $D -m /tmp/m/llama8b.gguf --contexts 0,32K --modes dense \
      --out-dir "$S/topkv-l-$n" > "$S/topkv-l-$n.txt" 2>&1; step "topkv l $n rc=$?"
  done
done
for k in old new; do  # the two MMVQ kernels with two terms (auto picks one by shape)
  TOPKV_MMVQ=$k timeout 120 $D -m /tmp/m/llama8b.gguf --contexts 0 --modes dense \
    --out-dir "$S/topkv-l-t2-$k" > "$S/topkv-l-t2-$k.txt" 2>&1; step "topkv l t2 $k rc=$?"
done
L="bash $R/bench/peers/llama_cpp.sh run --prefill none --bin /tmp/llama-build/bin/llama-bench"
$L -m /tmp/m/g270m.gguf --contexts 0,4K,32K,128K --timeout 60 --out "$S/llama-g" > "$S/llama-g.txt" 2>&1
step "llama g rc=$?"
$L -m /tmp/m/llama8b.gguf --contexts 0,32K --timeout 100 --out "$S/llama-l" > "$S/llama-l.txt" 2>&1
step "llama l rc=$?"
timeout 200 $D -m /tmp/m/llama8b.gguf --contexts 128K --modes topk --index quest --k 256 --gpu-mem-budget 24G \
  --out-dir "$S/topkv-l-topk" > "$S/topkv-l-topk.txt" 2>&1; step "topkv l topk rc=$?"
$L -m /tmp/m/llama8b.gguf --contexts 128K --reps 1 --timeout 150 --out "$S/llama-l" > "$S/llama-l128.txt" 2>&1
step "llama l128 rc=$?"
step "all done"
