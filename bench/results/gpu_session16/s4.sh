#!/usr/bin/env bash
# Session 16, fourth hold (one H100): q8_1x2 as a 16-bit code in two int8
# halves with one scale a block (the float arithmetic of one term; the
# residual format of s1-s3 kept two scales and two float sums). Background
# queue (scripts/gpu-ruler.sh bg s4 0 "bash /tmp/s4.sh"): the twin tests, then
# decode speed with --q8-terms 1 and 2, alternating, twice. The real Gemma
# test runs in the last call, after the timings. Logs under /tmp/q/out/s16d.
set -u
S=/tmp/q/out/s16d
mkdir -p "$S" /tmp/m
step() { echo "$(date +%T) $*" >> "$S/steps.txt"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$S/gpu.txt"
( topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o /tmp/m/llama8b.gguf -q
  topkv model synth --preset gemma3-270m --type q8_0 --context 1048640 -o /tmp/m/g270m.gguf -q ) &
for t in gpu_test_cuda_mmvq gpu_test_cuda_quant; do
  timeout 120 "$t" > "$S/test-$t.txt" 2>&1; step "$t rc=$? $(grep -E 'passed|failed' "$S/test-$t.txt" | tail -1)"
done
wait
D="topkv bench decode --backend cuda --warmup 4 --steps 32 --no-plot -q"
for rep in 1 2; do
  for terms in 1 2; do
    $D -m /tmp/m/llama8b.gguf --contexts 0,32K --modes dense --q8-terms $terms --out-dir "$S/l-t$terms-r$rep" \
      > "$S/l-t$terms-r$rep.txt" 2>&1
    $D -m /tmp/m/g270m.gguf --contexts 0,32K --modes dense --q8-terms $terms --out-dir "$S/g-t$terms-r$rep" \
      > "$S/g-t$terms-r$rep.txt" 2>&1
    step "bench t$terms r$rep"
  done
done
for f in "$S"/[lg]-t*/decode.csv; do step "$(basename "$(dirname "$f")") $(tail -n +2 "$f" | cut -d, -f4,11 | tr '\n' ' ')"; done
step "all done"
