#!/usr/bin/env bash
# Session 23, second hold of the same warm H100 (s23a.sh synthesised $L8 in /tmp/b): the 512K
# baseline, q8_0 store with f16 tables (the default), beside s23a's f8 tables.
set -u
source scripts/gpu-hold.sh  # step, decode_l8 (the bundle unpacked again; $L8 and $O/ kept)
decode_l8 l512-q8_0-f16t 512K q8_0 300
step "l512-q8_0-f16t rc=$?"; tail -4 "$O/l512-q8_0-f16t.txt"
