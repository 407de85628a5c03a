#include "src/eval/ruler_tasks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "src/common/error.h"
#include "src/eval/ruler_compose.h"
#include "src/eval/ruler_words.h"

namespace topkv {

namespace {

struct TaskInfo {
  RulerTask task;
  const char* name;
  int answer_tokens;  // RULER's tokens_to_generate
};

constexpr TaskInfo kTasks[] = {
    {RulerTask::NiahSingle1, "niah_single_1", 128},     {RulerTask::NiahSingle2, "niah_single_2", 128},
    {RulerTask::NiahSingle3, "niah_single_3", 128},     {RulerTask::NiahMultikey1, "niah_multikey_1", 128},
    {RulerTask::NiahMultikey2, "niah_multikey_2", 128}, {RulerTask::NiahMultikey3, "niah_multikey_3", 128},
    {RulerTask::NiahMultivalue, "niah_multivalue", 128}, {RulerTask::NiahMultiquery, "niah_multiquery", 128},
    {RulerTask::Vt, "vt", 30},                          {RulerTask::Cwe, "cwe", 120},
    {RulerTask::Fwe, "fwe", 50},
};

const TaskInfo& info(RulerTask t) {
  for (const TaskInfo& i : kTasks)
    if (i.task == t) return i;
  fail("internal: unknown RULER task {}", (int)t);
}

}  // namespace

const std::vector<RulerTask>& all_ruler_tasks() {
  static const std::vector<RulerTask> all = [] {
    std::vector<RulerTask> v;
    for (const TaskInfo& i : kTasks) v.push_back(i.task);
    return v;
  }();
  return all;
}

const char* ruler_task_name(RulerTask t) { return info(t).name; }
int ruler_answer_tokens(RulerTask t) { return info(t).answer_tokens; }

RulerTask parse_ruler_task(const std::string& name) {
  for (const TaskInfo& i : kTasks)
    if (name == i.name) return i.task;
  std::string names;
  for (const TaskInfo& i : kTasks) names += (names.empty() ? "" : ", ") + std::string(i.name);
  TOPKV_CHECK(name != "qa_1" && name != "qa_2", "RULER's {} task needs the {} dataset, which topkv does not have; "
              "the tasks are {}", name, name == "qa_1" ? "SQuAD" : "HotpotQA", names);
  fail("unknown RULER task '{}': the tasks are {}", name, names);
}

std::vector<int32_t> RulerFormat::encode(const std::string& text, const std::string& answer_prefix) const {
  TOPKV_CHECK(tok, "internal: a RULER prompt format without a tokenizer");
  if (!chat) return tok->encode(text + answer_prefix, tok->add_bos_default(), /*parse_special=*/false);
  TOPKV_CHECK(tok->chat_format() != ChatFormat::None, "--chat: this model's chat template is not one topkv knows "
              "(it formats Gemma, Llama 3 and Llama 2 chat prompts); run without --chat");
  std::vector<int32_t> ids = tok->encode_chat(text);
  const size_t start = answer_prefix.find_first_not_of(' ');
  if (start != std::string::npos) {
    const std::vector<int32_t> reply = tok->encode(answer_prefix.substr(start), false, false);
    ids.insert(ids.end(), reply.begin(), reply.end());
  }
  return ids;
}

RulerSample build_ruler_sample(RulerTask task, const RulerFormat& format, int64_t target, uint64_t seed) {
  using namespace ruler;
  const int64_t ruler_length = target + ruler_answer_tokens(task);  // what RULER calls the sequence length
  Composer c;
  switch (task) {
    case RulerTask::Vt: c = vt_composer(seed); break;
    case RulerTask::Cwe: c = cwe_composer(seed, ruler_length < 4096); break;
    case RulerTask::Fwe: c = fwe_composer(seed); break;
    default: c = niah_composer(task, seed);
  }
  RulerSample best;
  best.task = task;
  const auto measure = [&](int64_t n, RulerSample& s) {
    Composed x = c.compose(n);
    s.tokens = format.encode(x.text, x.answer_prefix);
    s.text = std::move(x.text), s.answer_prefix = std::move(x.answer_prefix);
    s.answers = std::move(x.answers), s.depths = std::move(x.depths);
    s.units = n;
    return (int64_t)s.tokens.size();
  };
  // Search the largest size that fits: secant steps from what fits (lo) with
  // the mean tokens per unit measured so far, bisection after overshoots.
  // hi (when > 0) does not fit.
  int64_t lo = c.min_units, hi = 0;
  const int64_t t_min = measure(lo, best);
  TOPKV_CHECK(t_min <= target, "a {}-token prompt cannot hold {}'s instructions and its smallest haystack ({} tokens): "
              "ask for more tokens", target, ruler_task_name(task), t_min);
  int64_t t_lo = t_min;
  double per_unit = 0;
  int overshoots = 0;
  for (int iter = 0; iter < 64; ++iter) {
    int64_t n;
    if (iter == 0) {
      n = lo + 16;  // a probe for the rate
    } else {
      const double slack = (double)(target - t_lo);
      if (slack < std::max(1.0, per_unit) || (hi > 0 && hi - lo <= 1)) break;  // within a unit of the target
      n = overshoots >= 3 && hi > 0 ? lo + (hi - lo) / 2 : lo + std::max<int64_t>(1, (int64_t)(slack / per_unit));
      if (hi > 0) n = std::clamp(n, lo + 1, hi - 1);
    }
    RulerSample s;
    const int64_t t = measure(n, s);
    per_unit = std::max(0.25, (double)(t - t_min) / (double)(n - c.min_units));
    if (t <= target) {
      lo = n, t_lo = t, best = std::move(s);
    } else {
      hi = n, ++overshoots;
    }
  }
  best.task = task;
  return best;
}

}  // namespace topkv
