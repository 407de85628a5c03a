#!/usr/bin/env bash
# Session 17, one H100 hold: issue 14's whole peer table on the current build
# (llama.cpp's llama-bench built on the dev machine, bench/peers/llama_cpp.sh
# build, carried as a bundle), the model-level GPU tests, the real Gemma 3
# 270M against --weights f16, issue 13's rerank_far decode cost on the
# Qwen2.5-1.5B geometry, and last the 8B at 512K under 24G. Background queue:
#   scripts/gpu-ruler.sh bg s17 0 "bash /tmp/s17.sh"
# Each phase waits for what a later call carries (llama-bench, the real Gemma
# parts). Logs and tables under $S (packed into each call's $OUT).
set -u
R=$PWD W=/tmp/q
S=$W/out/s17
mkdir -p "$S" /tmp/m
step() { echo "$(date +%T) $*" >> "$S/steps.txt"; }
await() { local i=0; while [ ! -e "$1" ] && [ $i -lt "$2" ]; do sleep 2; i=$((i + 2)); done; [ -e "$1" ]; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$S/gpu.txt"; nproc >> "$S/gpu.txt"
G=/tmp/m/g270m.gguf L=/tmp/m/llama8b.gguf Q=/tmp/m/q15.gguf

# 1. Files (model synth) while the GPU tests run.
( topkv model synth --preset gemma3-270m --type q8_0 --context 1048640 -o $G -q &&
  topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o $L -q &&
  topkv model synth --preset qwen2.5-1.5b --type q4_k -o $Q -q
  echo "synth rc=$?" >> "$S/steps.txt" ) > "$S/synth.txt" 2>&1 &
for t in gpu_test_cuda_mmvq gpu_test_cuda_quant gpu_test_cuda_model_graphs gpu_test_cuda_model \
         gpu_test_cuda_backend; do
  timeout 600 "$t" > "$S/test-$t.txt" 2>&1
  step "$t rc=$? $(grep -E 'passed|failed' "$S/test-$t.txt" | tail -1)"
done
wait
ls -la /tmp/m > "$S/models.txt"

# 2. llama.cpp (llama-bench -p 0 -n 32 -d CTX -fa 1 -ctk f16 -ctv f16; prefill -p N -b 4096 -ub 4096).
LB=$W/llama/bin/llama-bench
await "$W/llama/.ready" 600 || step "no llama-bench carried"
P="bash $R/bench/peers/llama_cpp.sh run --bin $LB"
( source "$W/llama/env.sh"
  $P -m $L --contexts 0,32K --prefill 4K,32K --timeout 90 --out "$S/llama-l" > "$S/llama-l.txt" 2>&1
  step "llama l rc=$?"
  $P -m $L --contexts 128K --prefill none --reps 1 --timeout 150 --out "$S/llama-l" > "$S/llama-l2.txt" 2>&1
  step "llama l128 rc=$?"
  $P -m $G --contexts 0,4K,32K,128K --prefill 4K,32K --timeout 60 --out "$S/llama-g" > "$S/llama-g.txt" 2>&1
  step "llama g rc=$?"
  $P -m $G --contexts 512K --prefill none --reps 1 --timeout 200 --decode-ubatch 4096 --out "$S/llama-g" \
    > "$S/llama-g2.txt" 2>&1
  step "llama g512 rc=$?" )

# 3. topkv, the same files and contexts (synthetic fill; --fill prefill for the prefill rows).
T="topkv bench decode --backend cuda --warmup 4 -q --no-plot"
timeout 150 $T -m $G --steps 32 --contexts 0,4K,32K,128K,512K,1M --modes dense --out-dir "$S/g-dense" \
  > "$S/g-dense.txt" 2>&1; step "g dense rc=$?"
timeout 200 $T -m $G --steps 32 --contexts 128K,512K,1M --modes topk --index quest --k 1024 --out-dir "$S/g-topk" \
  > "$S/g-topk.txt" 2>&1; step "g topk rc=$?"
timeout 60 $T -m $G --steps 4 --contexts 4K,32K --modes dense --fill prefill --chunk 4096 --out-dir "$S/g-prefill" \
  > "$S/g-prefill.txt" 2>&1; step "g prefill rc=$?"
timeout 120 $T -m $L --steps 32 --contexts 0,32K --modes dense --out-dir "$S/l-dense" > "$S/l-dense.txt" 2>&1
step "l dense rc=$?"
timeout 240 $T -m $L --steps 32 --contexts 32K,128K --modes topk --index quest --k 256 --gpu-mem-budget 24G \
  --out-dir "$S/l-topk" > "$S/l-topk.txt" 2>&1; step "l topk rc=$?"
timeout 90 $T -m $L --steps 4 --contexts 4K,32K --modes dense --fill prefill --chunk 4096 --out-dir "$S/l-prefill" \
  > "$S/l-prefill.txt" 2>&1; step "l prefill rc=$?"
python3 "$R/bench/peers/compare.py" --llama "$S/llama-g" --llama "$S/llama-l" --topkv "$S/g-dense" \
  --topkv "$S/g-topk" --topkv "$S/g-prefill" --topkv "$S/l-dense" --topkv "$S/l-topk" --topkv "$S/l-prefill" \
  --out "$S/peer" > "$S/peer.txt" 2>&1; step "compare rc=$?"

# 4. The real Gemma 3 270M (parts carried one a call): greedy tokens and logits against --weights f16.
if await /tmp/m/gemma.ready 300; then
  for terms in 2 1; do
    TOPKV_Q8_TERMS=$terms TOPKV_MODEL=/tmp/m/gemma.gguf timeout 120 gpu_test_cuda_quant "quant: the real*" \
      > "$S/real-t$terms.txt" 2>&1
    step "real t$terms rc=$? $(grep -E 'passed|failed' "$S/real-t$terms.txt" | tail -1)"
  done
else step "no real Gemma"; fi

# 5. Issue 13: rerank_far's decode cost on the Qwen2.5-1.5B geometry, k = 2%, alternating.
for rep in 1; do
  for ix in multipole multipole:rerank_far=1; do
    n=q-${ix//[:=]/_}-r$rep
    timeout 150 $T -m $Q --steps 64 --warmup 8 --contexts 16K,32K --beyond-trained --modes topk --index $ix \
      --k-fraction 0.02 --out-dir "$S/$n" > "$S/$n.txt" 2>&1; step "$n rc=$?"
  done
done
# 6. The 8B at 512K under 24G (issue 14's 150 tok/s target).
timeout 420 $T -m $L --steps 32 --contexts 512K --modes topk --index quest:page=16,coarse_ratio=16 --k 256 \
  --gpu-mem-budget 24G --store-type f8 --out-dir "$S/l512" > "$S/l512.txt" 2>&1; step "l512 rc=$?"

step "all done"
