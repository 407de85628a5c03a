// libFuzzer: the tokenizers on arbitrary bytes: SentencePiece vocabularies of
// the gemma3 and llama kinds (with and without the space prefix) from
// synth_vocab, with and without special-token parsing. Byte-fallback pieces
// cover every byte, so decode(encode(text)) must give the text back.
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
  TOPKV_FUZZ_BODY({
    for (const topkv::Tokenizer* t : {&gemma, &llama}) {
      const auto ids = t->encode(text, false, false);
      if (t->decode(ids) != text) std::abort();
      const auto special = t->encode(text, true, true);
      (void)t->decode(special, true);
    }
  });
  return 0;
}
