# Session 31, third hold: programmatic dependent launch over the device search's chain (score, cut,
# expand, gather; launch_dependent in gpu/cuda_common.cuh). GPU tests against the CPU twin with it on;
# `bench gpu-ops --only search` with it on and off (TOPKV_PDL=0), the same binary and machine; Gemma 3
# 270M geometry at 1M, one-level quest k = 1024, on and off.
source scripts/gpu-hold.sh
for tl in gpu_test_gpu_search:120 gpu_test_gpu_offload:60; do
  t=${tl%:*}; timeout ${tl#*:} $t > $O/test-$t.log 2>&1; rc=$?
  step "$t rc=$rc $(grep -E 'test cases' $O/test-$t.log | tail -1)"
done
for p in 1 0; do
  TOPKV_PDL=$p timeout 70 topkv bench gpu-ops --only search --reps 30 --out $O/search-pdl$p.jsonl > $O/search-pdl$p.txt 2>&1
  step "search pdl=$p rc=$?"
done
grep -h "coarse_ratio=16 k=256 \(+ gather\|score\)\|quest:page=16 k=1024 + gather\|multipole k=256 + far (all)" $O/search-pdl1.txt $O/search-pdl0.txt | sed 's/BENCH search *//'
G=/tmp/b/g270m.gguf
topkv model synth --preset gemma3-270m --type q8_0 --context 1048640 -o $G -q; step "synth g rc=$?"
for p in 1 0 1 0; do
  n=g-pdl$p-$(date +%s)  # renamed after the call: g-pdl1-1, g-pdl0-1, g-pdl1-2, g-pdl0-2 in run order
  TOPKV_PDL=$p timeout 60 topkv bench decode --backend cuda --warmup 4 -q --no-plot -m $G --steps 32 --contexts 1M \
    --modes topk --index quest --k 1024 --out-dir "$O/$n" > "$O/$n.txt" 2>&1
  step "$n rc=$? $(grep -E '^ +1048576' $O/$n.txt)"
done
