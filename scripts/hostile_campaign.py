#!/usr/bin/python3
"""Hostile-input campaign against a topkv binary (issue 17): each case is run
with a timeout and classified as a clear error, a silent acceptance (exit 0,
or a failure only after the work), a crash (signal, `terminate called`, an
internal error), a hang (still running after its timeout, 15-30 s) or a loss (a file of
the user's changed or a temporary left behind). Prints one row per family.

    scripts/hostile_campaign.py build/bin/topkv [--json out.json] [-v]

Uses tiny synthetic models (`topkv model synth`) in a scratch folder; a run
takes a minute or two. Compare two binaries by running it on each.
"""
import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time


class Campaign:
    def __init__(self, binary, tmp, verbose):
        self.bin, self.tmp, self.verbose = binary, tmp, verbose
        self.rows = {}  # family -> counters

    def path(self, name):
        return os.path.join(self.tmp, name)

    def run(self, args, timeout=30, env=None, shell_prefix=""):
        cmd = shell_prefix + "exec " + self.bin + " " + args  # exec: a timeout kills topkv itself
        try:
            p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout, env=env,
                               errors="replace")
            return p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired:
            return None, "", "(timed out)"

    def record(self, family, name, outcome, detail=""):
        r = self.rows.setdefault(family, {"cases": 0, "clear": 0, "silent": 0, "crash": 0, "hang": 0, "loss": 0})
        r["cases"] += 1
        r[outcome] += 1
        if self.verbose or outcome != "clear":
            print(f"  [{outcome:6}] {family}: {name}  {detail[:160]}", file=sys.stderr)

    def expect_error(self, family, name, args, timeout=30, shell_prefix="", must_not_exist=(), rc0_ok=False):
        rc, out, err = self.run(args, timeout, shell_prefix=shell_prefix)
        lost = [f for f in must_not_exist if os.path.exists(f)]
        for f in lost:
            os.remove(f)
        if rc is None:
            self.record(family, name, "hang")
        elif rc < 0 or rc >= 128 or "terminate called" in err or "internal error" in err or "Sanitizer" in err:
            self.record(family, name, "crash", f"rc={rc} {err.strip()[-200:]}")
        elif rc == 0 and not (rc0_ok and not lost):
            self.record(family, name, "silent", f"rc=0 {('wrote ' + ', '.join(lost)) if lost else ''}")
        elif lost:
            self.record(family, name, "loss", f"rc={rc} but wrote {lost}")
        else:
            self.record(family, name, "clear", err.strip().splitlines()[0] if err.strip() else "")


