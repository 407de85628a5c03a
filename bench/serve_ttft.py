#!/usr/bin/python3
"""Time to first token of `topkv serve`, per request, as a client sees it.

Starts `topkv serve` with the given arguments on a free loopback port, waits
for /health, then sends each request in turn, streamed (server-sent events),
and writes one row per request: its name, the HTTP status, seconds to the
first streamed token, seconds in all, tokens generated and the text.

    python3 bench/serve_ttft.py --topkv build/bin/topkv --out out/ttft \\
        --request 'pack=doc:What does the parser raise?' \\
        --request 'chat:What is 2 + 2?' \\
        -- -m .models/gemma-3-270m-q4_k_m.gguf --pack doc=doc.tkv

A request is KIND:TEXT with KIND one of chat (a chat turn), completion (a
prompt), pack=NAME (a chat turn after the named context pack). Standard
library only. Writes ttft.csv and ttft.json to --out (created).
"""
import argparse
import csv
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time

PROG = "serve_ttft.py"


def fail(msg):
    sys.exit(f"{PROG}: {msg}")


def start_server(topkv, args, timeout_s):
    proc = subprocess.Popen([topkv, "serve", "--port", "0", *args], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout_s
    lines = []
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            if proc.poll() is not None:
                fail(f"topkv serve exited with {proc.returncode} before listening:\n" + "".join(lines[-20:]))
            continue
        lines.append(line)
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if m:
            # Keep reading its stderr, or a full pipe would stall the server.
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, int(m.group(1))
    proc.kill()
    fail(f"topkv serve did not say its port within {timeout_s} s:\n" + "".join(lines[-20:]))


def body_for(kind, text, max_tokens):
    body = {"max_tokens": max_tokens, "stream": True, "temperature": 0}
    if kind == "completion":
        body["prompt"] = text
    else:
        body["messages"] = [{"role": "user", "content": text}]
        if kind.startswith("pack="):
            body["topkv_context"] = kind[len("pack="):]
    return body


def timed_request(port, kind, text, max_tokens):
    path = "/v1/completions" if kind == "completion" else "/v1/chat/completions"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", path, json.dumps(body_for(kind, text, max_tokens)), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    first, pieces = None, []
    if resp.status != 200:
        return {"status": resp.status, "ttft_s": None, "total_s": time.perf_counter() - t0, "tokens": 0,
                "text": resp.read().decode(errors="replace")}
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        choice = json.loads(line[6:]).get("choices") or [{}]
        piece = choice[0].get("text") or (choice[0].get("delta") or {}).get("content") or ""
        if piece and first is None:
            first = time.perf_counter() - t0
        if piece:
            pieces.append(piece)
    total = time.perf_counter() - t0
    conn.close()
    return {"status": 200, "ttft_s": first, "total_s": total, "tokens": len(pieces), "text": "".join(pieces)}


def main():
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--topkv", default="build/bin/topkv", help="the topkv binary")
    ap.add_argument("--out", required=True, help="folder for ttft.csv and ttft.json (created)")
    ap.add_argument("--request", action="append", required=True, help="KIND:TEXT (repeat)")
    ap.add_argument("--max-tokens", type=int, default=32, help="max_tokens of every request (default 32)")
    ap.add_argument("--start-timeout", type=float, default=600, help="seconds to wait for the server (packs load)")
    ap.add_argument("serve_args", nargs=argparse.REMAINDER, help="-- then topkv serve's arguments")
    a = ap.parse_args()
    serve_args = a.serve_args[1:] if a.serve_args[:1] == ["--"] else a.serve_args
    requests = []
    for r in a.request:
        kind, sep, text = r.partition(":")
        if not sep or not (kind in ("chat", "completion") or kind.startswith("pack=")):
            fail(f"--request {r!r}: want KIND:TEXT with KIND chat, completion or pack=NAME")
        requests.append((kind, text))
    if not os.access(a.topkv, os.X_OK):
        fail(f"{a.topkv} is not an executable (build topkv first, or give --topkv)")
    os.makedirs(a.out, exist_ok=True)
    t_start = time.perf_counter()
    proc, port = start_server(a.topkv, serve_args, a.start_timeout)
    start_s = time.perf_counter() - t_start
    rows = []
    try:
        for i, (kind, text) in enumerate(requests):
            row = {"request": i, "kind": kind, "prompt": text, **timed_request(port, kind, text, a.max_tokens)}
            rows.append(row)
            ttft = "-" if row["ttft_s"] is None else f"{row['ttft_s']:.3f} s"
            print(f"{i:3d} {kind:<14} status {row['status']}  first token {ttft}  "
                  f"{row['tokens']} tokens in {row['total_s']:.3f} s  {row['text'][:60]!r}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    with open(os.path.join(a.out, "ttft.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(a.out, "ttft.json"), "w") as f:
        json.dump({"serve_args": serve_args, "server_start_s": start_s, "max_tokens": a.max_tokens, "rows": rows},
                  f, indent=1)
    print(f"server up after {start_s:.2f} s; {len(rows)} requests -> {a.out}/ttft.csv, ttft.json")


if __name__ == "__main__":
    main()
