#!/usr/bin/python3
"""How well Multipole's far field estimates the attention it stands in for, and what a
second-order ("spread") correction of a cluster's mass would change. One-off analysis of a
`topkv kv dump` (safetensors, f32, RoPE applied): per layer, KV head, decode query and
query head it clusters the stored keys (sinks and window excluded) into groups of ~16 by
spherical k-means on numpy (the shape of `multipole`'s clusters, not its code), takes the
clusters by q.C until k = 2% of the tokens (plain budget cut, no rerank), and compares the
far clusters' true mass sum_i exp(s q.k_i) and the attention output with

  plain:  N_j exp(s q.C_j)                                   (Multipole Attention, Sec. 3)
  spread: N_j exp(s q.C_j + min(a * s^2/2 * sum_d q_d^2 var_jd, ln clip))

The spread term is E[exp(s q.(k - C))] for Gaussian keys with the cluster's per-dimension
variance (exp of the mean under-counts the mean of exp: Jensen); a = 1 is that estimate,
a = 0.5 damps it, clip bounds it where the keys are far from Gaussian.

    far_field_gap.py DUMP.safetensors
"""
import json
import struct
import sys

import numpy as np

SINKS, WINDOW, RATIO, FRAC = 4, 256, 16, 0.02
VARIANTS = [("plain", 0.0, None), ("a=1", 1.0, None), ("a=0.5", 0.5, None), ("a=1 clip 4", 1.0, 4.0),
            ("a=0.5 clip 4", 0.5, 4.0), ("a=1 clip 2", 1.0, 2.0)]


def read(path):
    f = open(path, "rb")
    n = struct.unpack("<Q", f.read(8))[0]
    head = json.loads(f.read(n))
    base = 8 + n

    def arr(name):
        a, b = head[name]["data_offsets"]
        f.seek(base + a)
        return np.frombuffer(f.read(b - a), dtype=np.float32).reshape(head[name]["shape"])

    layers = sorted({int(k.split(".")[0][5:]) for k in head if k.startswith("layer")})
    return float(head["__metadata__"]["scale"]), layers, arr


def clusters(keys, rng, iters=10):
    x = keys / np.linalg.norm(keys, axis=1, keepdims=True)
    c = x[rng.choice(len(x), max(1, len(x) // RATIO), replace=False)]
    for _ in range(iters):
        a = np.argmax(x @ c.T, axis=1)
        for j in range(len(c)):
            m = a == j
            if m.any():
                c[j] = x[m].mean(0)
                c[j] /= np.linalg.norm(c[j]) + 1e-12
    a = np.argmax(x @ c.T, axis=1)
    return [g for g in (np.where(a == j)[0] for j in range(len(c))) if len(g)]


def main():
    scale, layers, arr = read(sys.argv[1])
    rng = np.random.default_rng(0)
    print(f"{'layer':>5} {'far share':>9} {'plain mass/true':>15}  attention rel. error: " +
          "  ".join(f"{v[0]}" for v in VARIANTS) + "  (no far field)")
    totals = np.zeros(len(VARIANTS) + 1)
    for L in layers:
        K, V, Q = arr(f"layer{L}.keys"), arr(f"layer{L}.values"), arr(f"layer{L}.queries")
        nkv, n, d = K.shape
        G = Q.shape[1] // nkv
        k = max(1, int(FRAC * n))
        rows = []
        for h in range(nkv):
            ks, vs = K[h, SINKS:n - WINDOW].astype(np.float64), V[h, SINKS:n - WINDOW].astype(np.float64)
            nk = np.concatenate([K[h, :SINKS], K[h, n - WINDOW:]]).astype(np.float64)
            nv = np.concatenate([V[h, :SINKS], V[h, n - WINDOW:]]).astype(np.float64)
            cl = clusters(ks, rng)
            C = np.stack([ks[g].mean(0) for g in cl])
            Vm = np.stack([vs[g].mean(0) for g in cl])
            var = np.stack([ks[g].var(0) for g in cl])
            N = np.array([len(g) for g in cl], float)
            for t in range(Q.shape[0]):
                for g in range(G):
                    q = Q[t, h * G + g].astype(np.float64)
                    x = C @ q
                    order = np.argsort(-x)
                    sel = order[:np.searchsorted(np.cumsum(N[order]), k) + 1]
                    far = np.setdiff1d(np.arange(len(cl)), sel)
                    logit = scale * (ks @ q)
                    m = max(logit.max(), (scale * nk @ q).max())
                    wn = np.exp(scale * nk @ q - m)
                    srows = np.concatenate([cl[j] for j in sel])
                    ws = np.exp(logit[srows] - m)
                    num, den = wn @ nv + ws @ vs[srows], wn.sum() + ws.sum()
                    fw = [np.exp(logit[cl[j]] - m) for j in far]
                    true_mass = sum(w.sum() for w in fw)
                    exact = (num + sum(w @ vs[cl[j]] for w, j in zip(fw, far))) / (den + true_mass)
                    spread = 0.5 * scale * scale * (var[far] @ (q * q))
                    err = []
                    for _, a, clip in VARIANTS:
                        e = a * spread if clip is None else np.minimum(a * spread, np.log(clip))
                        w = N[far] * np.exp(scale * x[far] - m + e)
                        o = (num + w @ Vm[far]) / (den + w.sum())
                        err.append(np.linalg.norm(o - exact) / np.linalg.norm(exact))
                    err.append(np.linalg.norm(num / den - exact) / np.linalg.norm(exact))
                    plain_mass = (N[far] * np.exp(scale * x[far] - m)).sum()
                    rows.append([true_mass / (den + true_mass), plain_mass / true_mass] + err)
        r = np.array(rows)
        totals += r[:, 2:].mean(0)
        print(f"{L:>5} {r[:, 0].mean():9.3f} {np.median(r[:, 1]):15.2f}  " +
              "  ".join(f"{v:.3f}" for v in r[:, 2:].mean(0)))
    print(f"{'mean':>5} {'':9} {'':15}  " + "  ".join(f"{v:.3f}" for v in totals / len(layers)))


if __name__ == "__main__":
    main()
