#!/usr/bin/env bash
# Session 17, the same hold: llama.cpp's rows that s17.sh lost (its later
# llama_cpp.sh runs started while a call was replacing the working tree, rc
# 127), run after s17.sh's last row from a copy of the script in /tmp.
#   cp bench/peers/llama_cpp.sh /tmp/llama_cpp.sh; scripts/gpu-ruler.sh bg s17b 0 "bash /tmp/s17b.sh"
set -u
W=/tmp/q S=/tmp/q/out/s17
G=/tmp/m/g270m.gguf L=/tmp/m/llama8b.gguf
step() { echo "$(date +%T) $*" >> "$S/steps.txt"; }
i=0; while ! grep -q "all done" "$S/steps.txt" && [ $i -lt 1500 ]; do sleep 3; i=$((i + 3)); done
source "$W/llama/env.sh"
P="bash /tmp/llama_cpp.sh run --bin $W/llama/bin/llama-bench"
$P -m $L --contexts 128K --prefill none --reps 1 --timeout 150 --out "$S/llama-l" > "$S/llama-l2.txt" 2>&1
step "llama l128 rc=$?"
$P -m $G --contexts 0,4K,32K,128K --prefill 4K,32K --timeout 60 --out "$S/llama-g" > "$S/llama-g.txt" 2>&1
step "llama g rc=$?"
$P -m $G --contexts 512K --prefill none --reps 1 --timeout 200 --decode-ubatch 4096 --out "$S/llama-g" \
  > "$S/llama-g2.txt" 2>&1
step "llama g512 rc=$?"
step "s17b done"
