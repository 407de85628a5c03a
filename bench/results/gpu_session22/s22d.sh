#!/usr/bin/env bash
# Session 22, fourth hold (one H100, idle): the Llama-3-8B geometry at 512K under --gpu-mem-budget 24G,
# f8 then q8_0 one after the other on the same machine (two-level quest, k = 256, synthetic fill), so
# that the two stores' decode speeds compare within one run. Logs packed into $OUT/r.tgz after each step.
# (As run, the hold's common part was written out here; it moved to scripts/gpu-hold.sh after the
# session's review, the same commands.)
set -u
source scripts/gpu-hold.sh  # step, synth_l8, decode_l8
synth_l8; step "synth rc=$?"
for st in f8 q8_0; do
  decode_l8 l512-$st 512K $st 280
  step "l512-$st rc=$?"; tail -3 "$O/l512-$st.txt" | head -1
done
