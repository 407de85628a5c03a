#!/usr/bin/python3
"""The suite of record, device-built (suite-1.5b-device.json), beside what the README says of it:
the prompts where the default and dense score differently (with the step where the free run left
dense's path and dense's margin there), the median index build and restore per length, and the
prompts whose dense score differs from the Faiss-built suite's (../gpu_session24/).

    python3 suite_summary.py > suite-1.5b-device-diffs.txt
"""
import collections
import json
import statistics

rows = json.load(open("suite-1.5b-device.json"))["rows"]
key = lambda r: (r["task"], r["length"], r["sample"], r["seed"])
dense = {key(r): r for r in rows if r["method"] == "dense"}
topk = sorted((r for r in rows if r["method"] != "dense"), key=lambda r: (r["length"], r["task"], r["seed"], r["sample"]))
n, lost, gained = collections.Counter(), collections.Counter(), collections.Counter()
print("Prompts where the default (multipole, device-built, k = 2%) and dense score differently")
print("length task sample seed | dense topk | first flip step, dense's margin there (nats)")
for r in topk:
    d = dense[key(r)]
    n[r["length"]] += 1
    if abs(r["score"] - d["score"]) > 1e-9:
        (lost if r["score"] < d["score"] else gained)[r["length"]] += 1
        print(f"{r['length']:6d} {r['task']:16s} {r['sample']} {r['seed']:20d} | {d['score']:5.1f} {r['score']:5.1f} | "
              f"{r['first_flip_step']}, {r['first_flip_margin']:.3f}")
for L in sorted(n):
    print(f"{L}: {n[L]} prompts, {lost[L]} lower, {gained[L]} higher than dense")
print("\nmedian index build / restore (s), per length")
for L in sorted(n):
    rs = [r for r in topk if r["length"] == L]
    print(f"{L}: {statistics.median(r['index_build_s'] for r in rs):.2f} / {statistics.median(r['restore_s'] for r in rs):.2f}")
old = {key(r): r for r in json.load(open("../gpu_session24/suite-1.5b-rerank-far.json"))["rows"] if r["method"] == "dense"}
changed = [k for k in dense if k in old and abs(dense[k]["score"] - old[k]["score"]) > 1e-9]
print(f"\ndense scores another than in sessions 15-24 on {len(changed)} of {sum(k in old for k in dense)} prompts: "
      + ", ".join(f"{L} {t} sample {s}" for t, L, s, _ in sorted(changed, key=lambda k: k[1])))
