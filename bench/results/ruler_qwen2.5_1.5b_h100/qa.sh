#!/usr/bin/env bash
# Qwen session: assemble the 1.5B GGUF from its uploaded parts, check its hash, then `topkv generate` dense and top-k
# on a real question about a real long file (CPython 3.11's Lib/argparse.py, 19,640 tokens).
set -uo pipefail
M=/tmp/m; W=/tmp/q; R=$W/out; mkdir -p $R
if [ ! -s $M/q15.gguf ]; then cat $M/q15.[0-9][0-9] > $M/q15.gguf && rm -f $M/q15.[0-9][0-9]; fi
ls -l $M/q15.gguf; echo "sha256 $(sha256sum $M/q15.gguf | cut -c1-16) (want cc324af070c2ecbf)" | tee $R/sha.txt
source $W/bundle/env.sh
Q="-m $M/q15.gguf --backend cuda --kv-type f16 --chunk 4096"
for a in "--attn dense" "--attn topk --index multipole --k-fraction 0.02" "--attn topk --index quest --k-fraction 0.02" "--attn topk --index multipole --k-fraction 0.01"; do
  echo "== topkv generate $Q --chat -f argparse.py -f question.txt -n 80 --temp 0 -c 20480 $a"
  timeout 100 topkv generate $Q --chat -f $M/argparse.py -f $M/question.txt -n 80 --temp 0 -c 20480 $a 2>&1 | tail -7
done 2>&1 | tee $R/generate.txt
