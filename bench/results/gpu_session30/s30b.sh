# Session 30, first hold (call B): the same 512K decode with i8 tables, on the machine of call A.
source scripts/gpu-hold.sh
[ -f "$L8" ] || { synth_l8; step "synth (machine was released) rc=$?"; }
decode_l8 p512-$T 512K q8_0 560 --device-table-type $T; step "decode 512K q8_0 $T rc=$? $(grep -E 'tok/s|512K' $O/p512-$T.txt | tail -2 | tr '\n' ' ')"
