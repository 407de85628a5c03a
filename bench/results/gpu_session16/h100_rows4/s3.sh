#!/usr/bin/env bash
# Session 16, third hold (one H100): the two-term tile at T = 1 changed from two
# rows a warp to four (both MMVQ kernels); the twin tests again, then decode
# speed with TOPKV_Q8_TERMS=1 and 2, alternating. Logs under $OUT/s16c.
set -u
S=$OUT/s16c
mkdir -p "$S" /tmp/m
W=/tmp/q; mkdir -p $W && tar -xJf .gpu/bundle.tar.xz -C $W && source $W/bundle/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$S/gpu.txt"
( topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o /tmp/m/llama8b.gguf -q
  topkv model synth --preset gemma3-270m --type q8_0 --context 1048640 -o /tmp/m/g270m.gguf -q ) &
for t in gpu_test_cuda_mmvq gpu_test_cuda_quant; do
  timeout 120 "$t" > "$S/test-$t.txt" 2>&1; echo "$t rc=$? $(tail -1 "$S/test-$t.txt")" | tee -a "$S/steps.txt"
done
wait
D="topkv bench decode --backend cuda --warmup 4 --steps 32 --no-plot -q"
for rep in 1 2; do
  for terms in 1 2; do
    $D -m /tmp/m/llama8b.gguf --contexts 0,32K --modes dense --q8-terms $terms --out-dir "$S/l-t$terms-r$rep" \
      > "$S/l-t$terms-r$rep.txt" 2>&1
    $D -m /tmp/m/g270m.gguf --contexts 0,32K --modes dense --q8-terms $terms --out-dir "$S/g-t$terms-r$rep" \
      > "$S/g-t$terms-r$rep.txt" 2>&1
  done
done
for f in "$S"/[lg]-t*/decode.csv; do echo "$f $(tail -n +2 "$f" | cut -d, -f4,11 | tr '\n' ' ')"; done
