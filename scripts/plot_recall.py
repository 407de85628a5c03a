#!/usr/bin/python3
"""Recall against queries per second for `topkv bench recall --json` results.

One line per index spec: its Pareto front (no other point of the same spec is
both more accurate and faster), drawn over all its points, in the manner of
ann-benchmarks (x: recall, y: QPS on a log scale; up and to the right is
better). Run by `topkv bench recall --png FILE`, or by hand:

    scripts/plot_recall.py --json results.json --out recall.png [--metric recall|mass]

Needs matplotlib (Debian: python3-matplotlib) and uses its Agg backend,
so no display is required.
"""
import argparse
import sys

from plot_util import load_results, pyplot, save_png


def pareto_front(points):
    """Points (x, y) not dominated by another with x >= and y >= (one strictly)."""
    front, best_y = [], float("-inf")
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if y > best_y:
            front.append((x, y))
            best_y = y
    return sorted(front)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="results of topkv bench recall --json")
    ap.add_argument("--out", required=True, help="PNG file to write")
    ap.add_argument("--metric", choices=["recall", "mass"], default="recall",
                    help="x axis: recall@k (default) or attention-mass recall")
    args = ap.parse_args()

    plt = pyplot("plot_recall.py")
    rows, data, cfg = load_results("plot_recall.py", args.json, "results", "data", "config")
    k = cfg["k"]
    if not rows:
        sys.exit("plot_recall.py: the results hold no rows to plot")

    key = "recall" if args.metric == "recall" else "mass_recall"
    label = f"recall@{k}" if args.metric == "recall" else "attention-mass recall"
    series = {}
    for r in rows:
        series.setdefault(r["index"], []).append((r[key]["mean"], r["qps"]))

    fig, ax = plt.subplots(figsize=(8, 5.5))
    for i, (name, pts) in enumerate(series.items()):
        color = f"C{i % 10}"
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], color=color, alpha=0.3, s=14)
        front = pareto_front(pts)
        ax.plot([p[0] for p in front], [p[1] for p in front], "-o", color=color, label=name, markersize=4)
    ax.set_yscale("log")
    ax.set_xlabel(f"{label} (mean over query heads)")
    ax.set_ylabel("queries per second, one thread (log)")
    ax.set_title(f"{data['n_keys']} keys x {data['head_dim']} ({data['dtype']}), GQA group {data['group']}, "
                 f"{data['n_queries']} decode steps", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    save_png(fig, args.out)


if __name__ == "__main__":
    main()
