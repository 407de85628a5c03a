#!/usr/bin/env python3
"""Records golden logits for the real Qwen2.5-Coder models from an
implementation no one in this project wrote: Hugging Face transformers, which
reads the GGUF (weights dequantised to float32 by the `gguf` package) and
builds its own Qwen2 tokenizer from the file's vocabulary and merges.

For each model: the ids transformers' tokenizer gives a ~100-token prompt (no
BOS: Qwen adds none), the top-20 logits at every position, and transformers'
greedy continuation of 20 tokens. topkv's tests compare its forward pass with
these (tests/test_model_real.cpp); its tokenizer is checked separately against
tests/data/qwen2_golden_tokens.json
(scripts/make_golden_qwen2.py).

Run where PyTorch, transformers, accelerate and gguf are installed (a CPU is
enough: `pip install --target DIR torch transformers accelerate gguf`, then
PYTHONPATH=DIR):
    python3 scripts/make_golden_qwen2_logits.py OUTDIR NAME=MODEL.gguf [NAME=MODEL.gguf ...]
e.g. qwen2.5-coder-0.5b=.models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
Writes OUTDIR/NAME_golden_logits.json for each (committed under tests/data/).
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

LOGIT_PROMPT = (
    "def quicksort(items):\n"
    "    \"\"\"Sort a list with the quicksort algorithm and return a new list.\"\"\"\n"
    "    if len(items) <= 1:\n"
    "        return items\n"
    "    pivot = items[len(items) // 2]\n"
    "    left = [x for x in items if x < pivot]\n"
    "    middle = [x for x in items if x == pivot]\n"
    "    right = [x for x in items if x > pivot]\n"
    "    return quicksort(left) + middle + quicksort(right)\n\n"
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden press."
)


def golden(model_path, device):
    d, f = os.path.dirname(os.path.abspath(model_path)), os.path.basename(model_path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    ids = tok(LOGIT_PROMPT, add_special_tokens=False)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).to(device)
    model.eval()
    print(model.config, flush=True)
    x = torch.tensor([ids], device=device)
    with torch.no_grad():
        logits = model(x).logits[0].float().cpu()
        gen = model.generate(x, max_new_tokens=20, do_sample=False)[0][len(ids):].tolist()
    top = torch.topk(logits, 20, dim=-1)
    top20 = [[[int(i), float(v)] for v, i in zip(top.values[p].tolist(), top.indices[p].tolist())]
             for p in range(len(ids))]
    cont = tok.decode(gen)
    print(f, "positions:", len(ids), "greedy continuation:", repr(cont), flush=True)
    return {"source": f"transformers {transformers.__version__} (torch {torch.__version__}, {device}), "
                      f"ids from transformers' tokenizer of {f}",
            "model": f, "dtype": "float32", "prompt": LOGIT_PROMPT, "ids": ids, "top20": top20,
            "greedy_continuation_ids": gen, "greedy_continuation": cont}


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    # TF32 would change float32 matmuls by ~1e-3: keep true fp32.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for spec in sys.argv[2:]:
        name, path = spec.split("=", 1)
        out = golden(path, device)
        with open(os.path.join(out_dir, f"{name}_golden_logits.json"), "w", encoding="utf-8") as fh:
            json.dump(out, fh, ensure_ascii=False)


if __name__ == "__main__":
    main()
