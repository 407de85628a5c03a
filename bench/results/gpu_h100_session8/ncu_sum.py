# Summarise an ncu --csv --page raw file: per kernel name, launches, total and mean duration.
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
steps = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
hi = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
h = rows[hi]; kn = h.index("Kernel Name"); td = h.index("gpu__time_duration.sum")
gs = h.index("launch__grid_size") if "launch__grid_size" in h else None
unit = rows[hi + 1][td] if len(rows) > hi + 1 else "nsecond"
scale = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(unit.strip(), 1.0)
print("unit:", unit)
agg = collections.defaultdict(lambda: [0, 0.0, set()])
for r in rows[hi + 2:]:
    if len(r) <= td: continue
    try: t = float(r[td].replace(",", "")) * scale
    except ValueError: continue
    name = r[kn].split("(")[0].split("<")[0].split()[-1]
    a = agg[name]; a[0] += 1; a[1] += t
    if gs is not None: a[2].add(r[gs])
tot = sum(a[1] for a in agg.values())
print(f"{'kernel':28s} {'n':>6s} {'us/step':>9s} {'mean us':>8s}  grids")
for k, a in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f"{k:28s} {a[0]:6d} {a[1]/1e3/steps:9.1f} {a[1]/1e3/a[0]:8.2f}  {sorted(a[2])[:6]}")
print(f"{'total':28s} {sum(a[0] for a in agg.values()):6d} {tot/1e3/steps:9.1f}")
