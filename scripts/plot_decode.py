#!/usr/bin/python3
"""Decode speed from `topkv bench decode --out-dir` results (decode.json).

Left: tokens per second against context length (both log scales), one line
per mode / index / backend; skipped rows (did not fit the memory budget) are
left out of the lines and listed under the plot. Right: one stacked bar per
row that ran, the mean split of a decode step in ms: the model outside the
override's attention, the override's host work, index search, GPU kernels,
host<->GPU copies and waiting on the GPU. The title says whether the context
was a real prefill or synthetic keys/values. Run by `topkv bench decode`, or:

    scripts/plot_decode.py --json decode.json --out decode.png

Needs matplotlib (Debian: python3-matplotlib), Agg backend (no display).
"""
import argparse
import sys

from plot_util import load_results, pyplot, save_png

PARTS = [("model", "model (outside attention)"), ("host_attn", "override host work (host-dense: all of it)"), ("search", "index search"),
         ("gpu", "GPU kernels"), ("transfer", "host<->GPU copies"), ("wait", "waiting on GPU")]


def ctx_label(n):
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="decode.json of topkv bench decode")
    ap.add_argument("--out", required=True, help="PNG file to write")
    args = ap.parse_args()
    plt = pyplot("plot_decode.py")
    rows, model, cfg, fill, machine = load_results("plot_decode.py", args.json, "results", "model", "config",
                                                    "fill", "machine")
    ran = [r for r in rows if r["skipped"] is None]
    if not ran:
        sys.exit("plot_decode.py: no row ran (all skipped); nothing to plot")

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [1, 1.3]})
    series = {}
    for r in ran:
        name = r["mode"] + (f" {r['index']}" if r["index"] else "") + f" ({r['backend']})"
        series.setdefault(name, []).append((r["context"], r["tok_s"]))
    for i, (name, pts) in enumerate(sorted(series.items())):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", color=f"C{i % 10}", label=name, markersize=4)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    contexts = sorted({r["context"] for r in rows})
    ax.set_xticks(contexts)
    ax.set_xticklabels([ctx_label(n) for n in contexts])
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("decode tokens per second (median over steps, log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    skipped = [r for r in rows if r["skipped"] is not None]
    if skipped:
        text = "skipped: " + "; ".join(f"{ctx_label(r['context'])} {r['mode']}" for r in skipped)
        ax.text(0.0, -0.16, text, transform=ax.transAxes, fontsize=7, va="top", wrap=True)

    labels = [f"{ctx_label(r['context'])} {r['mode']}" + (f"\n{r['index']}" if r["index"] else "") for r in ran]
    bottom = [0.0] * len(ran)
    for i, (key, name) in enumerate(PARTS):
        vals = [r["split_ms"][key] for r in ran]
        if not any(vals):
            continue
        bx.bar(range(len(ran)), vals, bottom=bottom, color=f"C{i}", label=name)
        bottom = [b + v for b, v in zip(bottom, vals)]
    bx.set_ylim(0, max(bottom) * 1.08)  # room above the tallest stack
    bx.set_xticks(range(len(ran)))
    bx.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    bx.set_ylabel("ms per decode step (mean)")
    bx.legend(fontsize=8, loc="upper left")
    bx.grid(True, axis="y", alpha=0.3)

    fill_text = "synthetic context (generated KV, no prefill)" if fill == "synthetic" else "prefilled passkey prompt"
    fig.suptitle(f"{cfg['model']} ({model['arch']}, {model['n_layer']} layers, {model['n_head_kv']} KV heads x "
                 f"{model['head_dim']}), {machine['backend']} backend, {machine['threads']} threads; "
                 f"{fill_text}", fontsize=10)
    save_png(fig, args.out)


if __name__ == "__main__":
    main()
