#!/usr/bin/python3
"""topkv's decode speed beside llama.cpp's: one table and one plot.

Reads the run folders of `bench/peers/llama_cpp.sh run` (runs.csv and each
run's llama-bench JSON) and the output of `topkv bench decode` (decode.json,
or decode.csv, or a folder holding either; bench/decode_schema.json), and
writes to --out:

  peer.csv, peer.json  one row per (system, mode, model file, context):
                       decode tok/s (llama.cpp: the median of llama-bench's
                       repetitions, each -n tokens after the -d context;
                       topkv: the median over its timed steps), prefill tok/s
                       where measured (llama.cpp: -p N from an empty cache;
                       topkv: --fill prefill rows, context / (fill_s - build_s)),
                       GPU memory in MiB (llama.cpp: nvidia-smi's peak minus
                       the idle reading before the run, so the CUDA context is
                       in it; topkv: what its CUDA backend holds by its own
                       account, weights + KV + activations + scratch, without
                       the CUDA context) and topkv's host-side KV.
  peer.png             decode tok/s against context (log2 x), one line per
                       system and mode; GPU memory against context; prefill
                       tok/s against prompt length when measured.

It prints the ratios topkv / llama.cpp per context at the end. Rows are paired
by model file name (bench decode -m FILE labels rows with FILE's name); a
synthetic label ('synthetic llama3-8b') pairs through --alias, and a lone model
on each side pairs by itself (said so). Needs Python 3; matplotlib only for
the PNG (without it the table is still written).

    python3 bench/peers/compare.py --llama out/llama --topkv out/topkv/decode.json --out out/peer
"""
import argparse
import csv
import io
import json
import os
import statistics
import sys

PROG = "compare.py"
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
FIELDS = ["system", "mode", "model", "context", "decode_tok_s", "prefill_tok_s", "gpu_mem_mib", "gpu_mem_how",
          "host_kv_mib", "backend", "kv_type", "index", "k", "repeats", "status", "source"]
MIB = 1024.0 * 1024.0


def fail(msg):
    sys.exit(f"{PROG}: {msg}")


def ctx_label(n):
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def number(s):
    """A CSV cell as a float, or None when empty."""
    s = (s or "").strip()
    return float(s) if s else None


def row(**kw):
    r = {f: None for f in FIELDS}
    r.update(kw)
    return r


# ------------------------------------------------------------------ llama.cpp

def llama_rows(folder):
    """Rows of one `llama_cpp.sh run --out FOLDER`: every line of runs.csv, with
    the numbers from its JSON when the run ended."""
    index = os.path.join(folder, "runs.csv")
    try:
        with open(index, newline="") as f:
            runs = list(csv.DictReader(f))
    except OSError as e:
        fail(f"--llama {folder}: cannot read runs.csv ({e}); give a folder written by llama_cpp.sh run --out")
    rows = []
    for run in runs:
        base = dict(system="llama.cpp", mode=run["mode"], model=run["model"], context=int(run["context"]),
                    gpu_mem_mib=number(run.get("gpu_peak_mib")),
                    gpu_mem_how="nvidia-smi peak - idle" if number(run.get("gpu_peak_mib")) is not None else None,
                    status=run["status"], source=os.path.join(folder, run["json"]) if run.get("json") else folder)
        if run["status"] != "ok":
            rows.append(row(**base))
            continue
        try:
            with open(base["source"]) as f:
                tests = json.load(f)
        except (OSError, ValueError) as e:
            fail(f"{base['source']}: cannot read llama-bench's JSON ({e})")
        for t in tests:
            ts = t.get("samples_ts") or [t["avg_ts"]]
            r = row(**base)
            r.update(backend=t.get("backends", "").lower() or None, kv_type=t.get("type_k"), repeats=len(ts))
            if t["n_gen"] > 0 and t["n_prompt"] == 0:
                r.update(mode="decode", context=t["n_depth"], decode_tok_s=statistics.median(ts))
            elif t["n_prompt"] > 0 and t["n_gen"] == 0:
                r.update(mode="prefill", context=t["n_prompt"] + t["n_depth"], prefill_tok_s=statistics.median(ts))
            else:
                fail(f"{base['source']}: a test with n_prompt={t['n_prompt']} and n_gen={t['n_gen']}: "
                     "expected decode (-p 0) or prefill (-n 0) runs, as llama_cpp.sh run makes")
            rows.append(r)
    return rows


# ------------------------------------------------------------------ topkv

