// RULER-style synthetic long-context tasks: Hsieh et al., "RULER: What's the
// Real Context Size of Your Long-Context Language Models?" (2024), Sec. 3,
// with the prompt templates and sizes of its synthetic task configs.
//
//   niah_single_1    noise haystack ("The grass is green. ..."), key a word, value a 7-digit number
//   niah_single_2    varied sentences as haystack (RULER: Paul Graham essays), value a number
//   niah_single_3    varied sentences, value a UUID
//   niah_multikey_1  varied sentences with 3 distractor needles under other keys
//   niah_multikey_2  a haystack made of needles (word keys, number values)
//   niah_multikey_3  a haystack made of needles (UUID keys and values)
//   niah_multivalue  4 values under one key; all must be answered
//   niah_multiquery  4 keys asked at once
//   vt               variable tracking: a chain VAR A = 12345, VAR B = VAR A, ... (4 hops) in noise,
//                    answer every variable that holds the value; with one short worked example
//   cwe              common words: a numbered list where 10 words appear often, the rest rarely;
//                    answer the 10 most common; with one short worked example
//   fwe              frequent words: Zipf-distributed (alpha 2) coded words; answer the 3 most frequent
// RULER's QA tasks (qa_1 SQuAD, qa_2 HotpotQA) need those datasets and are not built.
//
// A prompt is the task's text followed by an answer prefix the model
// continues ("... The special magic number for quiet-harbor mentioned in the
// provided text is"); with a chat format the text is the user turn and the
// prefix starts the assistant's reply. Each prompt has as many tokens as the
// target allows (counted with the model's tokenizer, template included) and
// is a pure function of (task, tokenizer, format, target, seed).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "src/model/tokenizer.h"

namespace topkv {

enum class RulerTask : uint8_t {
  NiahSingle1, NiahSingle2, NiahSingle3, NiahMultikey1, NiahMultikey2, NiahMultikey3, NiahMultivalue,
  NiahMultiquery, Vt, Cwe, Fwe
};

const std::vector<RulerTask>& all_ruler_tasks();  // in RULER's order
const char* ruler_task_name(RulerTask t);         // "niah_single_1", ..., "fwe"
// Throws Error naming the tasks there are (and why qa_1 / qa_2 are not).
RulerTask parse_ruler_task(const std::string& name);
// RULER's tokens_to_generate: 128 for niah, 30 vt, 120 cwe, 50 fwe.
int ruler_answer_tokens(RulerTask t);

// How a prompt is put to the model.
struct RulerFormat {
  const Tokenizer* tok = nullptr;
  bool chat = false;  // the text as one user turn of the model's chat template
  // The prompt's tokens: `text` then `answer_prefix`. Plain: one encoding of
  // both with the model's BOS preference. Chat: Tokenizer::encode_chat(text),
  // then the prefix (its leading blank dropped: it starts the reply). Throws
  // Error when chat is asked of a model without a known chat format.
  std::vector<int32_t> encode(const std::string& text, const std::string& answer_prefix) const;
};

struct RulerSample {
  RulerTask task = RulerTask::NiahSingle1;
  std::vector<int32_t> tokens;       // the whole prompt, answer prefix included
  std::string text, answer_prefix;   // before formatting (tests, inspection)
  std::vector<std::string> answers;  // references: each must appear in the answer (string_match_all)
  // niah: each needle's position, vt: each chain statement's, as a fraction
  // of the haystack's units (0 = before the first, 1 = after the last).
  std::vector<double> depths;
  int64_t units = 0;                 // haystack size: sentences, needles, list words or coded words
};

// A sample of `task` with at most `target_tokens` prompt tokens, as close to
// it as a unit of haystack allows. Throws Error when the target cannot hold
// the instructions and the smallest haystack.
RulerSample build_ruler_sample(RulerTask task, const RulerFormat& format, int64_t target_tokens, uint64_t seed);

}  // namespace topkv
