#!/usr/bin/env python3
"""Golden token ids for the Qwen2 tokenizer (Qwen2.5 / Qwen2.5-Coder GGUFs),
from implementations no one in this project wrote.

The committed tests/data/qwen2_golden_tokens.json was made with
tokenizers 0.23.3, transformers 5.24.0, gguf 0.19.0, regex 2026.11.19 and
jinja2 3.1.6 (Python 3.11) from qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (the
1.5B file has the same vocabulary, merges and token types). CPU only; no
PyTorch:

    pip install --target DIR tokenizers transformers gguf regex jinja2 numpy
    PYTHONPATH=DIR python3 scripts/make_golden_qwen2.py MODEL.gguf tests/data/qwen2_golden_tokens.json

Three references; A and B must give the same ids before anything is written:
  A  transformers' own GGUF tokenizer conversion (convert_gguf_tokenizer: the
     GGUF's vocabulary and merges in a byte-level BPE with the Qwen2 split
     regex; control tokens special, user-defined ones plain added tokens).
     Its loader needs PyTorch only to read the file, so the metadata is read
     here with the gguf package and handed to the converter as it would be.
  B  transformers' Qwen2Tokenizer (the class a Qwen2.5 tokenizer.json loads
     into: NFC normaliser, Qwen2 split regex, byte level), built from the same
     vocabulary and merges, with the GGUF's special tokens added the same way.
  C  the Python `regex` module applying the Qwen2 pre-tokenizer regex to the
     text between special tokens; its words are written out as well, and
     tests/test_tokenizer_qwen2.cpp checks topkv's hand-written splitter
     against them without the model.
Every prompt is NFC-stable: Qwen2's tokenizer.json normalises to NFC, which
llama.cpp (and topkv) do not, so text that NFC changes tokenises differently
there than in B (noted in tests/test_tokenizer_qwen2.cpp).

Ids are for encoding with special tokens parsed (llama.cpp's parse_special,
Hugging Face's default) and no BOS (tokenizer.ggml.add_bos_token = false).
"chat" holds chat prompts for one user turn as transformers renders the
GGUF's own tokenizer.chat_template (Jinja) with a generation prompt, and
their ids (reference A on the rendered text).
"""
import json
import sys
import unicodedata

import jinja2
import regex
import tokenizers
import transformers
from gguf import GGUFReader
from tokenizers import AddedToken
from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

# The Gemma golden set (scripts/make_golden.py TOKEN_PROMPTS) first, then
# what a code model and the Qwen2 regex make interesting.
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
    "x = 12345 + 678",
    "for (int i = 0; i < 1000000; ++i) { sum += a[i] * 31; }  // 2024-05-17T08:30:00Z",
    "pi = 3.14159, eps = 1e-9, big = 1,234,567.89, hex 0xDEADBEEF, v1.2.3-rc4, ١٢٣٤ ४२ ½ ²",
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWrite quicksort in Python.<|im_end|>\n<|im_start|>assistant\n",
    "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c<|fim_middle|>",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>',
    "<|endoftext|>after the end<|im_end|><|im_start|",
    "中文分词测试：我爱北京天安门。日本語の文章です。한국어 문장입니다. 繁體中文與简体中文",
    "👩‍👩‍👧‍👦 family 🇯🇵 flag 🏳️‍🌈 keycap 1️⃣ skin 👋🏿",
    "a" + " " * 37 + "b\t\t\t\tc" + "\n" * 5 + "   \n \n\t\n" + "d" + " " * 8,
    "'s 'll 'RE 'Ve 'd 'M 'T it's we'll THEY'RE 'x ''s ' s 'sS",
    "x'ſtep 'ſt ſ's (long s: case-folds to s)",
    "\r\n mixes: a\r\nb\n\rc\r\r\nd \r\n e\r  \r\n\r\n",
    "   leading and trailing   ",
    "def naïve_café(ß): return ß**2  # コメント",
    "nbsp\u00a0here\u3000ideographic\u200bzero-width\u2028line-sep\ufeffbom",
    "\x00\x01\x1b[31mred\x1b[0m\x7f",
    "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v.size() > 2 ? 0 : -1;\n}\n",
    "SELECT id, COUNT(*) FROM t WHERE x >= 10 AND y <> 'a''b' GROUP BY 1;",
    "!!!???...---***///\\\\\\|||",
]

# The control and user-defined added tokens, as the GGUF marks them.
CONTROL, USER_DEFINED = 3, 4


