#!/usr/bin/env bash
# RULER runs of a real model on the GPU host, from the repo root, with a
# bundle built elsewhere (.gpu/bundle.tar.xz: README, "Building for a GPU
# host"). A warm device machine keeps /tmp between calls, so a model larger
# than one call goes up in parts (split -b 50000000 -d -a 2 MODEL.gguf
# .up/q/NAME.: a part and the working tree must fit the 64 MiB a call carries),
# a call or more each, and is assembled once all are there;
# meanwhile other work (the GPU tests) can run in the background.
#   scripts/gpu-ruler.sh part                    copy the carried parts ($PARTS/*) to $WORK/m
#   scripts/gpu-ruler.sh bg NAME GPU CMD         run CMD (bash, the bundle's env, that GPU) in the background;
#                                                log $WORK/out/NAME.log, "NAME rc=.." in $WORK/out/jobs.txt
#   scripts/gpu-ruler.sh start MODEL SHA16 JOBS  assemble $WORK/m/MODEL.gguf from MODEL.NN parts, check the
#                                                first 16 hex digits of its sha256, start the jobs of file JOBS
#   scripts/gpu-ruler.sh wait                    wait up to WAIT_S s for every job; pack $WORK/out into
#                                                $OUT/r.tgz; print jobs.txt and the head of each table
# JOBS: one `topkv eval ruler` a line, "NAME LANE TIMEOUT_S LENGTHS TASKS OPTIONS..." (TASKS: a comma
# list, or "all"). LANE is a GPU index, optionally with a letter (0a, 0b, ...: several lanes share
# GPU 0) and a thread count (0a:4); one lane's jobs run one after another, the lanes at once, each
# with --threads (its count, else cores / lanes). $RULER_OPTS is every job's common options
# (default below: session 10's).
# Every call first unpacks a carried bundle whose sha256 it has not seen.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
WORK=${WORK:-/tmp/q}
PARTS=${PARTS:-.up/q}
OUT=${OUT:-$WORK/out-pack}
R=$WORK/out
mkdir -p "$WORK/m" "$WORK/tmp" "$R" "$OUT"
RULER_OPTS=${RULER_OPTS:---backend cuda --chat --samples 2 --answer-tokens 48 --agreement-tokens 64 --error-steps 4 --chunk 4096 --kv-type f16}
ALL=niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt,cwe,fwe

if [ -f .gpu/bundle.tar.xz ]; then
  sum=$(sha256sum .gpu/bundle.tar.xz | cut -c1-16)
  if [ "$(cat "$WORK/bundle.sha" 2>/dev/null)" != "$sum" ]; then
    rm -rf "$WORK/bundle" && tar -xJf .gpu/bundle.tar.xz -C "$WORK" && echo "$sum" > "$WORK/bundle.sha" ||
      { echo "gpu-ruler: could not unpack .gpu/bundle.tar.xz" >&2; exit 1; }
  fi
fi

run_job() {  # NAME LANE TIMEOUT LENGTHS TASKS OPTIONS...: one eval ruler
  local n=$1 gpu=${2%%[a-z:]*} t=$3 l=$4 tasks=$5 lane=$2; shift 5
  [ "$tasks" = all ] && tasks=$ALL
  local lanes; lanes=$(awk '!/^#/ && NF {print $2}' "$R/jobs.list" | sort -u | wc -l)
  local threads=$(( $(nproc) / lanes > 0 ? $(nproc) / lanes : 1 ))
  case "$lane" in *:*) threads=${lane#*:} ;; esac
  mkdir -p "$WORK/tmp/$n"
  # shellcheck disable=SC2086
  echo "topkv eval ruler -m $MODEL.gguf --lengths $l --tasks $tasks $RULER_OPTS --threads $threads $*" > "$R/ruler-$n.cmd"
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$gpu /usr/bin/time -v timeout "$t" topkv eval ruler -m "$WORK/m/$MODEL.gguf" --lengths "$l" \
    --tasks "$tasks" $RULER_OPTS --threads "$threads" --tmp-dir "$WORK/tmp/$n" "$@" --csv "$R/ruler-$n.csv" \
    --json "$R/ruler-$n.json" -q > "$R/ruler-$n.txt" 2> "$R/ruler-$n.err"
  echo "$n rc=$? t=$(date +%s)" >> "$R/jobs.txt"
}

