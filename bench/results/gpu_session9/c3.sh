#!/usr/bin/env bash
# Session 9, call 3: the sanitizer runs that did not finish (or failed) in calls 1 and 2,
# and the cases changed since, all side by side with a longer timeout: rerun_cases.tsv
# (tool, binary, test case); CASES=FILE takes another list of the same form.
set -uo pipefail
W=/tmp/s; R=$W/c3; mkdir -p $R; T=${SAN_TIMEOUT:-500}
[ -d $W/bundle ] || tar -xJf .gpu/bundle.tar.xz -C $W || exit 1
source $W/bundle/env.sh
i=0
while IFS=$'\t' read -r tool bin tc; do
  i=$((i + 1)); name=$(printf '%02d-%s-%s' $i $tool $bin)
  spec=$(printf '%s' "$tc" | sed -e 's/[][\\,]/\\&/g')
  ( start=$(date +%s)
    timeout $T compute-sanitizer --tool $tool --error-exitcode 3 $W/bundle/bin/$bin "$spec" > $R/$name.full 2>&1
    rc=$?
    { head -n 200 $R/$name.full; echo "[...]"; tail -n 60 $R/$name.full; } > $R/$name.log; rm -f $R/$name.full
    case $rc in 0) v=clean ;; 124) v="not finished in $T s" ;; *) v="FAILED (exit $rc)" ;; esac
    printf '%-44s %-24s %4ds  %s\n' "$name" "$v" $(($(date +%s) - start)) "$tc" >> $R/results.txt ) &
done < "${CASES:-bench/results/gpu_session9/rerun_cases.tsv}"
wait
sort $R/results.txt; tar czf $OUT/c3.tgz -C $W c3
