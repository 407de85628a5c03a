#!/usr/bin/env bash
# Qwen session: RULER on the 1.5B, one invocation. qr.sh NAME TIMEOUT_S LENGTHS [eval ruler options...]
set -uo pipefail
M=/tmp/m; W=/tmp/q; R=$W/out; mkdir -p $R $W/tmp; N=$1 T=$2 L=$3; shift 3
source $W/bundle/env.sh
echo "topkv eval ruler -m q15.gguf --backend cuda --chat --lengths $L --samples 1 --answer-tokens 48 --agreement-tokens 64 --error-steps 4 --chunk 4096 --kv-type f16 $*" > $R/ruler-$N.cmd
/usr/bin/time -v timeout $T topkv eval ruler -m $M/q15.gguf --backend cuda --chat --lengths $L --samples 1 --answer-tokens 48 \
  --agreement-tokens 64 --error-steps 4 --chunk 4096 --kv-type f16 --tmp-dir $W/tmp "$@" \
  --csv $R/ruler-$N.csv --json $R/ruler-$N.json -q > $R/ruler-$N.txt 2> $R/ruler-$N.err
echo "rc=$?"; tail -25 $R/ruler-$N.txt; grep -E "Elapsed|Maximum resident" $R/ruler-$N.err; grep -v "^\s" $R/ruler-$N.err | tail -3
tar czf $OUT/q.tgz -C $W out
