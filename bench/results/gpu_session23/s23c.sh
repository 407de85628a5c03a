#!/usr/bin/env bash
# Session 23, third and fourth holds (one H100, idle): the 512K pair of s23a/s23b again on another
# machine, the other way round: `s23c.sh f16` (synthesises $L8 when missing) then `s23c.sh f8` on the
# same warm machine; q8_0 store, two-level quest, k = 256, 24G.
set -u
source scripts/gpu-hold.sh  # step, synth_l8, decode_l8
[ -f "$L8" ] || { synth_l8; step "synth rc=$?"; }
decode_l8 "l512-q8_0-${1}t-2" 512K q8_0 540 --device-table-type "$1"
step "l512-q8_0-${1}t-2 rc=$?"; tail -3 "$O/l512-q8_0-${1}t-2.txt" | head -1
