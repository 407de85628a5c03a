#!/usr/bin/env bash
# Final call: real Gemma quant vs f16 (issue 14), GPU tests, search kernels before/after (same call), 8B quest 32K.
set -uo pipefail
S0=$(date +%s); W=/tmp/s; mkdir -p $W/out $W/m; R=$W/out
tar -xJf .gpu/bundle.tar.xz -C $W || exit 1
xz -dc .gpu/topkv_before.xz > $W/topkv_before && chmod +x $W/topkv_before
source $W/bundle/env.sh; export BUNDLE=$W/bundle
cat /tmp/m/gemma.0 /tmp/m/gemma.1 /tmp/m/gemma.2 /tmp/m/gemma.3 /tmp/m/gemma.4 > $W/m/gemma.gguf
sha256sum $W/m/gemma.gguf | cut -c1-64 > $R/gemma.sha
export TOPKV_MODEL=$W/m/gemma.gguf
L=$W/m/llama3-8b-q4_k.gguf
( topkv model synth --preset llama3-8b --type q4_k --context 1048640 -q -o $L ) > $R/synth.txt 2>&1 &
SP=$!
for i in 1 2; do
  timeout 60 $W/topkv_before bench gpu-ops --only search --out $R/search_before$i.jsonl > $R/search_before$i.txt 2>&1
  timeout 60 topkv bench gpu-ops --only search --out $R/search_after$i.jsonl > $R/search_after$i.txt 2>&1
done
echo "t=$(( $(date +%s) - S0 )) search benches" >> $R/time.txt
GPU_CHECK_BENCH=0 OUT=$R/check timeout 150 scripts/gpu-check.sh > $R/check.txt 2>&1; echo "gpu-check rc=$?" >> $R/check.txt
echo "t=$(( $(date +%s) - S0 )) tests" >> $R/time.txt
wait $SP
T="topkv bench decode -m $L --backend cuda -q --no-plot --warmup 4 --steps 32 --modes topk --index quest --k 256 --gpu-mem-budget 24G"
timeout 100 $T --contexts 32K --out-dir $R/l-topk32 > $R/l-topk32.txt 2>&1
echo "t=$(( $(date +%s) - S0 )) 8b" >> $R/time.txt
tar czf $OUT/e.tgz -C $W out
cat $R/gemma.sha $R/time.txt; sed -n '/gpu-check summary/,$p' $R/check.txt | grep -v " ok$" | tail -24
grep -h "real" $R/check/gpu_test_cuda_quant.log | head -8
for f in $R/search_before2.txt $R/search_after2.txt; do echo "== $f"; grep -E "llama8b|gemma270m 1M multipole k=1024" $f | grep -v gathered; done
grep -E "^ +[0-9]+ topk|rror" $R/l-topk32.txt
