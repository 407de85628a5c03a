# Session 32, second call (same machine, warm): `bench decode` 512K q8_0, the 2 x 2 of --build-on
# (auto: quest's bounds on the device; host) and programmatic launch (TOPKV_PDL 1/0), alternating
# after the first call's auto/on run: host/off, auto/off, host/on. Fill time by build place,
# tok/s by launch.
source scripts/gpu-hold.sh
TOPKV_PDL=0 decode_l8 p512-host-pdl0 512K q8_0 190 --build-on host; step "decode p512-host-pdl0 rc=$? $(grep -E '^ +524288' $O/p512-host-pdl0.txt)"
TOPKV_PDL=0 decode_l8 p512-auto-pdl0 512K q8_0 190; step "decode p512-auto-pdl0 rc=$? $(grep -E '^ +524288' $O/p512-auto-pdl0.txt)"
TOPKV_PDL=1 decode_l8 p512-host-pdl1 512K q8_0 190 --build-on host; step "decode p512-host-pdl1 rc=$? $(grep -E '^ +524288' $O/p512-host-pdl1.txt)"
