#!/usr/bin/python3
"""Means over every layer and KV head of run.sh's CSVs: attention mass, relative output error,
recall@32 and rows returned per search, per index and k; then the layers where a longer page loses
most mass against page 16 at k = 2%. Prints markdown (summary.md)."""
import csv
import glob
import re
from collections import defaultdict

rows = defaultdict(list)  # (index, k) -> [(layer, head, row)]
for path in sorted(glob.glob("csv/l*_h*.csv")):
    layer, head = map(int, re.findall(r"\d+", path.split("/")[-1]))
    for r in csv.DictReader(open(path)):
        rows[(r["index"], int(r["k"]))].append((layer, head, r))

def mean(xs):
    return sum(xs) / len(xs)

indexes = ["flat", "quest:page=16", "quest:page=32", "quest:page=64"]
print("| index | k | heads | mass | output error | recall@32 | rows a search |")
print("|---|---|---|---|---|---|---|")
for k in sorted({k for _, k in rows}):
    for ix in indexes:
        rs = [r for _, _, r in rows[(ix, k)]]
        if not rs:
            continue
        print(f"| {ix} | {k} | {len(rs)} | {mean([float(r['mass_mean']) for r in rs]):.4f} | "
              f"{mean([float(r['err_mean']) for r in rs]):.4f} | {mean([float(r['recall_mean']) for r in rs]):.3f} | "
              f"{mean([float(r['ids_per_search']) for r in rs]):.0f} |")
print()
base = {(l, h): float(r["mass_mean"]) for l, h, r in rows[("quest:page=16", 164)]}
for ix in indexes[2:]:
    loss = sorted(((base[(l, h)] - float(r["mass_mean"]), l, h) for l, h, r in rows[(ix, 164)]), reverse=True)
    worst = ", ".join(f"layer {l} head {h} ({d:.3f})" for d, l, h in loss[:3])
    print(f"- {ix} at k = 164: mass lost against page 16, worst heads: {worst}")
