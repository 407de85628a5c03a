#!/usr/bin/python3
"""Per layer, what f8 (E4M3) device tables do to multipole's far rows, against fp32 tables.
Input: a `topkv kv dump --dtype f32` file (keys, values, decode queries of every layer).
Per KV head the keys are clustered as multipole's default does (~16 keys a cluster: Lloyd
k-means, 8 rounds from a strided start); every cluster is a far row with logit s q.C_j + ln N_j
and value mean V_j ("Multipole Attention for Efficient Long Context Reasoning" §3; topkv's
device far kernel). The tables are then rounded as `--device-table-type` stores them (f16;
f8: E4M3 to nearest, saturating at 448, as src/common/dtype.cpp), and per layer we print
  max|k|                  the largest key element
  dlogit max / p99        |s q.(C - C~)| over decode queries x clusters (nats)
  far err                 relative L2 error of the far rows' softmax-weighted output
                          (all clusters far: sum_j N_j e^{l_j} V_j / sum_j N_j e^{l_j})
for f16 and f8 tables, and for int8 tables with a scale per dimension (not built in topkv: an
estimate; a column's scale is its largest |element| / 127, so a large dimension gets its own
step). A second table: Quest's pages (16 keys) scored by their bounds
(q+.M + q-.m) as fp32 and as f8 tables rounded outward (M up, m down, as
SummaryTables::encoded_rows), pages taken best first until k = 2% of the keys, per query head:
the exact attention mass the taken keys hold, and the share of fp32's taken keys f8 takes too.

    far_logit_f8_per_layer.py KV.safetensors"""
import json, struct, sys
import numpy as np

