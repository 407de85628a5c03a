#!/usr/bin/env bash
# Session 16 on the GPU host, one background queue (scripts/gpu-ruler.sh bg s1 0
# "bash bench/results/gpu_session16/s1.sh"): the MMVQ twin tests with one and
# two activation terms, the CUDA model tests, llama.cpp's llama-bench built
# beside them, then decode speed of topkv with TOPKV_Q8_TERMS=1 and 2 (twice,
# alternating) and of llama.cpp on the same `model synth` files. Logs and
# tables under $W/out/s16 (packed into the call's $OUT by gpu-ruler.sh wait).
set -u
R=$PWD W=/tmp/q
S=$W/out/s16
mkdir -p "$S" /tmp/m
step() { echo "$(date +%T) $*" >> "$S/steps.txt"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$S/gpu.txt"; nproc >> "$S/gpu.txt"

# llama.cpp builds on the host's cores while the GPU tests run.
cp -r "$R/.peers/llama.cpp" /tmp/llama-src 2>/dev/null
( LLAMA_SRC=/tmp/llama-src JOBS=12 bash "$R/bench/peers/llama_cpp.sh" build > "$S/llama-build.txt" 2>&1
  echo "llama build rc=$?" >> "$S/steps.txt" ) &
( topkv model synth --preset gemma3-270m --type q8_0 --context 1048640 -o /tmp/m/g270m.gguf -q &&
  topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o /tmp/m/llama8b.gguf -q
  echo "synth rc=$?" >> "$S/steps.txt" ) > "$S/synth.txt" 2>&1 &

for t in gpu_test_cuda_mmvq gpu_test_cuda_quant gpu_test_cuda_model_graphs gpu_test_cuda_model gpu_test_cuda_backend; do
  step "start $t"
  timeout 900 "$t" > "$S/test-$t.txt" 2>&1
  step "$t rc=$? $(tail -2 "$S/test-$t.txt" | tr '\n' ' ')"
done
wait
step "tests, build and synth done"

# Decode speed: topkv with one and two terms, alternating, then llama.cpp.
D="topkv bench decode --backend cuda --warmup 4 --steps 32 --no-plot -q"
for rep in 1 2; do
  for terms in 1 2; do
    n=t$terms-r$rep
    TOPKV_Q8_TERMS=$terms timeout 240 $D -m /tmp/m/g270m.gguf --contexts 0,4K,32K,128K --modes dense \
      --out-dir "$S/topkv-g-$n" > "$S/topkv-g-$n.txt" 2>&1; step "topkv g $n rc=$?"
    TOPKV_Q8_TERMS=$terms timeout 300 $D -m /tmp/m/llama8b.gguf --contexts 0,32K --modes dense \
      --out-dir "$S/topkv-l-$n" > "$S/topkv-l-$n.txt" 2>&1; step "topkv l $n rc=$?"
  done
done
for terms in 2 1; do
  TOPKV_Q8_TERMS=$terms timeout 300 $D -m /tmp/m/llama8b.gguf --contexts 32K,128K --modes topk --index quest --k 256 \
    --gpu-mem-budget 24G --out-dir "$S/topkv-l-topk-t$terms" > "$S/topkv-l-topk-t$terms.txt" 2>&1
  step "topkv l topk t$terms rc=$?"
done
L="bash $R/bench/peers/llama_cpp.sh run --prefill none"
LLAMA_SRC=/tmp/llama-src $L -m /tmp/m/g270m.gguf --contexts 0,4K,32K,128K --timeout 240 --out "$S/llama-g" \
  > "$S/llama-g.txt" 2>&1; step "llama g rc=$?"
LLAMA_SRC=/tmp/llama-src $L -m /tmp/m/llama8b.gguf --contexts 0,32K --timeout 240 --out "$S/llama-l" \
  > "$S/llama-l.txt" 2>&1; step "llama l rc=$?"
LLAMA_SRC=/tmp/llama-src $L -m /tmp/m/llama8b.gguf --contexts 128K --reps 1 --timeout 300 --out "$S/llama-l" \
  > "$S/llama-l128.txt" 2>&1; step "llama l128 rc=$?"
step "all done"
