#!/usr/bin/env bash
# Session 18, after run_layer_quarters.sh (no quarter at 10% answers): the last half and the
# last three quarters of the 28 layers at 10% of the context, the rest at 2% (weights 5 and 1;
# k 6% and 8% are those schedules' means; the cross product's other two pairs run as well).
set -u
cd "$(dirname "$0")/../../.." || exit 1
D=bench/results/ruler_qwen2.5_1.5b_cpu_fwe
M=.models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
S=$(python3 -c "print(','.join('weights:'+'/'.join('5' if l>=a else '1' for l in range(28)) for a in (14,7)))")
build/bin/topkv eval ruler -m $M --backend cpu --chat --lengths 16K --tasks fwe --samples 1 --seed 2 \
  --answer-tokens 48 --agreement-tokens 16 --error-steps 0 --methods-index multipole --methods-k 6%,8% \
  --methods-k-schedule "$S" -q --json $D/halves16k.json --csv $D/halves16k.csv > $D/halves16k.txt 2> $D/halves16k.err