def patch_gguf(src, dst, key, type_code, value_bytes):
    d = bytearray(open(src, "rb").read())
    i = d.index(key.encode()) + len(key)
    assert struct.unpack("<I", d[i:i + 4])[0] == type_code
    d[i + 4:i + 8] = value_bytes
    open(dst, "wb").write(d)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("--json")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="topkv_hostile_")
    c = Campaign(os.path.abspath(a.binary), tmp, a.verbose)
    try:
        run_all(c)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'family':<34} {'cases':>5} {'clear':>5} {'silent':>6} {'crash':>5} {'hang':>5} {'loss':>5}")
    for fam, r in c.rows.items():
        print(f"{fam:<34} {r['cases']:>5} {r['clear']:>5} {r['silent']:>6} {r['crash']:>5} {r['hang']:>5} {r['loss']:>5}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(c.rows, f, indent=1)


def run_all(c):
    m, doc = c.path("m.gguf"), c.path("doc.txt")
    rc, _, err = c.run(f"model synth --preset tiny-gemma3 -q -o {m}")
    assert rc == 0, err
    open(doc, "w").write("The keeper wrote in his log every night. The sea was calm. The secret word is amber. " * 3)
    gen = f"generate -m {m} -p hello -n 2 "
    pack = c.path("p.tkv")
    rc, _, err = c.run(f"index build -m {m} -f {doc} -o {pack} --index multipole --k 8 --window 4 --sinks 2 -q")
    assert rc == 0, err

    F = "1 policy values (options)"
    for v in ["2", "-1", "nan", "inf", "1e308"]:
        c.expect_error(F, f"--threshold {v}", gen + f"--attn topk --index multipole --window 2 --threshold {v}")
    for opt in ["--ef -1", "--nprobe -1", "-c -1", "-c 0", "--window 2147483647", "--sinks 2147483647",
                "--heads-sparsity 1.5", "--k-fraction nan", "--heads-threshold inf", "--k 0"]:
        c.expect_error(F, opt, gen + "--attn topk " + opt)
    out = c.path("bad.tkv")
    c.expect_error(F, "index build --threshold 2", f"index build -m {m} -f {doc} -o {out} --threshold 2 -q",
                   must_not_exist=[out])
    c.expect_error(F, "index build --window -1", f"index build -m {m} -f {doc} -o {out} --window -1 -q",
                   must_not_exist=[out])

    F = "1 policy values (--config JSON)"
    for j in ['{"window": 4294967297}', '{"sinks": 2.9}', '{"gqa": "banana"}', '{"threshold": 2}',
              '{"k": -5}', '{"stage_rows": 1}', '{"ef": -1}', '{"heads_sparsity": 7}', '{"k": 1e999}', '[1,2]']:
        cfg = c.path("cfg.json")
        open(cfg, "w").write(j)
        c.expect_error(F, j, gen + f"--attn topk --config {cfg}")

    F = "3 thread counts"
    for v in ["-1", "1000000", "99999", "4097"]:
        c.expect_error(F, f"--threads {v}", gen + f"--threads {v}")
    c.expect_error(F, "index build --threads 1000000", f"index build -m {m} -f {doc} -o {out} --threads 1000000 -q",
                   must_not_exist=[out])

    F = "4 FIFOs, folders, devices as inputs"
    fifo = c.path("fifo")
    os.mkfifo(fifo)
    # tokenize accepts an empty text: a FIFO nobody writes must only not hang it.
    c.expect_error("4 FIFOs, folders, devices as inputs", "tokenize -f FIFO (no writer)", f"tokenize -m {m} -f {fifo}",
                   timeout=15, rc0_ok=True)
    for name, args in [("model FIFO", f"generate -m {fifo} -p hi -n 1"),
                       ("prompt FIFO (no writer)", f"generate -m {m} -f {fifo} -n 1"),
                       ("config FIFO", gen + f"--attn topk --config {fifo}"),
                       ("pack FIFO", f"generate -m {m} --pack {fifo} -n 1"),
                       ("heads FIFO", gen + f"--attn topk --heads {fifo}"),
                       ("index info FIFO", f"index info {fifo}"),
                       ("prompt folder", f"generate -m {m} -f {c.tmp} -n 1"),
                       ("model folder", f"generate -m {c.tmp} -p hi -n 1"),
                       ("model /dev/null", "generate -m /dev/null -p hi -n 1"),
                       ("model /dev/zero", "generate -m /dev/zero -p hi -n 1"),
                       ("kv dump -f FIFO", f"kv dump -m {m} -f {fifo} -o {c.path('d.safetensors')}"),
                       ("bench recall --dump FIFO", f"bench recall --dump {fifo} --quiet")]:
        c.expect_error(F, name, args, timeout=15)

    F = "5 mapped file truncated in use"
    big = c.path("big.gguf")
    shutil.copy(m, big)
    p = subprocess.Popen(f"{c.bin} generate -m {big} -p hello -n 100000 -c 100000 --threads 1", shell=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    os.truncate(big, 4096)
    try:
        _, err = p.communicate(timeout=60)
        rc = p.returncode
        if rc == 1 and "truncated or changed" in err:
            c.record(F, "truncate during generate", "clear", err.strip()[:120])
        elif rc is not None and (rc < 0 or rc >= 128 or "terminate" in err):
            c.record(F, "truncate during generate", "crash", f"rc={rc}")
        elif rc == 0:
            c.record(F, "truncate during generate", "silent")
        else:
            c.record(F, "truncate during generate", "clear", err.strip()[:120])
    except subprocess.TimeoutExpired:
        p.kill()
        c.record(F, "truncate during generate", "hang")
    # rewritten in place while an output is being made
    shutil.copy(m, big)
    js = c.path("stats.json")
    p = subprocess.Popen(f"{c.bin} generate -m {big} -p hello -n 3000 -c 4000 --threads 1 --json {js}", shell=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    with open(big, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(b"\x00" * 8)
    _, err = p.communicate(timeout=120)
    outcome = "clear" if p.returncode == 1 and not os.path.exists(js) else ("silent" if p.returncode == 0 else "crash")
    c.record(F, "rewrite in place during generate --json", outcome, f"rc={p.returncode}")

    F = "6 output temporaries"
    victim = c.path("victim.txt")
    for name, target, args in [
            ("pack .tmp symlink", c.path("q.tkv"), f"index build -m {m} -f {doc} -o {c.path('q.tkv')} -q"),
            ("synth .tmp symlink", c.path("s.gguf"), f"model synth --preset tiny-llama -q -o {c.path('s.gguf')}"),
            ("kv dump .tmp symlink", c.path("k.st"), f"kv dump -m {m} -f {doc} -o {c.path('k.st')}"),
            ("--json .tmp symlink", c.path("g.json"), gen + f"--json {c.path('g.json')}")]:
        open(victim, "w").write("precious")
        tmp_link = target + ".tmp"
        if os.path.lexists(tmp_link):
            os.remove(tmp_link)
        os.symlink(victim, tmp_link)
        rc, _, err = c.run(args)
        intact = open(victim, "rb").read() == b"precious" and os.path.islink(tmp_link)
        if rc is None:
            c.record(F, name, "hang")
        elif not intact:
            c.record(F, name, "loss", f"rc={rc}: the symlinked file was changed or the link removed")
        elif rc != 0:
            c.record(F, name, "silent", f"rc={rc} {err.strip()[:100]}")
        else:
            c.record(F, name, "clear", "written; the symlink's target untouched")
        if os.path.lexists(tmp_link):
            os.remove(tmp_link)
    # a user's own file at the old temporary name, with a build that fails
    mine = c.path("own.tkv.tmp")
    open(mine, "w").write("my notes")
    rc, _, _ = c.run(f"index build -m {m} -f {doc} -o {c.path('own.tkv')} --index nosuch -q")
    c.record(F, "own .tmp kept when the build fails", "clear" if os.path.exists(mine) else "loss")
    rc, _, _ = c.run(f"index build -m {m} -f {doc} -o {c.path('own.tkv')} -q")
    c.record(F, "own .tmp kept when the build succeeds", "clear" if os.path.exists(mine) else "loss")
    strays = [f for f in os.listdir(c.tmp) if f.startswith(".")]
    c.record(F, "no temporaries left", "clear" if not strays else "loss", " ".join(strays))

    F = "7 non-finite / absurd values"
    for v, label in [(float("nan"), "nan"), (0.0, "0"), (-1.0, "-1"), (float("inf"), "inf"), (1.0, "1")]:
        bad = c.path("rope.gguf")
        patch_gguf(m, bad, "gemma3.rope.freq_base", 6, struct.pack("<f", v))
        c.expect_error(F, f"rope.freq_base {label}", f"generate -m {bad} -p hello -n 4")
    bad = c.path("eps.gguf")
    patch_gguf(m, bad, "gemma3.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", float("nan")))
    c.expect_error(F, "rms epsilon nan", f"generate -m {bad} -p hello -n 4")
    # Inf in a pack's sink values, re-sealed past the checksum
    data = bytearray(open(pack, "rb").read())
    hlen = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + hlen])
    name = next(k for k in header if k.endswith("sinks_v"))
    b0, b1 = header[name]["data_offsets"]
    base = 8 + hlen
    sums = json.loads(header["__metadata__"]["topkv.checksums"])
    data[base + b0:base + b0 + 4] = struct.pack("<f", float("inf"))
    new_sum = checksum64(bytes(data[base + b0:base + b1]), c)
    if new_sum:
        data = data.replace(sums[name].encode(), new_sum.encode(), 1)
        inf_pack = c.path("inf.tkv")
        open(inf_pack, "wb").write(data)
        c.expect_error(F, "Inf sinks_v: index info --verify", f"index info --verify {inf_pack}")
        c.expect_error(F, "Inf sinks_v: generate --pack", f"generate -m {m} --pack {inf_pack} -n 4")
    # NaN key in a KV dump
    dump = c.path("kv.safetensors")
    rc, _, err = c.run(f"bench recall --synthetic --n-keys 3000 --head-dim 64 --queries 4 --index flat --quiet "
                       f"--save-dump {dump}")
    if rc == 0:
        d = bytearray(open(dump, "rb").read())
        hlen = struct.unpack("<Q", d[:8])[0]
        h = json.loads(d[8:8 + hlen])
        k0 = h["layer0.keys"]["data_offsets"][0]
        d[8 + hlen + k0 + 2 * 777:8 + hlen + k0 + 2 * 777 + 2] = b"\x00\x7e"
        open(dump, "wb").write(d)
        c.expect_error(F, "NaN key in a KV dump", f"bench recall --dump {dump} --index flat --quiet")

    F = "8 output paths checked before work"
    plain = doc
    out = c.path("o.tkv")
    c.expect_error(F, "index build --json under a file", f"index build -m {m} -f {doc} -o {out} -q --json {plain}/x.json",
                   must_not_exist=[out])
    c.expect_error(F, "index build -o under a file", f"index build -m {m} -f {doc} -o {plain}/x.tkv -q")
    c.expect_error(F, "kv dump -o under a file", f"kv dump -m {m} -f {doc} -o {plain}/d.safetensors")
    c.expect_error(F, "generate --json under a file", gen + f"--json {plain}/x.json")
    c.expect_error(F, "bench recall --csv under a file",
                   f"bench recall --synthetic --n-keys 2000 --head-dim 64 --quiet --csv {plain}/x.csv")
    c.expect_error(F, "-o is a folder", f"index build -m {m} -f {doc} -o {c.tmp} -q")
    miss = c.path("new/sub/x.json")
    rc, _, _ = c.run(f"index build -m {m} -f {doc} -o {c.path('n.tkv')} -q --json {miss}")
    c.record(F, "--json into a missing folder (created)", "clear" if rc == 0 and os.path.exists(miss) else "silent",
             f"rc={rc}")

    F = "9 raw internal errors / sizes"
    bad = c.path("blocks.gguf")
    patch_gguf(m, bad, "gemma3.block_count", 4, struct.pack("<I", 2 ** 31 - 1))
    c.expect_error(F, "block_count 2^31-1", f"generate -m {bad} -p hi -n 1")
    patch_gguf(m, bad, "gemma3.embedding_length", 4, struct.pack("<I", 2 ** 31 - 1))
    c.expect_error(F, "embedding_length 2^31-1", f"generate -m {bad} -p hi -n 1")
    c.expect_error(F, "--window 2147483647 (plan)", gen + "--attn topk --window 2147483647 --sinks 2147483647")
    c.expect_error(F, "bench recall --n-keys 1e12", "bench recall --synthetic --n-keys 1000000000000 --quiet")
    c.expect_error(F, "bench recall --n-keys 2e7 under ulimit -v 4G",
                   "bench recall --synthetic --n-keys 20000000 --quiet --index flat",
                   shell_prefix="ulimit -v 4000000; ")
    c.expect_error(F, "generate -c 1e9 (plan)", gen + "-c 1000000000")
    c.expect_error(F, "generate -f <folder>", f"generate -m {m} -f {c.tmp} -n 1")


M64 = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
                      0x27D4EB2F165667C5)


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def _round(acc, x):
    return (_rotl((acc + x * P2) & M64, 31) * P1) & M64


