#!/usr/bin/env python3
"""Records golden data for the real model from references no one in this
project wrote: token ids of a few prompts from Google's SentencePiece library,
and the top-20 logits at every position of a ~100-token prompt from Hugging
Face transformers.

Why SentencePiece for the ids: transformers 5.17's GGUF tokenizer conversion
for gemma3 gives wrong ids (no BOS, "▁world" split into "▁w" "or" "ld"; its own
greedy output on its ids is gibberish). The GGUF carries the SentencePiece
vocabulary (pieces, scores, types), so the script rebuilds the SentencePiece
ModelProto from it (BPE, byte fallback, no normalisation, add_dummy_prefix from
tokenizer.ggml.add_space_prefix) and lets the SentencePiece library encode.
Control tokens written in the text (<start_of_turn>, ...) are split out first,
as llama.cpp does with parse_special; SentencePiece itself matches
user-defined pieces. transformers then computes logits for those ids.

Run where PyTorch + transformers + gguf are installed (the GPU host):
    python3 scripts/make_golden.py MODEL.gguf OUTDIR [--tokens-only]
(--tokens-only needs only sentencepiece, protobuf, numpy and gguf.)
Writes OUTDIR/gemma3_golden_tokens.json and OUTDIR/gemma3_golden_logits.json,
committed under tests/data/.
"""
import json
import os
import re
import sys

import sentencepiece as spm
from gguf import GGUFReader
from sentencepiece import sentencepiece_model_pb2 as spm_pb2

TOKEN_PROMPTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  Leading spaces, trailing spaces  and  doubled  spaces.  ",
    "Line one\nLine two\n\n\tTabbed line\r\nWindows line",
    "Ünïcödé façade — naïve café, Straße, smörgåsbord",
    "日本語のテキストと中文文本，还有한국어 텍스트.",
    "Emoji: 😀🎉👍🏽 and symbols ∑∫√∞ ≠ ≤ ≥ → ←",
    "Ελληνικά, Русский язык, العربية, עברית, हिन्दी",
    "def f(x):\n    return x ** 2  # square\n",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "1234567890 3.14159 -42 1e-9 0x1F",
]

LOGIT_PROMPT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden press adapted from wine making. Within "
    "fifty years printed books had spread across Europe, and the price of knowledge fell sharply."
)


def sentencepiece_encoder(model_path):
    r = GGUFReader(model_path)
    field = lambda k: r.fields[k].contents()
    pieces, scores, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.scores"), field("tokenizer.ggml.token_type")
    proto = spm_pb2.ModelProto()
    proto.trainer_spec.model_type = spm_pb2.TrainerSpec.BPE
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.unk_id = int(field("tokenizer.ggml.unknown_token_id"))
    proto.trainer_spec.bos_id = int(field("tokenizer.ggml.bos_token_id"))
    proto.trainer_spec.eos_id = int(field("tokenizer.ggml.eos_token_id"))
    proto.trainer_spec.pad_id = int(field("tokenizer.ggml.padding_token_id"))
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = bool(field("tokenizer.ggml.add_space_prefix"))
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    for p, sc, t in zip(pieces, scores, types):
        e = proto.pieces.add()
        # llama.cpp's converter stores user-defined pieces "pre-normalised"
        # (▁ -> space) because llama.cpp matches them on raw text; SentencePiece
        # matches them on normalised text, so restore the ▁.
        e.piece = p.replace(" ", "\u2581") if int(t) == 4 else p
        e.score, e.type = float(sc), int(t)  # GGUF token types are SentencePiece's
    # SentencePiece insists the unk piece has type UNKNOWN; the GGUF marks <unk> as control.
    proto.pieces[proto.trainer_spec.unk_id].type = spm_pb2.ModelProto.SentencePiece.UNKNOWN
    sp = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
    control = sorted((p for p, t in zip(pieces, types) if t == 3 and p), key=len, reverse=True)
    split_re = re.compile("(" + "|".join(re.escape(c) for c in control) + ")")
    piece_id = {p: i for i, p in enumerate(pieces)}
    add_bos = bool(field("tokenizer.ggml.add_bos_token"))

    def encode(text):
        ids = [proto.trainer_spec.bos_id] if add_bos else []
        for part in split_re.split(text):
            if part in piece_id and types[piece_id[part]] == 3:
                ids.append(piece_id[part])
            elif part:
                ids.extend(sp.encode(part))
        return ids

    encode.sp = sp
    return encode


def main():
    model_path, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    d, f = os.path.dirname(os.path.abspath(model_path)), os.path.basename(model_path)
    encode = sentencepiece_encoder(model_path)
    tokens = {"source": f"sentencepiece {spm.__version__} with the vocabulary of {f}", "add_bos": True,
              "parse_special": True, "prompts": []}
    for text in TOKEN_PROMPTS:
        ids = encode(text)
        tokens["prompts"].append({"text": text, "ids": ids})
        print(len(ids), ids[:12], flush=True)
    with open(os.path.join(out_dir, "gemma3_golden_tokens.json"), "w", encoding="utf-8") as fh:
        json.dump(tokens, fh, ensure_ascii=False, indent=1)
    if "--tokens-only" in sys.argv:
        return
    import torch  # the logits need PyTorch + transformers (the GPU host has them)
    import transformers
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32)
    model.eval()
    print(model.config, flush=True)
    ids = encode(LOGIT_PROMPT)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    top = torch.topk(logits, 20, dim=-1)
    top20 = [[[int(i), float(v)] for v, i in zip(top.values[p].tolist(), top.indices[p].tolist())]
             for p in range(len(ids))]
    # Greedy continuation as a readable sanity check of the reference itself.
    with torch.no_grad():
        gen = model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)
    cont = encode.sp.decode(gen[0][len(ids):].tolist())
    print("greedy continuation:", repr(cont), flush=True)
    out = {"source": f"transformers {transformers.__version__}, ids from {tokens['source']}", "dtype": "float32", "prompt": LOGIT_PROMPT, "ids": ids,
           "top20": top20, "greedy_continuation_ids": gen[0][len(ids):].tolist(),
           "greedy_continuation": cont}
    with open(os.path.join(out_dir, "gemma3_golden_logits.json"), "w", encoding="utf-8") as fh:
        json.dump(out, fh, ensure_ascii=False)
    print("positions:", len(ids))


if __name__ == "__main__":
    main()
