#!/usr/bin/python3
"""Merge several `topkv eval ruler --json` results of one model into one
document: the rows of every file, one per (method, task, length, sample,
prompt seed), a later file's row replacing an earlier one's. Prompts are
seeded by the run's --seed, task, length and sample, so runs of different
methods on the same lengths and seed share their prompts and their dense
rows, and a run with another --seed adds new prompts (more samples). Prints the table `eval ruler` prints
(score per length, ratio to dense over the same prompts, agreement, KL,
tok/s); the merged JSON
draws with scripts/plot_ruler.py.

    scripts/merge_ruler.py out.json a.json b.json ...
"""
import argparse
import json
import sys
from collections import defaultdict

PROG = "merge_ruler.py"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("inputs", nargs="+")
    a = ap.parse_args()

    rows, tasks, model, seen_model = {}, [], None, None
    for path in a.inputs:
        try:
            with open(path) as f:
                doc = json.load(f)
            part, summary = doc["rows"], doc["model_summary"]
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"{PROG}: cannot read results from {path}: {e}")
        if seen_model is not None and summary != seen_model:
            sys.exit(f"{PROG}: {path} is of another model ({summary}, not {seen_model}): merge one model's runs")
        seen_model = summary
        model = doc.get("model", model)
        tasks += [t for t in doc.get("tasks", []) if t not in tasks]
        for r in part:
            rows[(r["method"], r["task"], r["length"], r["sample"], r.get("seed"))] = r
    merged = list(rows.values())
    with open(a.out, "w") as f:
        json.dump({"model": model, "model_summary": seen_model, "tasks": tasks, "sources": a.inputs,
                   "rows": merged}, f, indent=1)

    lengths = sorted({r["length"] for r in merged})
    methods = list(dict.fromkeys(r["method"] for r in merged))
    by = defaultdict(list)
    for r in merged:
        by[(r["method"], r["length"])].append(r)

    def prompt(r):
        return (r["task"], r["sample"], r.get("seed"))

    def score(m, L, only=None):  # RULER's: the mean over tasks of the mean over samples
        per = defaultdict(list)
        for r in by.get((m, L), []):
            if only is None or prompt(r) in only:
                per[r["task"]].append(r["score"])
        return sum(sum(v) / len(v) for v in per.values()) / len(per) if per else None

    def dense_on(m, L):  # dense over the prompts method m ran (runs may cover different seeds)
        return score("dense", L, {prompt(r) for r in by.get((m, L), [])})

    def mean(m, key):
        v = [r[key] for L in lengths for r in by.get((m, L), []) if m != "dense" and key in r]
        return sum(v) / len(v) if v else None

    head = f"{'method':32}" + "".join(f"{L // 1024:>7}K" for L in lengths)
    print(head + "  /dense per length" + " " * 12 + "agree   KL mean  tok/s")
    for m in methods:
        s = [score(m, L) for L in lengths]
        d = [dense_on(m, L) for L in lengths]
        cells = "".join(f"{x:8.1f}" if x is not None else "       -" for x in s)
        ratios = " ".join(f"{x / y:.3f}" if x is not None and y else "  -  " for x, y in zip(s, d))
        ag, kl, tps = mean(m, "agreement"), mean(m, "kl_mean"), mean(m, "decode_tok_per_s")
        tail = f"  {ag:.3f}  {kl:.4f} {tps:6.1f}" if ag is not None else ""
        print(f"{m:32}{cells}  {ratios:28}{tail}")


if __name__ == "__main__":
    main()
