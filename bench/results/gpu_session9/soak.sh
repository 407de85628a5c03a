#!/usr/bin/env bash
# Session 9: the GPU soak of issue 17. Real Gemma 3 270M (uploaded in parts to /tmp/m),
# a 1M-token context pack built here from the repository's own text, then 100K greedy
# tokens generated from it twice side by side (one run stopped and continued every
# 0.5 s), host RSS and GPU memory sampled (tests/soak/soak_generate.cpp).
#   soak.sh start    assemble, build the pack, start the soak in the background, wait
#   soak.sh wait     wait for a soak started by an earlier call
# Each call waits up to WAIT_S seconds, then packs what there is into $OUT/soak.tgz.
set -uo pipefail
W=/tmp/s; M=/tmp/m; R=$W/soak; mkdir -p $R
[ -d $W/bundle ] || tar -xJf .gpu/bundle.tar.xz -C $W || exit 1
source $W/bundle/env.sh
if [ "${1:-start}" = start ]; then
  cat $M/gemma.0 $M/gemma.1 $M/gemma.2 $M/gemma.3 $M/gemma.4 > $M/gemma.gguf && md5sum $M/gemma.gguf | tee $R/model_md5.txt
  # The document: the repository's sources and notes, in a fixed order, repeated to DOC_BYTES.
  find docs src index gpu offload tests bench scripts -type f \( -name '*.md' -o -name '*.cpp' -o -name '*.h' \
       -o -name '*.cu' -o -name '*.cuh' -o -name '*.py' -o -name '*.sh' \) | LC_ALL=C sort > $R/doc_files.txt
  : > $M/one.txt; xargs cat < $R/doc_files.txt > $M/one.txt
  : > $M/p1m.txt; while [ $(stat -c %s $M/p1m.txt) -lt ${DOC_BYTES:-2880000} ]; do cat $M/one.txt >> $M/p1m.txt; done
  truncate -s ${DOC_BYTES:-2880000} $M/p1m.txt
  /usr/bin/time -v topkv index build -m $M/gemma.gguf --backend cuda --kv-type f16 -f $M/p1m.txt -o $M/d.tkv --chunk 1024 \
    --json $R/build.json > $R/build.out 2> $R/build.log
  echo "build rc=$?"; grep -E "document|Elapsed|Maximum resident" $R/build.log | head; ls -l $M/d.tkv
  cd $R && setsid nohup $W/bundle/bin/soak_generate --topkv $W/bundle/bin/topkv --tokens ${TOKENS:-100000} \
      --model $M/gemma.gguf --pack $M/d.tkv --gpu --together --bytes-per-token 9612 --out $R/run --keep \
      -- --k 1024 > $R/soak.out 2> $R/soak.err < /dev/null &
  cd - > /dev/null
  sleep 2
fi
end=$(( $(date +%s) + ${WAIT_S:-480} ))
while pgrep -f bin/soak_generate > /dev/null && [ $(date +%s) -lt $end ]; do sleep 5; done
pgrep -f bin/soak_generate > /dev/null && echo "soak still running" || echo "soak ended"
cat $R/soak.out; tail -5 $R/soak.err
wc -c $R/run/a.txt $R/run/b.txt 2>/dev/null; tail -c 300 $R/run/a.txt 2>/dev/null; echo
tar czf $OUT/soak.tgz --exclude=soak/run/a.txt --exclude=soak/run/b.txt --exclude=soak/run/soak.gguf -C $W soak
