#!/usr/bin/env bash
# Session 17, the same hold: issue 13's rerank_far decode rows again (s17.sh
# gave --warmup twice, a CLI error), after s17b.sh's llama.cpp rows.
set -u
S=/tmp/q/out/s17 Q=/tmp/m/q15.gguf
step() { echo "$(date +%T) $*" >> "$S/steps.txt"; }
i=0; while ! grep -q "s17b done" "$S/steps.txt" && [ $i -lt 1500 ]; do sleep 3; i=$((i + 3)); done
for ix in multipole multipole:rerank_far=1; do
  n=q-${ix//[:=]/_}
  timeout 150 topkv bench decode --backend cuda -q --no-plot -m $Q --steps 64 --warmup 8 --contexts 16K,32K \
    --beyond-trained --modes topk --index $ix --k-fraction 0.02 --out-dir "$S/$n" > "$S/$n.txt" 2>&1
  step "$n rc=$?"
done
step "s17c done"
