#!/usr/bin/python3
"""CTest `test_peer_compare`: bench/peers/compare.py on the fixture files in
tests/data/peers/ (a llama_cpp.sh run folder and topkv bench decode's JSON and
CSV of the same runs, from a CPU run of a synthetic llama GGUF). Checks the
table it writes against numbers worked out here from the fixtures: medians of
llama-bench's repetitions, topkv's prefill rate, GPU memory, the rows that did
not run, the ratios; that the JSON and CSV of topkv give the same rows; and
that bad inputs fail with a message. The PNG is checked when matplotlib is
there. Exit 0: passed; 1: failed; 77: skipped (no usable python3)."""
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = os.path.join(HERE, "data", "peers")
COMPARE = os.path.join(ROOT, "bench", "peers", "compare.py")
FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print(f"FAILED: {what}")


def close(a, b, rel=1e-4):
    return a is not None and b is not None and abs(a - b) <= rel * max(abs(a), abs(b))


def compare(out, *args, plot=True):
    cmd = [sys.executable, COMPARE, "--out", out, *args] + ([] if plot else ["--no-plot"])
    return subprocess.run(cmd, capture_output=True, text=True)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(s):
    return float(s) if s else None


def main():
    if sys.version_info < (3, 7):
        print("skipped: compare.py needs Python 3.7+")
        return 77
    try:
        import matplotlib  # noqa: F401
        have_mpl = True
    except ImportError:
        have_mpl = False
        print("note: no matplotlib here; checking the table only (the PNG is not drawn)")

    llama_dir = os.path.join(DATA, "llama")
    topkv_json = os.path.join(DATA, "topkv", "decode.json")
    topkv_csv = os.path.join(DATA, "topkv", "decode.csv")
    runs = read_csv(os.path.join(llama_dir, "runs.csv"))
    with open(topkv_json) as f:
        topkv = json.load(f)

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "peer")
        p = compare(out, "--llama", llama_dir, "--topkv", topkv_json, plot=have_mpl)
        print(p.stdout, p.stderr)
        check(p.returncode == 0, f"compare.py exits 0 (got {p.returncode})")
        if p.returncode != 0:
            return 1
        rows = read_csv(os.path.join(out, "peer.csv"))
        with open(os.path.join(out, "peer.json")) as f:
            doc = json.load(f)
        check(doc["schema"] == "topkv.peer_compare/1", "peer.json schema")
        check(len(doc["rows"]) == len(rows), "peer.json and peer.csv hold the same rows")

        # llama.cpp: one row per line of runs.csv; the ran ones hold the median of samples_ts.
        lrows = [r for r in rows if r["system"] == "llama.cpp"]
        check(len(lrows) == len(runs), f"one llama.cpp row per run ({len(lrows)} vs {len(runs)})")
        for run in runs:
            got = [r for r in lrows if r["mode"] == run["mode"] and int(r["context"]) == int(run["context"])]
            check(len(got) == 1, f"llama.cpp {run['mode']} {run['context']}: one row")
            if len(got) != 1:
                continue
            r = got[0]
            check(r["status"] == run["status"], f"llama.cpp {run['name']}: status {r['status']!r}")
            if run["status"] != "ok":
                check(r["decode_tok_s"] == "" and r["prefill_tok_s"] == "", f"{run['name']}: no numbers when not run")
                continue
            with open(os.path.join(llama_dir, run["json"])) as f:
                t = json.load(f)[0]
            want = statistics.median(t["samples_ts"])
            check(abs(want - t["avg_ts"]) > 1e-3 * want or len(t["samples_ts"]) < 3,
                  f"{run['name']}: fixture's median differs from its mean, so the check means something")
            col = "decode_tok_s" if run["mode"] == "decode" else "prefill_tok_s"
            check(close(num(r[col]), want), f"{run['name']}: {col} {r[col]} is the median {want}")
            check(int(r["repeats"]) == len(t["samples_ts"]), f"{run['name']}: repeats")
            if run["gpu_peak_mib"]:
                check(close(num(r["gpu_mem_mib"]), float(run["gpu_peak_mib"])), f"{run['name']}: GPU memory")
                check(r["gpu_mem_how"] == "nvidia-smi peak - idle", f"{run['name']}: how GPU memory was measured")
        check(any(r["status"] != "ok" for r in lrows), "the fixture has a run that did not finish")

        # topkv: one row per result; prefill rate from fill_s - build_s.
        trows = [r for r in rows if r["system"] == "topkv"]
        check(len(trows) == len(topkv["results"]), "one topkv row per result")
        for res in topkv["results"]:
            mode = res["mode"] + (f" {res['index']}" if res["index"] else "")
            got = [r for r in trows if r["mode"] == mode and int(r["context"]) == res["context"]]
            check(len(got) == 1, f"topkv {mode} {res['context']}: one row")
            if len(got) != 1:
                continue
            r = got[0]
            check(r["model"] == topkv["config"]["model"], f"topkv {mode}: model")
            if res["skipped"]:
                check(r["status"].startswith("skipped") and r["decode_tok_s"] == "", f"topkv {mode}: skipped row")
                continue
            check(close(num(r["decode_tok_s"]), res["tok_s"]), f"topkv {mode} {res['context']}: tok/s")
            want = res["context_tokens"] / (res["fill_s"] - res["build_s"])
            check(close(num(r["prefill_tok_s"]), want), f"topkv {mode} {res['context']}: prefill tok/s {want}")
            check(close(num(r["host_kv_mib"]), res["memory"]["kv_host_bytes"] / 2**20) or
                  (res["memory"]["kv_host_bytes"] == 0 and num(r["host_kv_mib"]) == 0), f"topkv {mode}: host KV")

        # Ratios: topkv / llama.cpp at the same model and context.
        ratios = doc["ratios"]
        check(len(ratios) > 0, "some ratios")
        for x in ratios:
            check(close(x["ratio"], x["topkv_tok_s"] / x["llama_tok_s"]), f"ratio {x}")
        paired = {(x["kind"], x["topkv_mode"], x["context"]) for x in ratios}
        lok = {(r["mode"], int(r["context"])) for r in lrows if r["status"] == "ok"}
        for r in trows:
            if r["status"] == "ok" and ("decode", int(r["context"])) in lok:
                check(("decode", r["mode"], int(r["context"])) in paired, f"ratio for topkv {r['mode']} {r['context']}")
        check("topkv / llama.cpp" in p.stdout, "the ratio table is printed")
        if have_mpl:
            png = os.path.join(out, "peer.png")
            check(os.path.isfile(png) and os.path.getsize(png) > 10000, "peer.png written")
            with open(png, "rb") as f:
                check(f.read(8) == b"\x89PNG\r\n\x1a\n", "peer.png is a PNG")

        # The CSV of the same topkv run gives the same rows (kv_type is not in the CSV).
        out2 = os.path.join(tmp, "peer_csv")
        p = compare(out2, "--llama", llama_dir, "--topkv", topkv_csv, plot=False)
        check(p.returncode == 0, f"compare.py on decode.csv exits 0: {p.stderr}")
        if p.returncode == 0:
            rows2 = read_csv(os.path.join(out2, "peer.csv"))
            check(len(rows2) == len(rows), "decode.csv and decode.json give as many rows")

            def same(x, y):  # the CSV's numbers have 6 significant digits
                try:
                    return close(float(x), float(y), 2e-5)
                except ValueError:
                    return x == y
            for r1, r2 in zip(rows, rows2):
                for k in r1:
                    if k not in ("source", "kv_type"):
                        check(same(r1[k], r2[k]), f"decode.csv vs decode.json, {r1['system']} {r1['mode']} "
                              f"{r1['context']} {k}: {r2[k]!r} vs {r1[k]!r}")

        # A run of fewer decode steps at the same mode and context (a --fill
        # prefill run's few steps) is listed but not compared: the longer run's
        # figure makes the ratio and the plot.
        short = json.loads(json.dumps(topkv))
        for res in short["results"]:
            res["steps"] = max(1, res["steps"] // 4)
            res["tok_s"] *= 0.5
        short_json = os.path.join(tmp, "short.json")
        with open(short_json, "w") as f:
            json.dump(short, f)
        out3 = os.path.join(tmp, "peer_short")
        for order in ((topkv_json, short_json), (short_json, topkv_json)):
            p = compare(out3, "--llama", llama_dir, "--topkv", order[0], "--topkv", order[1], plot=False)
            check(p.returncode == 0, f"compare.py with two runs of one model exits 0: {p.stderr}")
            if p.returncode != 0:
                continue
            with open(os.path.join(out3, "peer.json")) as f:
                doc3 = json.load(f)
            check(len(doc3["rows"]) == len(runs) + 2 * len(topkv["results"]), "both runs' rows are listed")
            want = {(r["mode"] + (f" {r['index']}" if r["index"] else ""), r["context"]): r["tok_s"]
                    for r in topkv["results"] if not r["skipped"]}
            dec = [x for x in doc3["ratios"] if x["kind"] == "decode"]
            check(len(dec) == len([x for x in ratios if x["kind"] == "decode"]), "one decode ratio per mode and context")
            for x in dec:
                check(close(x["topkv_tok_s"], want[(x["topkv_mode"], x["context"])]),
                      f"decode ratio at {x['context']} uses the run of more steps ({x['topkv_tok_s']})")

        # Bad inputs fail with a message naming what was wrong.
        p = compare(os.path.join(tmp, "bad"), "--llama", os.path.join(tmp, "nothing"), plot=False)
        check(p.returncode != 0 and "runs.csv" in p.stderr, f"a folder without runs.csv is refused: {p.stderr}")
        p = compare(os.path.join(tmp, "bad"), "--topkv", os.path.join(tmp, "none.json"), plot=False)
        check(p.returncode != 0 and "no such file" in p.stderr, f"a missing topkv file is refused: {p.stderr}")
        p = compare(os.path.join(tmp, "bad"), "--llama", llama_dir, "--topkv", topkv_json, "--alias", "x=y",
                    plot=False)
        check(p.returncode != 0 and "--alias" in p.stderr, f"an alias naming no model is refused: {p.stderr}")

    print("passed" if not FAILS else f"{len(FAILS)} checks failed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