def _hash_block(p, seed):
    """src/common/checksum.cpp's hash_block."""
    n = len(p)
    a = [(seed + P1 + P2) & M64, (seed + P2) & M64, seed & M64, (seed - P1) & M64]
    i = 0
    while i + 32 <= n:
        for lane in range(4):
            a[lane] = _round(a[lane], struct.unpack_from("<Q", p, i + 8 * lane)[0])
        i += 32
    h = (_rotl(a[0], 1) + _rotl(a[1], 7) + _rotl(a[2], 12) + _rotl(a[3], 18)) & M64
    for x in a:
        h = ((h ^ _round(0, x)) * P1 + P4) & M64
    h = (h + n) & M64
    while i + 8 <= n:
        h = (_rotl(h ^ _round(0, struct.unpack_from("<Q", p, i)[0]), 27) * P1 + P4) & M64
        i += 8
    while i < n:
        h = (_rotl(h ^ ((p[i] * P5) & M64), 11) * P1) & M64
        i += 1
    h ^= h >> 33
    h = (h * P2) & M64
    h ^= h >> 29
    h = (h * P3) & M64
    h ^= h >> 32
    return h


def checksum64(data, c=None):
    """src/common/checksum.cpp's checksum64 (1 MiB blocks, each hashed with its number, then the hashes)."""
    block = 1 << 20
    hashes = [_hash_block(data[lo:lo + block], b) for b, lo in enumerate(range(0, len(data), block))]
    return f"{_hash_block(b''.join(struct.pack('<Q', h) for h in hashes), len(data)):016x}"


if __name__ == "__main__":
    main()
