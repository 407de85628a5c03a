#!/usr/bin/env bash
# Session 24, same warm H100 as s24a.sh: `s24b.sh TYPE NAME` runs the 512K decode of s24a.sh with
# --device-table-type TYPE (f16: the baseline; i8 again) into $O/NAME.
set -u
source scripts/gpu-hold.sh  # step, synth_l8, decode_l8
[ -f "$L8" ] || { synth_l8; step "synth rc=$?"; }
decode_l8 "$2" 512K q8_0 560 --device-table-type "$1"
step "$2 rc=$?"; tail -4 "$O/$2.txt"
