#!/usr/bin/python3
"""Per method of grid-1.5b.json, over the 16K and 32K prompts only: prompts run,
agreement, KL mean and max, mean attention error and oracle top-k mass (means over
the prompts' rows), and the worst retrieval layers by attention error."""
import json, sys
from collections import defaultdict
d = json.load(open(sys.argv[1] if len(sys.argv) > 1 else "grid-1.5b.json"))
acc = defaultdict(lambda: defaultdict(list))
for r in d["rows"]:
    if r["length"] < 16384 or r["method"] == "dense":
        continue
    a = acc[r["method"]]
    a["n"].append(r["length"])
    for k in ("agreement", "kl_mean", "kl_max"):
        a[k].append(r[k])
    if r.get("attention_rel_error_per_layer"):
        a["err"].append(r["attention_rel_error_per_layer"])
        a["mass"].append(r["oracle_topk_mass_per_layer"])
print(f"{'method':30} {'16K':>4} {'32K':>4} {'agree':>6} {'KL mean':>8} {'KL max':>7} {'err':>6} {'mass':>6}  worst layers (err)")
for m, a in sorted(acc.items()):
    L = len(a["err"][0])
    per = [sum(e[l] for e in a["err"]) / len(a["err"]) for l in range(L)]
    worst = sorted(range(L), key=lambda l: -per[l])[:3]
    mean = lambda k: sum(a[k]) / len(a[k])
    mass = sum(sum(x) / L for x in a["mass"]) / len(a["mass"])
    print(f"{m:30} {a['n'].count(16384):4} {a['n'].count(32768):4} {mean('agreement'):6.3f} {mean('kl_mean'):8.4f} "
          f"{max(a['kl_max']):7.3f} {sum(per)/L:6.3f} {mass:6.3f}  {', '.join(f'{l} ({per[l]:.2f})' for l in worst)}")
