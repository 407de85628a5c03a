#!/usr/bin/env bash
# Call 1: GPU tests (quantize_q8_1_warp refactor), 8B quest k=256 at 32K: split + per-kernel ncu, memcheck.
set -uo pipefail
S0=$(date +%s); W=/tmp/s; mkdir -p $W/out $W/m; R=$W/out
[ -d $W/bundle ] || tar -xJf .gpu/bundle.tar.xz -C $W
source $W/bundle/env.sh; export BUNDLE=$W/bundle
L=$W/m/llama3-8b-q4_k.gguf
( [ -s $L ] || topkv model synth --preset llama3-8b --type q4_k --context 1048640 -q -o $L ) > $R/synth.txt 2>&1 &
SP=$!
(ls ~/.cache/huggingface /root/.cache 2>&1; which ncu compute-sanitizer; nvidia-smi --query-gpu=name,driver_version --format=csv) > $R/env.txt 2>&1
GPU_CHECK_BENCH=0 OUT=$R/check timeout 200 scripts/gpu-check.sh > $R/check.txt 2>&1; echo "gpu-check rc=$?" >> $R/check.txt
wait $SP; echo "t=$(( $(date +%s) - S0 )) synth done" >> $R/time.txt
T="topkv bench decode -m $L --backend cuda -q --no-plot --modes topk --index quest --k 256 --gpu-mem-budget 24G"
timeout 80 $T --steps 32 --warmup 4 --contexts 32K --out-dir $R/q32 > $R/q32.txt 2>&1
echo "t=$(( $(date +%s) - S0 )) q32 done" >> $R/time.txt
K='regex:score_kernel|threshold_kernel|mark_kernel|scan_kernel|write_kernel|far_kernel|row_list_kernel|merge_partials_kernel'
timeout 150 ncu --clock-control none --csv --page raw --metrics gpu__time_duration.sum,launch__grid_size -k "$K" -c 640 \
  $T --steps 3 --warmup 1 --contexts 32K --out-dir $R/q32ncu > $R/ncu32.csv 2> $R/ncu32.err
echo "t=$(( $(date +%s) - S0 )) ncu done" >> $R/time.txt
python3 .gpu/ncu_sum.py $R/ncu32.csv 2 > $R/ncu32.txt 2>&1
left=$(( 540 - ($(date +%s) - S0) ))
[ $left -gt 60 ] && GPU_CHECK_TESTS=0 GPU_CHECK_BENCH=0 GPU_CHECK_SANITIZE=1 GPU_CHECK_SANITIZE_TOOLS=memcheck \
  GPU_CHECK_SANITIZE_TIMEOUT=45 OUT=$R/san timeout $left scripts/gpu-check.sh > $R/san.txt 2>&1
tar czf $OUT/d1.tgz -C $W out
cat $R/env.txt $R/time.txt; sed -n '/gpu-check summary/,$p' $R/check.txt | grep -v " ok$" | tail -30
grep -E "^ +[0-9]+ topk|rror" $R/q32.txt; tail -3 $R/ncu32.err; cat $R/ncu32.txt; cat $R/san/results.txt 2>/dev/null