def topkv_file(path):
    if os.path.isdir(path):
        for name in ("decode.json", "decode.csv"):
            if os.path.isfile(os.path.join(path, name)):
                return os.path.join(path, name)
        fail(f"--topkv {path}: no decode.json or decode.csv in it (topkv bench decode --out-dir writes them)")
    if not os.path.isfile(path):
        fail(f"--topkv {path}: no such file")
    return path


def topkv_row(model, fill, backend, kv_type, src, mode, index, k, context, context_tokens, skipped, steps, tok_s,
              fill_s, build_s, gpu_bytes, host_bytes):
    prefill = None
    if fill == "prefill" and not skipped and fill_s - build_s > 0:
        prefill = context_tokens / (fill_s - build_s)
    return row(system="topkv", mode=mode + (f" {index}" if index else ""), model=model, context=context,
               decode_tok_s=None if skipped else tok_s, prefill_tok_s=prefill,
               gpu_mem_mib=None if gpu_bytes is None else gpu_bytes / MIB,
               gpu_mem_how=None if gpu_bytes is None else "topkv's backend account",
               host_kv_mib=None if skipped else host_bytes / MIB, backend=backend, kv_type=kv_type, index=index or None,
               k=k or None, repeats=steps, status=f"skipped: {skipped}" if skipped else "ok", source=src)


def topkv_rows(path):
    src = topkv_file(path)
    rows = []
    if src.endswith(".json"):
        try:
            with open(src) as f:
                doc = json.load(f)
            cfg, results = doc["config"], doc["results"]
        except (OSError, ValueError, KeyError) as e:
            fail(f"{src}: cannot read topkv bench decode's JSON ({e})")
        if doc.get("schema") != "topkv.bench_decode/1":
            fail(f"{src}: schema {doc.get('schema')!r}, expected 'topkv.bench_decode/1'")
        for r in results:
            g = r["memory"]["gpu"]
            rows.append(topkv_row(cfg["model"], r["fill"], r["backend"], cfg["kv_type"], src, r["mode"], r["index"],
                                  r["k"], r["context"], r["context_tokens"], r["skipped"], r["steps"], r["tok_s"],
                                  r["fill_s"], r["build_s"], sum(g.values()) if g else None,
                                  r["memory"]["kv_host_bytes"]))
        return rows
    try:
        with open(src, newline="") as f:
            lines = list(csv.DictReader(f))
    except OSError as e:
        fail(f"{src}: cannot read ({e})")
    gpu_cols = ["gpu_weights_bytes", "gpu_kv_cache_bytes", "gpu_activations_bytes", "gpu_scratch_bytes"]
    for r in lines:
        try:
            g = [number(r[c]) for c in gpu_cols]
            rows.append(topkv_row(r["model"], r["fill"], r["backend"], None, src, r["mode"], r["index"],
                                  int(r["k"]), int(r["context"]), int(r["context_tokens"]), r["skipped"],
                                  int(r["steps"]), float(r["tok_s"]), float(r["fill_s"]), float(r["build_s"]),
                                  None if g[0] is None else sum(g), float(r["kv_host_bytes"])))
        except (KeyError, ValueError) as e:
            fail(f"{src}: not a topkv bench decode CSV ({e})")
    return rows


# ------------------------------------------------------------------ pairing and ratios

def pair_models(rows, aliases):
    """{topkv model label: llama.cpp model file} for the ratio table."""
    ours = sorted({r["model"] for r in rows if r["system"] == "topkv"})
    theirs = sorted({r["model"] for r in rows if r["system"] == "llama.cpp"})
    pairs = {m: m for m in ours if m in theirs}
    for a in aliases:
        label, _, file = a.partition("=")
        if not file or label not in ours or file not in theirs:
            fail(f"--alias {a!r}: expected TOPKV_MODEL=LLAMA_MODEL with one of {ours} and one of {theirs}")
        pairs[label] = file
    if not pairs and len(ours) == 1 and len(theirs) == 1:
        print(f"note: pairing topkv's '{ours[0]}' with llama.cpp's '{theirs[0]}' (the only model on each side; "
              "--alias makes it explicit)")
        pairs[ours[0]] = theirs[0]
    return pairs


def decode_rows(rows):
    """The rows whose decode figure is compared and plotted. A --fill prefill
    run also times a few decode steps; where a run of more steps (the
    synthetic fill's) has the same system, model, mode and context, its
    figure is the one that counts."""
    key = lambda r: (r["system"], r["model"], r["mode"], r["context"])
    ok = [r for r in rows if r["status"] == "ok" and r["decode_tok_s"]]
    most = {}
    for r in ok:
        most[key(r)] = max(most.get(key(r), 0), r.get("repeats") or 0)
    return [r for r in ok if (r.get("repeats") or 0) >= most[key(r)]]


