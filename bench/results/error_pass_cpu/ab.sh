#!/bin/bash
cd /work/main
for rep in 1 2 3; do for b in old new; do for e in 0 32; do
  /tmp/errb/topkv-$b eval ruler -m .models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --backend cpu --chat --lengths 4K --tasks vt --samples 1 --answer-tokens 16 --agreement-tokens 32 --error-steps $e --methods-index multipole --methods-k 2% --json /tmp/errb/ab.json -q > /dev/null 2>&1
  python3 -c "
import json;d=json.load(open('/tmp/errb/ab.json'));print('$b', $e, round(d['timing']['teacher_forced_s'],3))" >> /tmp/errb/ab.txt
done; done; done
