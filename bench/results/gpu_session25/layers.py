#!/usr/bin/python3
"""Per method of grid-1.5b.json at 4K and 8K (where every backend ran all six
tasks): mean attention error, the three layers with the largest mean error,
the oracle top-k mass (what any top-k at that k could hold), and the GQA
union (store rows a KV head attends per step over the nominal k)."""
import json, sys
from collections import defaultdict
d = json.load(open(sys.argv[1] if len(sys.argv) > 1 else "grid-1.5b.json"))
acc = defaultdict(lambda: {"err": [], "mass": [], "union": []})
for r in d["rows"]:
    if r["length"] not in (4096, 8192) or r["method"] == "dense":
        continue
    a = acc[r["method"]]
    if r.get("attention_rel_error_per_layer"):
        a["err"].append(r["attention_rel_error_per_layer"])
    if r.get("oracle_topk_mass_per_layer"):
        a["mass"].append(r["oracle_topk_mass_per_layer"])
    if r.get("k_tokens"):
        a["union"].append(r["rows_attended"] / r["k_tokens"])
print(f"{'method':30} {'err':>6} {'worst layers (err)':34} {'top-k mass':>10} {'min layer':>10} {'union/k':>8}")
for m, a in sorted(acc.items()):
    if not a["err"]:
        continue
    L = len(a["err"][0])
    per = [sum(e[l] for e in a["err"]) / len(a["err"]) for l in range(L)]
    worst = sorted(range(L), key=lambda l: -per[l])[:3]
    mass = [sum(e[l] for e in a["mass"]) / len(a["mass"]) for l in range(L)] if a["mass"] else [0] * L
    ml = min(range(L), key=lambda l: mass[l])
    print(f"{m:30} {sum(per)/L:6.3f} {', '.join(f'{l} ({per[l]:.2f})' for l in worst):34} "
          f"{sum(mass)/L:10.3f} {f'{ml} ({mass[ml]:.2f})':>10} {sum(a['union'])/max(len(a['union']),1):8.2f}")
