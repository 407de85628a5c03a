// libFuzzer: the tokenizers on arbitrary bytes: SentencePiece vocabularies of
// the gemma3 and llama kinds (with and without the space prefix) from
// synth_vocab, with and without special-token parsing. Byte-fallback pieces
// cover every byte, so decode(encode(text)) must give the text back, except
// for text holding U+2581 itself: SentencePiece's space marker decodes as a
// space (as in llama.cpp and sentencepiece).
#include <cstdlib>

#include "src/model/synth.h"
#include "src/model/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {
topkv::Tokenizer make(const char* arch) {
  topkv::SynthVocab s = topkv::synth_vocab(arch, 2048);
  topkv::Vocab v;
  v.kind = topkv::VocabKind::Spm;
  v.tokens = s.tokens;
  v.scores = s.scores;
  for (int32_t t : s.types) v.types.push_back((topkv::TokenType)t);
  v.bos = s.bos, v.eos = s.eos, v.unk = s.unk, v.pad = s.pad;
  v.add_space_prefix = std::string(arch) == "llama";
  v.architecture = arch;
  return topkv::Tokenizer(std::move(v));
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static topkv::Tokenizer gemma = make("gemma3"), llama = make("llama");
  const std::string text(reinterpret_cast<const char*>(data), size);
  const bool round_trips = text.find("\xe2\x96\x81") == std::string::npos;
  TOPKV_FUZZ_BODY({
    for (const topkv::Tokenizer* t : {&gemma, &llama}) {
      const auto ids = t->encode(text, false, false);
      if (round_trips && t->decode(ids) != text) {
        std::fprintf(stderr, "decode(encode(text)) differs from the text\n");
        std::abort();
      }
      const auto special = t->encode(text, true, true);
      (void)t->decode(special, true);
    }
  });
  return 0;
}
