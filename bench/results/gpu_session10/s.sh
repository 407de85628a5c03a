#!/usr/bin/env bash
# Session 10: the 14 sanitizer runs that did not finish in session 9 (unfinished_cases.tsv: 11
# racecheck, 2 memcheck, 1 synccheck), all side by side with SAN_TIMEOUT (default 900 s) each.
#   s.sh start   start them in the background (session 9's c3.sh with CASES=), wait up to WAIT_S
#   s.sh wait    wait up to WAIT_S; both pack /tmp/s/c3 into $OUT/s.tgz and print the table
set -uo pipefail
S0=$(date +%s); W=/tmp/s; mkdir -p $W
if [ "${1:-}" = start ]; then
  rm -rf $W/c3; mkdir -p $W/c3; cp bench/results/gpu_session10/unfinished_cases.tsv $W/cases.tsv
  [ -d $W/bundle ] || tar -xJf .gpu/bundle.tar.xz -C $W || exit 1
  cp bench/results/gpu_session9/c3.sh $W/c3.sh  # a later call replaces the working tree
  CASES=$W/cases.tsv SAN_TIMEOUT=${SAN_TIMEOUT:-900} OUT=$W setsid nohup bash $W/c3.sh \
    > $W/c3.out 2>&1 < /dev/null &
  sleep 5
fi
end=$(( S0 + ${WAIT_S:-0} ))
while [ $(date +%s) -lt $end ] && [ "$(wc -l < $W/c3/results.txt 2>/dev/null || echo 0)" -lt 14 ]; do sleep 5; done
tar czf $OUT/s.tgz -C $W c3 2>/dev/null
sort $W/c3/results.txt 2>/dev/null; echo "finished: $(wc -l < $W/c3/results.txt 2>/dev/null || echo 0) of 14"
