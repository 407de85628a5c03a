# Means over the prompts each store type ran, per method; ratios to the first
# store given (f16). Reads store_<type>.csv in the current folder.
#   python3 compare.py f16 f8 q8_0
import csv
import sys
def load(st):
    return {(r['task'], r['length'], r['method']): r for r in csv.DictReader(open(f'store_{st}.csv'))}
types = sys.argv[1:] or ['f16', 'f8', 'q8_0']
runs = {t: load(t) for t in types}
keys = [k for k in runs[types[0]] if all(k in runs[t] for t in types)]
def mean(d, ks, f):
    v = [float(d[k][f]) for k in ks if d[k][f] != '']
    return sum(v) / len(v) if v else float('nan')
print(f'| method | store | prompts | score | attn err | err / {types[0]} | KL mean | agreement |')
print('|---|---|---|---|---|---|---|---|')
for m in sorted({k[2] for k in keys}):
    ks = [k for k in keys if k[2] == m]
    base = mean(runs[types[0]], ks, 'attn_err_mean')
    for t in types:
        e = mean(runs[t], ks, 'attn_err_mean')
        ratio = f'{e / base:.3f}' if base == base and base else '-'
        print(f"| {m} | {t} | {len(ks)} | {mean(runs[t], ks, 'score'):.1f} | {e:.4f} | {ratio} | "
              f"{mean(runs[t], ks, 'kl_mean'):.4f} | {mean(runs[t], ks, 'agreement'):.3f} |")
