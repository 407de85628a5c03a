# Means over the prompts each store type ran, per method; ratios to the f16 store.
import csv
def load(st):
    return {(r['task'], r['length'], r['method']): r for r in csv.DictReader(open(f'store_{st}.csv'))}
types = ['f16', 'f8', 'q8_0']
runs = {t: load(t) for t in types}
keys = [k for k in runs['f16'] if all(k in runs[t] for t in types)]
def mean(d, ks, f):
    v = [float(d[k][f]) for k in ks if d[k][f] != '']
    return sum(v) / len(v) if v else float('nan')
print('| method | store | prompts | score | attn err | err / f16 | KL mean | agreement |')
print('|---|---|---|---|---|---|---|---|')
for m in sorted({k[2] for k in keys}):
    ks = [k for k in keys if k[2] == m]
    base = mean(runs['f16'], ks, 'attn_err_mean')
    for t in types:
        e = mean(runs[t], ks, 'attn_err_mean')
        ratio = f'{e / base:.3f}' if base == base and base else '-'
        print(f"| {m} | {t} | {len(ks)} | {mean(runs[t], ks, 'score'):.1f} | {e:.4f} | {ratio} | "
              f"{mean(runs[t], ks, 'kl_mean'):.4f} | {mean(runs[t], ks, 'agreement'):.3f} |")