def read_gguf(path):
    r = GGUFReader(path)
    field = lambda k: r.fields[k].contents() if k in r.fields else None
    d = {
        "tokenizer_type": field("tokenizer.ggml.model"),
        "pre_tokenizer_type": field("tokenizer.ggml.pre"),
        "tokens": field("tokenizer.ggml.tokens"),
        "token_type": field("tokenizer.ggml.token_type"),
        "merges": field("tokenizer.ggml.merges"),
        "bos_token_id": field("tokenizer.ggml.bos_token_id"),
        "eos_token_id": field("tokenizer.ggml.eos_token_id"),
        "pad_token_id": field("tokenizer.ggml.padding_token_id"),
    }
    kind = (d["tokenizer_type"], d["pre_tokenizer_type"])
    assert kind == ("gpt2", "qwen2"), f"not a Qwen2 byte-level BPE vocabulary: {kind}"
    assert field("tokenizer.ggml.add_bos_token") is False
    return field("general.architecture"), d


CHAT_USER_TEXTS = ["Hello", "Write a Python function that checks whether 12321 is a palindrome.", "  two\nlines  "]


def read_chat_template(path):
    return GGUFReader(path).fields["tokenizer.chat_template"].contents()


def reference_a(arch, d):
    backend, _ = convert_gguf_tokenizer(arch, d)
    return lambda text: backend.encode(text, add_special_tokens=False).ids


def reference_b(d):
    vocab = {t: i for i, t in enumerate(d["tokens"]) if d["token_type"][i] == 1}
    merges = [tuple(m.split(" ")) for m in d["merges"]]
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges)
    added = [
        AddedToken(t, normalized=False, special=ty == CONTROL)
        for t, ty in zip(d["tokens"], d["token_type"])
        if ty in (CONTROL, USER_DEFINED)
    ]
    tok.add_tokens(added)
    # added tokens take the ids the GGUF gives them (they follow the vocabulary in order)
    for t, ty in zip(d["tokens"], d["token_type"]):
        if ty in (CONTROL, USER_DEFINED):
            assert tok.convert_tokens_to_ids(t) == d["tokens"].index(t), t
    return lambda text: tok.encode(text, add_special_tokens=False)


def special_texts(d):
    """Control and user-defined token texts, longest first (leftmost-longest matching)."""
    texts = (t for t, ty in zip(d["tokens"], d["token_type"]) if ty in (CONTROL, USER_DEFINED))
    return sorted(texts, key=len, reverse=True)


def stretches(d, text):
    """The text between the special tokens written in it."""
    specials = special_texts(d)
    split = regex.compile("(" + "|".join(regex.escape(s) for s in specials) + ")")
    return [part for part in split.split(text) if part and part not in specials]


def words_c(d, text):
    """The Qwen2 regex's words of each stretch of text between special tokens."""
    return [regex.findall(PRETOKENIZE_REGEX, part) for part in stretches(d, text)]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    arch, d = read_gguf(sys.argv[1])
    enc_a, enc_b = reference_a(arch, d), reference_b(d)
    out = []
    for text in TOKEN_PROMPTS:
        assert unicodedata.normalize("NFC", text) == text, f"not NFC-stable: {text!r}"
        a, b = enc_a(text), enc_b(text)
        assert a == b, f"the references disagree on {text!r}:\n{a}\n{b}"
        words = words_c(d, text)
        out.append({"text": text, "ids": a, "words": words})
        assert ["".join(w) for w in words] == stretches(d, text)  # the words tile each stretch
    chat_tok = Qwen2Tokenizer(vocab={"x": 0}, merges=[])  # only for its Jinja renderer
    template = read_chat_template(sys.argv[1])
    chat = []
    for user in CHAT_USER_TEXTS:
        text = chat_tok.apply_chat_template(
            [{"role": "user", "content": user}], chat_template=template, tokenize=False, add_generation_prompt=True
        )
        chat.append({"user": user, "text": text, "ids": enc_a(text)})
    doc = {
        "model": "Qwen2.5-Coder-0.5B-Instruct (GGUF q4_k_m); tokenizer.ggml.pre = qwen2",
        "made_by": f"scripts/make_golden_qwen2.py: tokenizers {tokenizers.__version__}, transformers "
        f"{transformers.__version__}, regex {regex.__version__}, jinja2 {jinja2.__version__}",
        "encoding": "special tokens parsed, no BOS; words: the Qwen2 regex's words of each stretch of text between "
        "special tokens",
        "prompts": out,
        "chat": chat,
    }
    # One prompt per line, so that a change shows as a readable diff.
    dump = lambda x: json.dumps(x, ensure_ascii=False)
    lines = [f" {dump(k)}: {dump(v)}" for k, v in doc.items() if not isinstance(v, list)]
    lines += [
        f" {dump(k)}: [\n  " + ",\n  ".join(dump(e) for e in v) + "\n ]" for k, v in doc.items() if isinstance(v, list)
    ]
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        f.write("{\n" + ",\n".join(lines) + "\n}\n")
    assert json.load(open(sys.argv[2], encoding="utf-8")) == doc
    print(f"wrote {len(out)} prompts to {sys.argv[2]}")


if __name__ == "__main__":
    main()
