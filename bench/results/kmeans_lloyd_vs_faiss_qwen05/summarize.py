#!/usr/bin/env python3
"""Faiss- against Lloyd-clustered multipole on the real Qwen 0.5B dump (run.sh): per layer
(mean over both KV heads) recall@32, attention mass and output error at k = 1% / 2% / 5%."""
import csv, glob, os, sys
here = os.path.dirname(os.path.abspath(__file__))
rows = {}
for f in glob.glob(os.path.join(here, "csv", "*.csv")):
    l, h, e = os.path.basename(f)[:-4].split("_")
    for r in csv.DictReader(open(f)):
        rows[(int(l[1:]), int(h[1:]), e, int(r["k"]))] = r
ks = sorted({k[3] for k in rows})
def mean(e, k, col, layers):
    v = [float(rows[(l, h, e, k)][col]) for l in layers for h in (0, 1)]
    return sum(v) / len(v)
out = ["| layers | k | recall@32 faiss / lloyd | mass faiss / lloyd | output error faiss / lloyd | build s faiss / lloyd |",
       "|---|---|---|---|---|---|"]
groups = [("all 24", range(24)), ("0-5", range(0, 6)), ("6-11", range(6, 12)), ("12-17", range(12, 18)), ("18-23", range(18, 24))]
for name, layers in groups:
    for k in ks:
        f = lambda col, e: mean(e, k, col, layers)
        out.append(f"| {name} | {k} | {f('recall_mean','faiss'):.3f} / {f('recall_mean','lloyd'):.3f} | "
                   f"{f('mass_mean','faiss'):.3f} / {f('mass_mean','lloyd'):.3f} | {f('err_mean','faiss'):.4f} / "
                   f"{f('err_mean','lloyd'):.4f} | {f('build_s','faiss'):.3f} / {f('build_s','lloyd'):.3f} |")
worst = max(((mean("faiss", k, "mass_mean", [l]) - mean("lloyd", k, "mass_mean", [l]), l, k) for l in range(24) for k in ks))
out.append(f"\nLargest per-layer mass shortfall of lloyd against faiss: {worst[0]:+.4f} (layer {worst[1]}, k {worst[2]})")
print("\n".join(out))