p = sys.argv[1] if len(sys.argv) > 1 else "/tmp/kv15_4k.safetensors"
data = open(p, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
h = json.loads(data[8:8 + n])
base = 8 + n
scale = float(h["__metadata__"]["scale"])


def get(k):
    v = h[k]
    a, b = v["data_offsets"]
    return np.frombuffer(data[base + a:base + b], dtype=np.float32).reshape(v["shape"])


def f8(x):
    a = np.abs(x)
    e = np.floor(np.log2(np.maximum(a, 2.0 ** -6)))
    step = 2.0 ** (e - 3)
    return np.sign(x) * np.minimum(np.round(a / step) * step, 448.0)  # numpy rounds half to even


def f16(x):
    return x.astype(np.float16).astype(np.float32)


def i8_per_dim(x, up=None):
    """int8 codes with one scale per dimension (column); up: round up / down / to nearest."""
    sc = np.abs(x).max(0, keepdims=True) / 127.0
    sc = np.where(sc > 0, sc, 1.0)
    r = np.ceil(x / sc) if up is True else np.floor(x / sc) if up is False else np.round(x / sc)
    return np.clip(r, -127, 127) * sc  # ceil/floor stay within +-127: |x| <= 127 sc


def f8_directed(x, up):
    a = np.abs(x)
    step = 2.0 ** (np.floor(np.log2(np.maximum(a, 2.0 ** -6))) - 3)
    r = (np.ceil(x / step) if up else np.floor(x / step)) * step  # a multiple of x's step: representable
    assert np.abs(r).max() <= 448.0
    return r


def quest_mass(K, Qr, g, bounds, k_frac=0.02, page=16):
    """Mean attention mass of the keys quest takes, and overlap with fp32's take."""
    nkv, nk, d = K.shape
    k = max(1, int(k_frac * nk))
    masses, overlaps = {n: [] for n in bounds}, []
    for kv in range(nkv):
        P = (nk + page - 1) // page
        pad = np.full((P * page - nk, d), np.nan, dtype=np.float32)
        Kp = np.concatenate([K[kv], pad]).reshape(P, page, d)
        M, m = np.nanmax(Kp, 1), np.nanmin(Kp, 1)
        tables = {n: (f(M, True), f(m, False)) for n, f in bounds.items()}  # a page's [M | m]
        for s in range(Qr.shape[0]):
            for hh in range(kv * g, (kv + 1) * g):
                q = Qr[s, hh]
                sc = scale * K[kv] @ q
                w = np.exp(sc - sc.max())
                w /= w.sum()
                taken = {}
                for n, (Mt, mt) in tables.items():
                    ps = np.maximum(q * Mt, q * mt).sum(1)
                    rows = []
                    for j in np.argsort(-ps, kind="stable"):
                        rows.extend(range(j * page, min(nk, (j + 1) * page)))
                        if len(rows) >= k:
                            break
                    taken[n] = set(rows)
                    masses[n].append(w[rows].sum())
                overlaps.append({n: len(taken["f32"] & t) / len(taken["f32"]) for n, t in taken.items()})
    return ({n: float(np.mean(v)) for n, v in masses.items()},
            {n: float(np.mean([o[n] for o in overlaps])) for n in bounds})


def kmeans(X, k, rounds=8):
    C = X[np.linspace(0, len(X) - 1, k).astype(int)].copy()
    for _ in range(rounds):
        d = (X * X).sum(1)[:, None] - 2 * X @ C.T + (C * C).sum(1)[None, :]
        a = d.argmin(1)
        for j in range(k):
            m = a == j
            if m.any():
                C[j] = X[m].mean(0)
    return C, a


print(f"{p}: scale {scale:.6f}")
print("layer  max|k|   f16: dlogit max   p99  far err   f8: dlogit max   p99  far err   i8/dim: dlogit max   p99  far err")
layers = sorted(int(k[5:-5]) for k in h if k.endswith(".keys"))
for L in layers:
    K, V, Q = get(f"layer{L}.keys"), get(f"layer{L}.values"), get(f"layer{L}.queries")
    nkv, nk, d = K.shape
    Qr = Q.reshape(-1, Q.shape[-2], d)
    heads = Qr.shape[1]
    g = heads // nkv
    res = {}
    for name, rnd in (("f16", f16), ("f8", f8), ("i8", i8_per_dim)):
        dl, errs = [], []
        for kv in range(nkv):
            C, a = kmeans(K[kv], max(1, nk // 16))
            N = np.bincount(a, minlength=len(C)).astype(np.float64)
            keep = N > 0
            C, N = C[keep], N[keep]
            Vm = np.stack([V[kv][a == j].mean(0) for j in np.nonzero(keep)[0]])
            Cr, Vr = rnd(C), rnd(Vm)
            for s in range(Qr.shape[0]):
                for hh in range(kv * g, (kv + 1) * g):
                    q = Qr[s, hh].astype(np.float64)
                    l, lr = scale * C @ q + np.log(N), scale * Cr @ q + np.log(N)
                    dl.append(np.abs(l - lr))
                    w, wr = np.exp(l - l.max()), np.exp(lr - lr.max())
                    o, orr = w @ Vm / w.sum(), wr @ Vr / wr.sum()
                    errs.append(np.linalg.norm(o - orr) / max(np.linalg.norm(o), 1e-30))
        dl = np.concatenate(dl)
        res[name] = (dl.max(), np.percentile(dl, 99), float(np.mean(errs)))
    a, b, c = res["f16"], res["f8"], res["i8"]
    print(f"{L:5d} {np.abs(K).max():7.1f}   {a[0]:13.4f} {a[1]:6.4f} {a[2]:8.4f}   {b[0]:13.4f} {b[1]:6.4f} {b[2]:8.4f}"
          f"   {c[0]:17.4f} {c[1]:6.4f} {c[2]:8.4f}")

print()
print("quest, k = 2%: layer  mass: f32 bounds  f8 bounds  i8/dim bounds   takes of f32's keys: f8  i8/dim")
for L in layers:
    K, Q = get(f"layer{L}.keys"), get(f"layer{L}.queries")
    Qr = Q.reshape(-1, Q.shape[-2], K.shape[2])
    mass, overlap = quest_mass(K, Qr, Qr.shape[1] // K.shape[0],
                               {"f32": lambda x, up: x, "f8": f8_directed, "i8": i8_per_dim})
    print(f"{L:5d}   {mass['f32']:19.4f} {mass['f8']:10.4f} {mass['i8']:14.4f}   {overlap['f8']:22.3f} {overlap['i8']:7.3f}")
