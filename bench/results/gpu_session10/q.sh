#!/usr/bin/env bash
# Session 10: RULER on the real Qwen2.5-Coder-1.5B (every one of its 28 layers retrieves), on the GPU host.
#   q.sh part           copy the carried model part(s) (.up/q/q15.NN) to /tmp/m
#   q.sh start JOBS...  assemble and check the GGUF, then run the jobs (below) one after another in the background
#   q.sh wait           wait up to WAIT_S seconds, then pack what there is into $OUT/q.tgz and print the tables
# Every job is one `topkv eval ruler` with the options of session 7 (bench/results/ruler_qwen2.5_1.5b_h100/qr.sh).
set -uo pipefail
W=/tmp/q; M=/tmp/m; R=$W/out; mkdir -p $R $W/tmp $M
cp .up/q/q15.* $M/ 2>/dev/null; ls $M | tr '\n' ' '; echo
[ "${1:-}" = part ] && exit 0
[ -d $W/bundle ] || tar -xJf .gpu/bundle.tar.xz -C $W || exit 1
source $W/bundle/env.sh
T6=${TASKS:-niah_single_1,niah_single_3,niah_multikey_2,niah_multivalue,vt,fwe}
job() {  # job NAME TIMEOUT_S LENGTHS [eval ruler options...]
  local n=$1 t=$2 l=$3; shift 3
  local c="topkv eval ruler -m q15.gguf --backend cuda --chat --lengths $l --samples ${SAMPLES:-1} --answer-tokens 48 --agreement-tokens 64 --error-steps 4 --chunk 4096 --kv-type f16 --tasks $T6 $*"
  echo "$c" > $R/ruler-$n.cmd
  /usr/bin/time -v timeout $t topkv eval ruler -m $M/q15.gguf --backend cuda --chat --lengths $l --samples ${SAMPLES:-1} \
    --answer-tokens 48 --agreement-tokens 64 --error-steps 4 --chunk 4096 --kv-type f16 --tasks $T6 \
    --tmp-dir $W/tmp "$@" --csv $R/ruler-$n.csv --json $R/ruler-$n.json -q > $R/ruler-$n.txt 2> $R/ruler-$n.err
  echo "$n rc=$? t=$(date +%s)" >> $R/jobs.txt
}
if [ "${1:-}" = run ]; then  # the jobs, one after another (started by `start` in its own session)
  shift
  for j in "$@"; do
    case $j in
      # 32K, the length not run before: the default (multipole) and its rerank, k = 1% and 2%.
      a) job a 900 32K --methods-index multipole,multipole:rerank=4 --methods-k 1%,2% ;;
      # 4K-16K: the rerank and exact top-k (flat) at 2% (session 7 ran multipole and quest there).
      b) job b 600 4K,8K,16K --methods-index multipole:rerank=4,flat --methods-k 2% ;;
      # 8K: every other backend at 2%.
      c) job c 600 8K --methods-index quest,centroid,hnswlib,faiss-ivf --methods-k 2% ;;
      # 8K: multipole with two dense layers, with the linear k schedule, and at 5%.
      d) job d 600 8K --methods-index multipole --methods-k 2%,5% --methods-dense-layers 0,2 --methods-k-schedule uniform,linear ;;
      # 4K and 8K: the other tasks (and fwe again), two samples each, multipole at 2% and 5%.
      e) TASKS=niah_single_2,niah_multikey_1,niah_multikey_3,niah_multiquery,cwe,fwe; T6=$TASKS
         SAMPLES=2 job e 560 4K,8K --methods-index multipole --methods-k 2%,5% ;;
      # fwe alone, three samples at 8K: multipole at 2% and 10%, exact top-k (flat) at 10%.
      f) T6=fwe; SAMPLES=3 job f 300 8K --methods-index multipole,flat --methods-k 2%,10% ;;
    esac
  done
  echo "all done t=$(date +%s)" >> $R/jobs.txt
  exit 0
fi
if [ "${1:-}" = start ]; then
  shift
  if [ ! -s $M/q15.gguf ]; then
    [ $(ls $M/q15.[0-9][0-9] | wc -l) = 19 ] || { echo "parts missing"; exit 1; }
    cat $M/q15.[0-9][0-9] > $M/q15.gguf && rm -f $M/q15.[0-9][0-9]
  fi
  echo "sha256 $(sha256sum $M/q15.gguf | cut -c1-16) (want cc324af070c2ecbf)" | tee $R/sha.txt
  sed -i "/all done/d" $R/jobs.txt 2>/dev/null; cp "$0" $W/q.sh
  cd $W && setsid nohup bash $W/q.sh run "$@" > $R/jobs.log 2>&1 < /dev/null &
  sleep 2
fi
end=$(( $(date +%s) + ${WAIT_S:-0} ))
while [ $(date +%s) -lt $end ] && ! grep -q "all done" $R/jobs.txt 2>/dev/null; do sleep 5; done
tar czf $OUT/q.tgz -C $W out 2>/dev/null
cat $R/jobs.txt 2>/dev/null; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
for f in $R/ruler-*.txt; do [ -s $f ] && { echo "== $f"; head -12 $f; }; done
for f in $R/ruler-*.json; do python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[1], j.get('prompts_done'), j.get('complete'))" $f; done 2>/dev/null
