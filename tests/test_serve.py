#!/usr/bin/env python3
"""`topkv serve` end to end, as clients use it: a tiny synthetic model
(`topkv model synth --preset tiny-gemma3`) and a context pack built from it,
the server on a free loopback port (--port 0), and
  - the `openai` Python package: completions, chat, streaming of both;
  - the same tokens as `topkv generate` for the same prompt (greedy), plain
    and from a pack (named, and found by the prompt's prefix);
  - 24 concurrent clients: each answered 200, or 429 with Retry-After;
  - a client that disconnects mid-stream: the server cancels its decode and
    answers the next request;
  - bad input: malformed JSON, wrong types, unknown context, a prompt past the
    context, max_tokens over the limit, a body over the size limit: 4xx with
    an OpenAI-style error body, and the server still up.
Usage: test_serve.py TOPKV_BINARY [CASE]. The `openai` package must be
importable (scripts/test.sh installs it into the build folder and CTest sets
PYTHONPATH); without it the test fails, saying so."""
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

TOPKV = sys.argv[1]
CASE = sys.argv[2] if len(sys.argv) > 2 else "all"
try:
    import openai
except ImportError as e:
    sys.exit(f"FAIL: the openai package is not importable ({e}); scripts/test.sh installs it with pip into "
             f"build/pydeps (set PYTHONPATH to it)")

TMP = tempfile.mkdtemp(prefix="topkv_serve_")
MODEL = os.path.join(TMP, "tiny.gguf")
PACK = os.path.join(TMP, "doc.tkv")
DOC = "The quick brown fox jumps over the lazy dog. " * 6
PROMPT = "Once upon a time"


def run(args, **kw):
    r = subprocess.run([TOPKV] + args, capture_output=True, text=True, timeout=120, **kw)
    if r.returncode != 0:
        sys.exit(f"FAIL: topkv {' '.join(args)}: {r.stderr}")
    return r.stdout


def generate(prompt, n, extra=()):
    out = run(["generate", "-m", MODEL, "-p", prompt, "-n", str(n), "--temp", "0", "-q"] + list(extra))
    return out[:-1] if out.endswith("\n") else out  # generate ends the text with a newline