def ratio_rows(rows, pairs):
    out = []
    counted = {id(r) for r in decode_rows(rows)}
    for label, file in sorted(pairs.items()):
        peer = {(r["mode"], r["context"]): r for r in rows
                if r["system"] == "llama.cpp" and r["model"] == file and r["status"] == "ok"}
        for r in rows:
            if r["system"] != "topkv" or r["model"] != label or r["status"] != "ok":
                continue
            for kind, peer_mode in (("decode", "decode"), ("prefill", "prefill")):
                if kind == "decode" and id(r) not in counted:
                    continue
                mine, other = r[f"{kind}_tok_s"], peer.get((peer_mode, r["context"]))
                if mine and other and other[f"{kind}_tok_s"]:
                    out.append(dict(kind=kind, model=file, topkv_mode=r["mode"], context=r["context"],
                                    topkv_tok_s=mine, llama_tok_s=other[f"{kind}_tok_s"],
                                    ratio=mine / other[f"{kind}_tok_s"]))
    return out


def print_ratios(ratios):
    if not ratios:
        print("no ratios: no topkv row has a llama.cpp row of the same model and context")
        return
    for kind in ("decode", "prefill"):
        sel = [x for x in ratios if x["kind"] == kind]
        for model in sorted({x["model"] for x in sel}):
            rs = [x for x in sel if x["model"] == model]
            modes = sorted({x["topkv_mode"] for x in rs})
            print(f"\n{kind} tok/s, topkv / llama.cpp ({model}):")
            print(f"{'context':>8} {'llama.cpp':>10}" + "".join(f" {m:>24}" for m in modes))
            for ctx in sorted({x["context"] for x in rs}):
                at = {x["topkv_mode"]: x for x in rs if x["context"] == ctx}
                base = next(iter(at.values()))["llama_tok_s"]
                cells = [f"{at[m]['topkv_tok_s']:9.1f} ({at[m]['ratio']:5.2f}x)" if m in at else "-" for m in modes]
                print(f"{ctx_label(ctx):>8} {base:10.1f}" + "".join(f" {c:>24}" for c in cells))


# ------------------------------------------------------------------ output

def write_atomic(path, text):
    """scripts/plot_util.py's: a unique temporary beside `path`, synced and renamed."""
    sys.path.insert(0, SCRIPTS)
    from plot_util import write_atomic as write
    write(path, text)


def write_table(rows, ratios, sources, out):
    import io
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else ("" if v is None else v)) for k, v in r.items()})
    write_atomic(os.path.join(out, "peer.csv"), buf.getvalue())
    doc = {"schema": "topkv.peer_compare/1", "sources": sources, "rows": rows, "ratios": ratios}
    write_atomic(os.path.join(out, "peer.json"), json.dumps(doc, indent=1) + "\n")


