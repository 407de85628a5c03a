// One row of the decode benchmark (bench/decode_bench.h): build the model for
// the mode (the layers an override takes get no cache in the model when the
// context is synthetic), fill the context, hand it to the override, then time
// decode steps and split them with the override's statistics.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "bench/decode_bench.h"
#include "src/model/backend.h"
#include "src/model/gguf.h"
#include "src/model/model_config.h"
#include "src/model/tokenizer.h"

namespace topkv {

class DecodeRunner {
 public:
  DecodeRunner(const DecodeBenchConfig& cfg, std::shared_ptr<const GgufFile> file, const ModelConfig& mc,
               Backend& be);
  const Tokenizer& tokenizer() const { return tok_; }
  // prompt: the tokens of a prefill fill (ignored for a synthetic one).
  DecodeRow run(int64_t context, DecodeMode mode, const std::string& index, const std::vector<int32_t>& prompt);

 private:
  const DecodeBenchConfig& cfg_;
  std::shared_ptr<const GgufFile> file_;
  ModelConfig mc_;
  Backend& be_;
  bool cuda_;
  Tokenizer tok_;
  int32_t first_token_;  // what a synthetic context's first decode step reads (it has no logits to sample)
};

}  // namespace topkv