case "${1:-}" in
  part)
    cp "$PARTS"/* "$WORK/m/" 2>/dev/null
    ls "$WORK/m" | tr '\n' ' '; echo
    ;;
  bg)
    [ $# -ge 4 ] || { echo "usage: $0 bg NAME GPU CMD" >&2; exit 2; }
    n=$2 gpu=$3 cmd=$4
    echo "$n" >> "$R/started.txt"
    # shellcheck disable=SC2016
    CUDA_VISIBLE_DEVICES=$gpu setsid nohup bash -c "source $WORK/bundle/env.sh; cd $PWD; $cmd; echo \"$n rc=\$? t=\$(date +%s)\" >> $R/jobs.txt" \
      > "$R/$n.log" 2>&1 < /dev/null &
    ;;
  start)
    [ $# -eq 4 ] || { echo "usage: $0 start MODEL SHA16 JOBS" >&2; exit 2; }
    MODEL=$2 want=$3 jobs=$4
    if [ ! -s "$WORK/m/$MODEL.gguf" ]; then cat "$WORK/m/$MODEL".[0-9][0-9] > "$WORK/m/$MODEL.gguf"; fi
    sum=$(sha256sum "$WORK/m/$MODEL.gguf" | cut -c1-16)
    echo "$MODEL.gguf sha256 $sum (want $want)" | tee "$R/sha.txt"
    [ "$sum" = "$want" ] || { rm -f "$WORK/m/$MODEL.gguf"; echo "gpu-ruler: parts missing or corrupt" >&2; exit 1; }
    rm -f "$WORK/m/$MODEL".[0-9][0-9]
    cp "$jobs" "$R/jobs.list"
    mkdir -p "$WORK/scripts" && cp "$0" "$WORK/scripts/gpu-ruler.sh"  # the tree may change under a later call
    # A queue's name carries the start's time: a second start on a warm machine waits for its own
    # queues, not for the first start's finished ones of the same GPU.
    stamp=$(date +%s)
    for lane in $(awk '!/^#/ && NF {print $2}' "$jobs" | sort -u); do
      echo "gpu$lane-$stamp" >> "$R/started.txt"
      setsid nohup bash "$WORK/scripts/gpu-ruler.sh" gpu-jobs "$lane" "$MODEL" "$stamp" > "$R/gpu$lane-$stamp.log" 2>&1 < /dev/null &
    done
    sleep 2
    ;;
  gpu-jobs)  # (start's) LANE MODEL STAMP: that lane's lines of jobs.list, one after another
    lane=$2 MODEL=$3 stamp=$4
    # shellcheck disable=SC1091
    source "$WORK/bundle/env.sh"
    awk -v g="$lane" '!/^#/ && NF && $2 == g' "$R/jobs.list" | while read -r line; do
      # shellcheck disable=SC2086
      run_job $line < /dev/null
    done
    echo "gpu$lane-$stamp rc=0 t=$(date +%s)" >> "$R/jobs.txt"
    exit 0
    ;;
  wait) ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac

# Every call: wait (WAIT_S, default 0) for what was started, then report.
done_all() {
  [ -f "$R/started.txt" ] || return 0
  while read -r n; do grep -q "^$n rc=" "$R/jobs.txt" 2>/dev/null || return 1; done < "$R/started.txt"
}
end=$(( $(date +%s) + ${WAIT_S:-0} ))
while [ "$(date +%s)" -lt "$end" ] && ! done_all; do sleep 5; done
tar czf "$OUT/r.tgz" -C "$WORK" out 2>/dev/null
cat "$R/jobs.txt" 2>/dev/null
nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader 2>/dev/null
for f in "$R"/*.log; do [ -s "$f" ] && { echo "== $f"; tail -3 "$f"; }; done
for f in "$R"/ruler-*.txt; do [ -s "$f" ] && { echo "== $f"; head -12 "$f"; }; done
exit 0