def plot(rows, out):
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        print(f"{PROG}: warning: no peer.png: matplotlib is missing ({e}); the table is written", file=sys.stderr)
        return False
    sys.path.insert(0, SCRIPTS)
    from plot_util import pyplot
    plt = pyplot(PROG)
    ok = [r for r in rows if r["status"] == "ok"]
    many_models = len({r["model"] for r in ok}) > 1
    name = lambda r: f"{r['system']} {r['mode']}" + (f" [{r['model']}]" if many_models else "")
    series = {}
    for r in decode_rows(ok):
        if r["context"] > 0:
            series.setdefault(name(r), []).append(r)
    pre = {}
    for r in ok:
        if r["prefill_tok_s"]:
            pre.setdefault(name(r), []).append(r)
    panels = 3 if pre else 2
    fig, axes = plt.subplots(1, panels, figsize=(6.2 * panels, 5.2))
    style = {n: (f"C{i % 10}", "-o" if n.startswith("topkv") else "--s") for i, n in enumerate(sorted(series) +
                                                                                                sorted(set(pre) - set(series)))}

    def axis(ax, xs, ylabel):
        ax.set_xscale("log", base=2)
        if xs:
            ax.set_xticks(xs)
            ax.set_xticklabels([ctx_label(x) for x in xs], fontsize=8)
            ax.minorticks_off()
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")

    ax, mx = axes[0], axes[1]
    for n, rs in sorted(series.items()):
        rs.sort(key=lambda r: r["context"])
        c, st = style[n]
        ax.plot([r["context"] for r in rs], [r["decode_tok_s"] for r in rs], st, color=c, label=n, markersize=4)
        mem = [r for r in rs if r["gpu_mem_mib"] is not None]
        if mem:
            mx.plot([r["context"] for r in mem], [r["gpu_mem_mib"] / 1024 for r in mem], st, color=c, label=n,
                    markersize=4)
    xs = sorted({r["context"] for rs in series.values() for r in rs})
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens held when decoding starts)")
    axis(ax, xs, "decode tokens per second (median)")
    ax.set_title("decode speed", fontsize=10)
    mx.set_xlabel("context (tokens)")
    axis(mx, xs, "GPU memory (GiB)")
    mx.set_title("GPU memory: llama.cpp = nvidia-smi peak - idle;\ntopkv = its backend's account (no CUDA context)",
                 fontsize=9)
    mx.set_xlim(ax.get_xlim())
    mem = [r["gpu_mem_mib"] for rs in series.values() for r in rs if r["gpu_mem_mib"]]
    if mem and max(mem) > 20 * min(mem):  # dense KV grows with context: a log axis keeps the small ones readable
        mx.set_yscale("log")
    if not mx.get_legend_handles_labels()[0]:
        mx.text(0.5, 0.5, "no GPU memory in these rows\n(CPU runs, or no nvidia-smi)", ha="center", va="center",
                transform=mx.transAxes, fontsize=9)
        mx.set_yticks([])
    if pre:
        px = axes[2]
        for n, rs in sorted(pre.items()):
            rs.sort(key=lambda r: r["context"])
            c, st = style[n]
            px.plot([r["context"] for r in rs], [r["prefill_tok_s"] for r in rs], st, color=c, label=n, markersize=4)
        px.set_xlabel("prompt length (tokens)")
        axis(px, sorted({r["context"] for rs in pre.values() for r in rs}), "prefill tokens per second (median)")
        px.set_title("prefill speed", fontsize=10)
    missing = [r for r in rows if r["status"] != "ok"]
    notes = []
    if any(r["context"] == 0 for r in ok if r["decode_tok_s"]):
        notes.append("context 0 (empty cache) is in the table, not on the log axis")
    if missing:
        notes.append("did not run: " + "; ".join(f"{r['system']} {r['mode']} {ctx_label(r['context'])} "
                                                 f"({r['status']})" for r in missing))
    if notes:
        fig.text(0.01, 0.005, "\n".join(notes), fontsize=7, va="bottom", wrap=True)
    backends = sorted({f"{r['system']}: {r['backend']}" for r in ok if r["backend"]})
    models = sorted({r["model"] for r in ok})
    fig.suptitle(f"topkv vs llama.cpp, {', '.join(models)}  ({'; '.join(backends)})", fontsize=10)
    fig.tight_layout(rect=(0, 0.035 * len(notes), 1, 1))  # room for the notes under the axes
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    write_atomic(os.path.join(out, "peer.png"), buf.getvalue())
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama", action="append", default=[], metavar="DIR",
                    help="folder of llama_cpp.sh run --out (repeatable)")
    ap.add_argument("--topkv", action="append", default=[], metavar="PATH",
                    help="topkv bench decode's decode.json or decode.csv, or their folder (repeatable)")
    ap.add_argument("--alias", action="append", default=[], metavar="TOPKV_MODEL=LLAMA_MODEL",
                    help="pair a topkv model label with a llama.cpp model file name for the ratios")
    ap.add_argument("--out", required=True, help="folder for peer.csv, peer.json, peer.png (created)")
    ap.add_argument("--no-plot", action="store_true", help="no peer.png")
    args = ap.parse_args()
    if not args.llama and not args.topkv:
        fail("nothing to compare: give --llama DIR and/or --topkv PATH")
    rows = []
    for d in args.llama:
        rows += llama_rows(d)
    for p in args.topkv:
        rows += topkv_rows(p)
    rows.sort(key=lambda r: (r["model"], r["system"], r["mode"], r["context"]))
    ratios = ratio_rows(rows, pair_models(rows, args.alias))
    os.makedirs(args.out, exist_ok=True)
    write_table(rows, ratios, {"llama": args.llama, "topkv": args.topkv}, args.out)
    drawn = not args.no_plot and plot(rows, args.out)
    print(f"{len(rows)} rows -> {os.path.join(args.out, 'peer.csv')}, peer.json" + (", peer.png" if drawn else ""))
    print_ratios(ratios)


if __name__ == "__main__":
    main()
