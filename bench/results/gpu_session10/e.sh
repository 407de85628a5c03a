#!/usr/bin/env bash
# Session 10, the 8B at 512K (issue 14): the device search's score kernel rewritten (a row per
# head_dim/32 lanes instead of per warp), old and new binaries side by side, then the whole step.
#   e.sh start   GPU tests of the device search (new binary); `bench gpu-ops --only search` old, new,
#                old, new; in the background: synthesise Llama-3-8B Q4_K, then `bench decode` at 512K,
#                quest k=256, --gpu-mem-budget 24G, with the fp16 store and then the f8 store
#   e.sh wait    wait up to WAIT_S seconds for the background runs
# Everything lands in /tmp/e/out, packed into $OUT/e.tgz at the end of each call.
set -uo pipefail
S0=$(date +%s); W=/tmp/e; R=$W/out; mkdir -p $R $W/m
L=$W/m/llama3-8b-q4_k.gguf
if [ "${1:-}" = run ]; then  # the background chain
  source $W/new/bundle/env.sh
  [ -s $L ] || topkv model synth --preset llama3-8b --type q4_k --context 1048640 -q -o $L > $R/synth.txt 2>&1
  echo "synth rc=$? t=$(date +%s)" >> $R/jobs.txt
  for st in f16 f8; do
    /usr/bin/time -v timeout 900 topkv bench decode -m $L --backend cuda -q --no-plot --warmup 4 --steps 32 \
      --contexts 512K --modes topk --index quest --k 256 --gpu-mem-budget 24G --store-type $st \
      --out-dir $R/l512-$st > $R/l512-$st.txt 2> $R/l512-$st.err
    echo "l512-$st rc=$? t=$(date +%s)" >> $R/jobs.txt
  done
  echo "all done" >> $R/jobs.txt
  exit 0
fi
if [ "${1:-}" = start ]; then
  [ -d $W/new ] || { mkdir -p $W/new && tar -xJf .gpu/bundle.tar.xz -C $W/new; }      # this commit
  [ -d $W/old ] || { mkdir -p $W/old && tar -xJf .gpu/bundle_old.tar.xz -C $W/old; }  # the one before
  ls $W/new/bundle/bin/topkv $W/old/bundle/bin/topkv || exit 1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/machine.txt
  cp "$0" $W/e.sh; (cd $W && setsid nohup bash $W/e.sh run > $R/jobs.log 2>&1 < /dev/null &)
  source $W/new/bundle/env.sh
  for t in gpu_test_gpu_search gpu_test_gpu_offload; do
    timeout 200 $W/new/bundle/bin/$t > $R/$t.log 2>&1; echo "$t rc=$?" | tee -a $R/tests.txt; tail -2 $R/$t.log
  done
  for i in 1 2; do
    for b in old new; do
      timeout 120 $W/$b/bundle/bin/topkv bench gpu-ops --only search --out $R/search_${b}$i.jsonl > $R/search_${b}$i.txt 2>&1
      echo "search $b $i rc=$? t=$(( $(date +%s) - S0 ))"
    done
  done
  echo "== search kernels, us (old1 new1 old2 new2)"
  paste <(grep -E "BENCH search .*(score|cut|gather|far)" $R/search_old1.txt | awk '{for(i=3;i<=NF-4;i++) printf "%s ", $i; print ""}' | cut -c1-60) \
    <(for f in old1 new1 old2 new2; do grep -E "BENCH search .*(score|cut|gather|far)" $R/search_$f.txt | awk '{print $(NF-3)}' > $W/col_$f; done; paste $W/col_old1 $W/col_new1 $W/col_old2 $W/col_new2)
fi
end=$(( S0 + ${WAIT_S:-0} ))
while [ $(date +%s) -lt $end ] && ! grep -q "all done" $R/jobs.txt 2>/dev/null; do sleep 5; done
tar czf $OUT/e.tgz -C $W out 2>/dev/null
cat $R/jobs.txt 2>/dev/null; free -g | sed -n 2p
for st in f16 f8; do grep -E "^ +[0-9]+ topk|rror" $R/l512-$st.txt 2>/dev/null; grep -E "Elapsed|Maximum resident" $R/l512-$st.err 2>/dev/null; done
