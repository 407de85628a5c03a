#!/usr/bin/python3
"""Depth x length heat map of passkey / needle retrieval, as the long-context
papers draw it (DuoAttention Fig. 6, the top-k paper's NIAH figures).

    scripts/plot_passkey.py results.csv out.png [--method topk:flat]

Reads the CSV written by `topkv eval passkey --csv` (columns include method,
length, depth, passed) and draws one panel per method: x = context length,
y = depth of the needle in the context (0% = start), colour = pass rate.
"""
import argparse
import csv
import io
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import LinearSegmentedColormap  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_util import write_atomic  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("png")
    ap.add_argument("--method", action="append", help="methods to draw (default: all in the file)")
    ap.add_argument("--title", default="Passkey retrieval")
    a = ap.parse_args()

    cells = defaultdict(lambda: [0, 0])  # (method, length, depth) -> [passed, runs]
    with open(a.csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        sys.exit(f"{a.csv}: no rows")
    for need in ("method", "length", "depth", "passed"):
        if need not in rows[0]:
            sys.exit(f"{a.csv}: column '{need}' missing (is this a `topkv eval passkey --csv` file?)")
    for r in rows:
        key = (r["method"], int(r["length"]), float(r["depth"]))
        cells[key][0] += int(r["passed"])
        cells[key][1] += 1
    methods = a.method or sorted({k[0] for k in cells})
    lengths = sorted({k[1] for k in cells})
    depths = sorted({k[2] for k in cells})
    cmap = LinearSegmentedColormap.from_list("pass", ["#d7301f", "#fdcc8a", "#1a9850"])
    fig, axes = plt.subplots(1, len(methods), figsize=(1.5 + max(3.0, 0.9 * len(lengths)) * len(methods), 0.45 * len(depths) + 1.6),
                             squeeze=False)
    for ax, m in zip(axes[0], methods):
        grid = [[(cells[(m, L, d)][0] / cells[(m, L, d)][1]) if cells[(m, L, d)][1] else float("nan")
                 for L in lengths] for d in depths]
        im = ax.imshow(grid, cmap=cmap, vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(len(lengths)), [f"{round(L / 1024)}K" if L >= 1000 else str(L) for L in lengths])
        ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
        ax.set_xlabel("context length (tokens)")
        ax.set_title(m, fontsize=10)
        for i in range(len(depths)):
            for j in range(len(lengths)):
                v = grid[i][j]
                if v == v:
                    ax.text(j, i, f"{v:.0%}" if v not in (0, 1) else ("✓" if v == 1 else "✗"), ha="center",
                            va="center", fontsize=7)
    axes[0][0].set_ylabel("needle depth")
    fig.subplots_adjust(wspace=0.3)
    fig.colorbar(im, ax=axes[0].tolist(), label="pass rate", shrink=0.8)
    fig.suptitle(a.title, y=1.03)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    write_atomic(a.png, buf.getvalue())
    print(a.png)


if __name__ == "__main__":
    main()
