import csv
def load(st):
    return {(r['task'],r['length'],r['method']):r for r in csv.DictReader(open(f'store_{st}.csv'))}
a,b=load('f16'),load('f8')
keys=[k for k in a if k in b]
meths=sorted({k[2] for k in keys})
print('| method | prompts | score f16 | score f8 | attn err f16 | attn err f8 | f8 / f16 | KL f16 | KL f8 | agreement f16 | agreement f8 |')
print('|---|---|---|---|---|---|---|---|---|---|---|')
for m in meths:
    ks=[k for k in keys if k[2]==m]
    def mean(d,f): 
        v=[float(d[k][f]) for k in ks if d[k][f]!='']
        return sum(v)/len(v) if v else float('nan')
    ea,eb=mean(a,'attn_err_mean'),mean(b,'attn_err_mean')
    print(f"| {m} | {len(ks)} | {mean(a,'score'):.1f} | {mean(b,'score'):.1f} | {ea:.4f} | {eb:.4f} | {eb/ea if ea else float('nan'):.3f} | {mean(a,'kl_mean'):.4f} | {mean(b,'kl_mean'):.4f} | {mean(a,'agreement'):.3f} | {mean(b,'agreement'):.3f} |")
