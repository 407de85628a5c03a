# Session 31, first call: q8_0 rows read by whole lines (Q8Run) in the row-list kernel.
# GPU tests against the CPU twins; `bench gpu-ops --only rows` with this build and with the build
# before (topkv-old: the same bench, the kernel before); `--only search` with this build; the
# Llama-8B geometry's file; then `bench decode` 512K, q8_0 store, i8 tables with this build.
source scripts/gpu-hold.sh
for tl in gpu_test_gpu_offload:90 gpu_test_gpu_search:120 gpu_test_gpu_table_budget:40 gpu_test_cuda_model:40 gpu_test_cuda_mmvq:60; do
  t=${tl%:*}; timeout ${tl#*:} $t > $O/test-$t.log 2>&1; rc=$?
  step "$t rc=$rc $(grep -E 'test cases' $O/test-$t.log | tail -1)"
done
for b in topkv topkv-old topkv topkv-old; do
  timeout 60 $b bench gpu-ops --only rows --reps 50 --out $O/rows-$b.jsonl >> $O/rows-$b.txt 2>&1
  step "rows $b rc=$?"
done
grep -h "BENCH rows" $O/rows-topkv.txt $O/rows-topkv-old.txt | head -40
timeout 90 topkv bench gpu-ops --only search --reps 30 --out $O/search.jsonl > $O/search.txt 2>&1; step "search rc=$?"
synth_l8; step "synth rc=$?"
decode_l8 p512-i8-new 512K q8_0 400 --device-table-type i8; step "decode 512K q8_0 i8 new rc=$? $(grep -E "512K" $O/p512-i8-new.txt | tail -1)"
