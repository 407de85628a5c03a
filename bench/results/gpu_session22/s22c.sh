#!/usr/bin/env bash
# Session 22, third hold (one H100, idle): the Llama-3-8B geometry at 1M under --gpu-mem-budget 24G
# with the q8_0 store (session 13 ran 1M with f8 only: 136.2 / 135.5 tok/s, peak RSS 92.79 GiB on
# an H100), two-level quest, k = 256, synthetic fill. Logs packed into $OUT/r.tgz after each step.
# (As run, the hold's common part was written out here; it moved to scripts/gpu-hold.sh after the
# session's review, the same commands.)
set -u
source scripts/gpu-hold.sh  # step, synth_l8, decode_l8
synth_l8; step "synth rc=$?"
decode_l8 l1m-q8_0 1M q8_0 $(( 575 - ($(date +%s) - S0) ))
step "l1m-q8_0 rc=$?"; tail -4 "$O/l1m-q8_0.txt"
