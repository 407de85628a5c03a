#!/usr/bin/python3
"""RULER score per task and length, one line per method, as RULER's tables
read (Hsieh et al. 2024, Table 3): a grid of small panels, one per task, and
an "average" panel (the mean over tasks, RULER's headline number).

    scripts/plot_ruler.py results.json out.png [--method dense --method topk:quest@2%]

Reads the JSON written by `topkv eval ruler --json` (its "rows": task,
length, method, score).
"""
import argparse
import math
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_util import load_results, pyplot, save_png  # noqa: E402

PROG = "plot_ruler.py"


def length_label(n):
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("png")
    ap.add_argument("--method", action="append", help="methods to draw (default: all in the file)")
    ap.add_argument("--title", default=None)
    a = ap.parse_args()

    rows, tasks, config = load_results(PROG, a.json, "rows", "tasks", "model_summary")
    if not rows:
        sys.exit(f"{PROG}: {a.json} has no rows")
    scores = defaultdict(list)  # (method, task, length) -> sample scores
    for r in rows:
        scores[(r["method"], r["task"], r["length"])].append(r["score"])
    methods = a.method or list(dict.fromkeys(r["method"] for r in rows))
    lengths = sorted({r["length"] for r in rows})
    panels = list(tasks) + ["average"]

    def value(method, task, length):
        if task == "average":  # RULER's average: the mean of the task scores
            per_task = [sum(v) / len(v) for t in tasks if (v := scores.get((method, t, length)))]
            return sum(per_task) / len(per_task) if per_task else math.nan
        v = scores.get((method, task, length))
        return sum(v) / len(v) if v else math.nan

    plt = pyplot(PROG)
    cols = min(4, len(panels))
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(3.2 * cols, 2.6 * nrows + 0.6), squeeze=False, sharey=True)
    xs = list(range(len(lengths)))
    for i, task in enumerate(panels):
        ax = axes[i // cols][i % cols]
        for m in methods:
            # dense: a thick black line with large squares, under the methods' thinner lines
            style = (dict(color="black", linewidth=2.2, marker="s", markersize=7, zorder=1) if m == "dense"
                     else dict(linewidth=1.2, marker="o", markersize=3, zorder=2))
            ax.plot(xs, [value(m, task, L) for L in lengths], label=m, **style)
        ax.set_title(task, fontsize=9, fontweight="bold" if task == "average" else "normal")
        ax.set_xticks(xs, [length_label(L) for L in lengths], fontsize=8)
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
        if i % cols == 0:
            ax.set_ylabel("score")
    for j in range(len(panels), nrows * cols):
        axes[j // cols][j % cols].axis("off")
    last = axes[(len(panels) - 1) // cols][(len(panels) - 1) % cols]  # the average panel carries the legend
    last.legend(fontsize=6, loc="lower left", framealpha=0.8)
    fig.suptitle(a.title or f"RULER, {config}", fontsize=10)
    save_png(fig, a.png)
    print(a.png)


if __name__ == "__main__":
    main()
