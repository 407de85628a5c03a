// The decoding runs of `topkv eval passkey` and `topkv eval ruler`
// (DESIGN.md, "Testing"): a prompt is prefilled once densely and decoded
// greedily (the reference); each top-k method then decodes it again from the
// same context, once on its own (its answer) and once teacher-forced on the
// reference's tokens (greedy-token agreement and next-token KL divergence
// against dense, step by step).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "src/model/model.h"
#include "src/model/tokenizer.h"

namespace topkv {

int32_t argmax_token(const std::vector<float>& logits);
// log-softmax, computed in double, stored as float.
std::vector<float> log_softmax(const std::vector<float>& logits);
// KL(p || q), p given by its log-probabilities, q by logits (>= 0).
double kl_divergence(const std::vector<float>& log_p, const std::vector<float>& logits_q);

struct DenseReference {
  std::vector<int32_t> ids;                // greedy tokens, end-of-generation included
  std::vector<std::vector<float>> log_p;   // log-probabilities of the first steps (teacher forcing)
  int decode_steps = 0;                    // model.decode calls, and their time (decode tok/s)
  double decode_s = 0;
};
// Greedy decoding of `steps` tokens from `first` (the logits after the
// prompt), through end-of-generation tokens (teacher forcing goes on past
// them); keeps the distributions of the first `keep` steps.
DenseReference decode_reference(Model& model, std::vector<float> first, int steps, int keep);

struct GreedyRun {
  std::vector<int32_t> ids;  // without the end-of-generation token
  int decode_steps = 0;
  double decode_s = 0;
  double tok_per_s() const { return decode_steps > 0 ? decode_steps / decode_s : 0.0; }
};
// Greedy decoding from `first` of at most `max_tokens` tokens; with
// `stop_tok`, it stops at (and drops) an end-of-generation token.
GreedyRun greedy_run(Model& model, std::vector<float> first, int max_tokens, const Tokenizer* stop_tok);

struct ForcedRun {
  int steps = 0;
  double agreement = 0;  // fraction of steps whose argmax is the reference's token
  double kl_mean = 0, kl_max = 0;
  // Where the argmax is not the reference's token: how much the reference
  // preferred its token, log p(its token) - log p(the model's argmax) under
  // the reference's distribution. Near 0, the model flipped a near tie of
  // dense; large, it lost what dense was sure of (a needle's token). The
  // first such step is where the model's own greedy run leaves dense's path
  // (-1: none); later flips follow from the teacher-forced text.
  double flip_margin_max = 0;    // the largest over the steps that flip (0: none)
  int first_flip_step = -1;
  double first_flip_margin = 0;  // at first_flip_step
};
// Step s compares the model's logits with the reference's (argmax and
// KL(dense || model)), then feeds the reference's token s, calling
// `before_feed(s)` first when given. `steps` <= ref.log_p.size().
ForcedRun teacher_forced_run(Model& model, std::vector<float> first, const DenseReference& ref, int steps,
                             const std::function<void(int)>& before_feed = {});

// The reference's answer: its tokens up to the first end-of-generation token, at most n.
std::vector<int32_t> answer_tokens(const std::vector<int32_t>& ids, int n, const Tokenizer& tok);

}  // namespace topkv
