#!/usr/bin/env bash
# Session 11: the device-side rerank (cuda_kernels.h, summary_search step 3b) on the GPU host.
#   r.sh test           unpack the bundle, run the device search's GPU tests (kernels against their CPU twins,
#                       the GPU runtime against the CPU runtime) -> $OUT/test-*.txt
#   r.sh part           copy the carried model part(s) (.up/q/q15.NN) to /tmp/m
#   r.sh start JOBS...  assemble and check the Qwen 1.5B GGUF, then run the jobs (below) in the background
#   r.sh wait           wait up to WAIT_S seconds, pack what there is into $OUT/r.tgz, print the tables
# Every job is one `topkv eval ruler` with session 10's options (bench/results/gpu_session10/q.sh).
set -uo pipefail
W=/tmp/q; M=/tmp/m; R=$W/out11; mkdir -p $R $W/tmp $M
cp .up/q/q15.* $M/ 2>/dev/null; ls $M | tr '\n' ' '; echo
[ "${1:-}" = part ] && exit 0
[ -d $W/bundle ] && [ ! -e $W/bundle.11 ] && rm -rf $W/bundle
[ -d $W/bundle ] || { tar -xJf .gpu/bundle.tar.xz -C $W && touch $W/bundle.11; } || exit 1
source $W/bundle/env.sh
if [ "${1:-}" = test ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
  for t in gpu_test_gpu_search gpu_test_gpu_offload; do
    /usr/bin/time -f "$t %e s" timeout 400 $W/bundle/bin/$t 2>&1 | tail -25 > $OUT/test-$t.txt
    tail -4 $OUT/test-$t.txt
  done
  exit 0
fi
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
ALL=niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt,cwe,fwe
if [ "${1:-}" = run ]; then  # the jobs, one after another (started by `start` in its own session)
  shift
  for j in "$@"; do
    case $j in
      # 4K and 8K: all 11 tasks, two samples; the default and its rerank (now on the device) at 2%, one build.
      a) T6=$ALL SAMPLES=2 job a 900 4K,8K --methods-index multipole,multipole:rerank=4 --methods-k 2% ;;
      # 16K and 32K: all 11 tasks, two samples, the same methods. (Session 11 ran this with 900 s: 16K
      # complete, 32K 4 tasks of 11. An earlier form of this line meant six tasks but inherited a's.)
      b) T6=$ALL SAMPLES=2 job b 900 16K,32K --methods-index multipole,multipole:rerank=4 --methods-k 2% ;;
      # 4K and 8K: all tasks, two samples, the rerank at 1% (the top-k paper's budget). Not run.
      c) T6=$ALL SAMPLES=2 job c 600 4K,8K --methods-index multipole:rerank=4 --methods-k 1% ;;
    esac
  done
  echo "all done t=$(date +%s)" >> $R/jobs.txt
  exit 0
fi
if [ "${1:-}" = start ]; then
  shift
  if [ ! -s $M/q15.gguf ]; then
    cat $M/q15.[0-9][0-9] > $M/q15.gguf
  fi
  sum=$(sha256sum $M/q15.gguf | cut -c1-16)
  echo "sha256 $sum (want cc324af070c2ecbf)" | tee $R/sha.txt
  [ $sum = cc324af070c2ecbf ] || { rm -f $M/q15.gguf; echo "parts missing or corrupt"; exit 1; }
  rm -f $M/q15.[0-9][0-9]
  sed -i "/all done/d" $R/jobs.txt 2>/dev/null; cp "$0" $W/r.sh
  cd $W && setsid nohup bash $W/r.sh run "$@" > $R/jobs.log 2>&1 < /dev/null &
  sleep 2
fi
end=$(( $(date +%s) + ${WAIT_S:-0} ))
while [ $(date +%s) -lt $end ] && ! grep -q "all done" $R/jobs.txt 2>/dev/null; do sleep 5; done
tar czf $OUT/r.tgz -C $W out11 2>/dev/null
cat $R/jobs.txt 2>/dev/null; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
for f in $R/ruler-*.txt; do [ -s $f ] && { echo "== $f"; head -8 $f; }; done
