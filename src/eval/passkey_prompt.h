// Prompts for long-context retrieval tests with a known answer hidden at a
// chosen depth inside filler text:
//   passkey — the test of Mohtashami & Jaggi (Landmark Attention) used by
//             LongLoRA, DuoAttention and the top-k paper: a random 5-digit key
//             inside repeated sentences about grass and sky;
//   needle  — a needle-in-a-haystack variant (RULER style): a "special magic
//             number" for a random city inside varied filler sentences.
// The prompt ends where the model should start writing the answer.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "src/model/tokenizer.h"

namespace topkv {

enum class RetrievalTask { Passkey, Needle };
RetrievalTask parse_retrieval_task(const std::string& s);  // "passkey" | "needle"

struct RetrievalPrompt {
  std::vector<int32_t> tokens;  // with BOS when the tokenizer adds one
  std::string answer;           // the digits the model must produce
  int64_t needle_token = 0;     // token position where the needle starts
};

// A prompt of at most `target_tokens` tokens (and close to it) with the needle
// at fraction `depth` (0 = right after the instruction, 1 = right before the
// question) of the filler. Throws Error when the target is too short to hold
// instruction, needle and question.
RetrievalPrompt build_retrieval_prompt(const Tokenizer& tok, RetrievalTask task, int64_t target_tokens,
                                       double depth, std::mt19937_64& rng);

// True when the generated text contains the answer as a whole number (not as
// part of a longer run of digits).
bool answer_found(const std::string& generated, const std::string& answer);

}  // namespace topkv