class Server:
    def __init__(self, *extra):
        self.p = subprocess.Popen([TOPKV, "serve", "-m", MODEL, "--port", "0", "-c", "512", "--max-tokens-limit",
                                   "200", "--temp", "0"] + list(extra),
                                  stderr=subprocess.PIPE, text=True)
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.p.stderr.readline()
            if not line:
                break
            m = re.search(r"on http://127\.0\.0\.1:(\d+)/v1", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.p.kill()
            sys.exit("FAIL: the server did not say its port: " + self.p.stderr.read())
        threading.Thread(target=self.p.stderr.read, daemon=True).start()  # drain its lines
        self.base = f"http://127.0.0.1:{self.port}"

    def client(self):
        return openai.OpenAI(base_url=self.base + "/v1", api_key="none", max_retries=0, timeout=60)

    def request(self, method, path, body=None, raw=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        text = r.read().decode()
        c.close()
        return r.status, dict(r.getheaders()), text

    def alive(self):
        assert self.p.poll() is None, "the server died"
        assert self.request("GET", "/health")[0] == 200

    def close(self):
        self.p.terminate()
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            sys.exit("FAIL: the server did not stop on SIGTERM")


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def case_openai(s):
    c = s.client()
    want = generate(PROMPT, 12)
    r = c.completions.create(model="x", prompt=PROMPT, max_tokens=12, temperature=0)
    check(r.choices[0].text == want, f"completion {r.choices[0].text!r} != generate {want!r}")
    check(r.usage.completion_tokens <= 12 and r.usage.prompt_tokens > 0, f"usage {r.usage}")
    streamed = "".join(ch.choices[0].text for ch in
                       c.completions.create(model="x", prompt=PROMPT, max_tokens=12, temperature=0, stream=True))
    check(streamed == want, f"streamed {streamed!r} != {want!r}")
    chat_want = generate("Hello there", 10, ["--chat"])
    r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hello there"}], max_tokens=10)
    check(r.choices[0].message.content == chat_want, f"chat {r.choices[0].message.content!r} != {chat_want!r}")
    parts = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Hello there"}], max_tokens=10, stream=True)]
    check("".join(parts) == chat_want, f"chat stream {''.join(parts)!r} != {chat_want!r}")
    r = c.chat.completions.create(model="x", max_tokens=5, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again"}])
    check(r.choices[0].finish_reason in ("stop", "length"), "a multi-turn chat is answered")
    models = c.models.list()
    check(models.data[0].id == "tiny.gguf", f"models {models}")
    status, _, text = s.request("GET", "/metrics")
    check(status == 200 and 'topkv_requests_total{status="200"}' in text and "topkv_generated_tokens_total" in text
          and "topkv_resident_memory_bytes" in text and "topkv_queue_length 0" in text, "metrics:\n" + text)


def case_pack(s):
    c = s.client()
    want = run(["generate", "-m", MODEL, "--pack", PACK, "-p", " And then", "-n", "10", "--temp", "0", "-q"])[:-1]
    r = c.completions.create(model="x", prompt=" And then", max_tokens=10, extra_body={"topkv_context": "doc"})
    check(r.choices[0].text == want, f"named pack {r.choices[0].text!r} != generate --pack {want!r}")
    check(r.usage.prompt_tokens > 40, "the pack's tokens count as prompt tokens")
    # The prompt repeats the pack's text: the pack is found and reused.
    status, _, text = s.request("GET", "/v1/models")
    r = c.completions.create(model="x", prompt=DOC + " And then", max_tokens=10)
    check(r.choices[0].text == want, f"prefix reuse {r.choices[0].text!r} != {want!r}")
    # Per request within what the pack allows: k, and an index built into it.
    r = c.completions.create(model="x", prompt=" And then", max_tokens=4,
                             extra_body={"topkv_context": "doc", "topkv_k": 8, "topkv_index": "flat"})
    check(len(r.choices[0].text) >= 0, "k and index per request")
    status, _, text = s.request("POST", "/v1/completions", {"prompt": "x", "topkv_context": "doc",
                                                            "topkv_index": "hnswlib"})
    check(status == 400 and "holds the indexes" in json.loads(text)["error"]["message"], text)


def case_concurrent(s):
    results, lock = [], threading.Lock()

    def one(i):
        status, headers, text = s.request("POST", "/v1/completions",
                                          {"prompt": f"Client {i} says", "max_tokens": 24, "temperature": 0})
        with lock:
            results.append((status, headers, text))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    check(not any(t.is_alive() for t in threads), "a client hung")
    check(len(results) == 24, f"{len(results)} of 24 answered")
    ok = [r for r in results if r[0] == 200]
    busy = [r for r in results if r[0] in (429, 503)]
    check(len(ok) + len(busy) == 24, f"statuses {[r[0] for r in results]}")
    check(len(ok) >= 3, f"only {len(ok)} served")  # --queue 2: the one decoding and two waiting at least
    for status, headers, text in busy:
        check("Retry-After" in headers and json.loads(text)["error"]["code"] == "queue_full", text)
    for status, headers, text in ok:
        check(json.loads(text)["choices"][0]["finish_reason"] in ("stop", "length"), text)
    s.alive()


def case_disconnect(s):
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
    body = json.dumps({"prompt": PROMPT, "max_tokens": 200, "stream": True, "temperature": 0})
    sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    got = b""
    while got.count(b"data: ") < 3:
        chunk = sock.recv(4096)
        check(chunk, "the stream ended early")
        got += chunk
    sock.close()  # gone mid-stream
    t0 = time.time()
    r = s.client().completions.create(model="x", prompt=PROMPT, max_tokens=5)
    check(r.choices[0].finish_reason in ("stop", "length"), "the next request is served")
    deadline = time.time() + 30
    while time.time() < deadline:
        m = re.search(r"topkv_generated_tokens_total (\d+)", s.request("GET", "/metrics")[2])
        if m and int(m.group(1)) < 200:
            break
        time.sleep(0.2)
    check(m and int(m.group(1)) < 200 + 5, f"the abandoned stream was not cancelled (generated {m and m.group(1)})")
    # The same for a request that is not streamed: the client sends it and leaves.
    before = int(re.search(r"topkv_generated_tokens_total (\d+)", s.request("GET", "/metrics")[2]).group(1))
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
    body = json.dumps({"prompt": PROMPT, "max_tokens": 200, "temperature": 0})
    sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    sock.close()
    r = s.client().completions.create(model="x", prompt=PROMPT, max_tokens=5)  # queued behind it
    check(r.choices[0].finish_reason in ("stop", "length"), "the request after the abandoned one is served")
    after = int(re.search(r"topkv_generated_tokens_total (\d+)", s.request("GET", "/metrics")[2]).group(1))
    check(after - before < 200, f"the abandoned request was not cancelled ({after - before} tokens generated)")
    s.alive()


def case_bad_input(s):
    cases = [
        ("/v1/completions", None, "{not json", 400, "invalid_json"),
        ("/v1/completions", None, "[1, 2]", 400, "invalid_json"),
        ("/v1/completions", None, '{"prompt": "x", "max_tokens": \xff\xfe}', 400, "invalid_json"),  # not UTF-8
        ("/v1/completions", None, '{"prompt": "x", "max_tokens": 4e4444}', 400, "invalid_json"),  # past a double
        ("/v1/completions", {"prompt": 5}, None, 400, "invalid_type"),
        ("/v1/completions", {}, None, 400, "missing_prompt"),
        ("/v1/completions", {"prompt": "x", "max_tokens": "ten"}, None, 400, "invalid_type"),
        ("/v1/completions", {"prompt": "x", "temperature": 9}, None, 400, "out_of_range"),
        ("/v1/completions", {"prompt": "x", "stream": "yes"}, None, 400, "invalid_type"),
        ("/v1/completions", {"prompt": "x", "topkv_context": "nope"}, None, 404, "context_not_found"),
        ("/v1/completions", {"prompt": "word " * 600}, None, 400, "context_length_exceeded"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 100000}, None, 400, "max_tokens_exceeded"),
        ("/v1/completions", {"prompt": "x", "topkv_k": 4}, None, 400, "unsupported"),
        ("/v1/chat/completions", {"messages": []}, None, 400, "missing_messages"),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, None, 400, "invalid_role"),
        ("/v1/chat/completions", {"messages": "hi"}, None, 400, "invalid_type"),
        ("/v1/completions", None, json.dumps({"prompt": "x" * 300000}), 413, None),
        ("/v1/nothing", {"prompt": "x"}, None, 404, None),
    ]
    for path, body, raw, want, code in cases:
        status, _, text = s.request("POST", path, body, raw)
        check(status == want, f"{path} {(json.dumps(body) if body is not None else raw)[:60]!r}: {status} (want {want}): {text}")
        err = json.loads(text)["error"]
        check(err["type"] and err["message"] and "param" in err, text)
        if code:
            check(err["code"] == code, f"code {err['code']} (want {code}): {text}")
        s.alive()


def main():
    run(["model", "synth", "--preset", "tiny-gemma3", "-q", "-o", MODEL])
    run(["index", "build", "-m", MODEL, "-p", DOC, "-o", PACK, "--index", "multipole", "--index", "flat",
         "--k", "16", "--window", "8", "-q"])
    cases = {"openai": (case_openai, ()), "pack": (case_pack, ("--pack", "doc=" + PACK)),
             "concurrent": (case_concurrent, ("--queue", "2")), "disconnect": (case_disconnect, ()),
             "bad_input": (case_bad_input, ("--max-body", "100000", "--pack", "doc=" + PACK))}
    for name, (fn, extra) in cases.items():
        if CASE not in ("all", name):
            continue
        s = Server(*extra)
        try:
            fn(s)
            s.alive()
        except AssertionError as e:
            s.close()
            sys.exit(f"FAIL {name}: {e}")
        s.close()
        print(f"ok {name}")


main()
