// Chat prompts for one user turn, in the formats the supported model
// families were instruction-tuned with. topkv does not run Jinja: a
// tokenizer.chat_template is recognised by the markers it contains, and a
// model without one by its architecture and vocabulary.
//   Gemma   <bos><start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n
//   Llama 3 <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n{text}<|eot_id|>
//           <|start_header_id|>assistant<|end_header_id|>\n\n
//   Llama 2 <s>[INST] {text} [/INST]
//   ChatML  <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n
//           <|im_start|>assistant\n
// (Hugging Face templates of google/gemma-3-*-it, meta-llama/Meta-Llama-3-*-Instruct,
// meta-llama/Llama-2-*-chat, Qwen/Qwen2.5-*-Instruct, without a system prompt
// of the caller's. The user text goes in verbatim; Hugging Face's Llama 2
// template also strips its outer spaces.) ChatML's system turn is the default
// one its template writes for a conversation without one (Qwen2.5: "You are
// Qwen, created by Alibaba Cloud. You are a helpful assistant."), and left
// out when the template has none (Qwen3, plain ChatML, no template at all).
// ChatML templates write no BOS: it comes first only where the vocabulary
// asks for one (tokenizer.ggml.add_bos_token; Qwen says false), as llama.cpp
// adds it when it tokenizes the rendered prompt.
#include "src/common/error.h"
#include "src/model/tokenizer_impl.h"

namespace topkv {

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::Gemma: return "gemma";
    case ChatFormat::Llama3: return "llama3";
    case ChatFormat::Llama2: return "llama2";
    case ChatFormat::ChatML: return "chatml";
    case ChatFormat::None: break;
  }
  return "none";
}

namespace {

bool has_all(const TokenizerImpl& t, std::initializer_list<const char*> texts) {
  for (const char* s : texts)
    if (t.lookup(s) < 0) return false;
  return true;
}

// The format, if the vocabulary has the tokens it needs.
ChatFormat usable(const TokenizerImpl& t, ChatFormat f) {
  if (f == ChatFormat::ChatML) return has_all(t, {"<|im_start|>", "<|im_end|>"}) ? f : ChatFormat::None;
  if (t.vocab.bos < 0) return ChatFormat::None;
  switch (f) {
    case ChatFormat::Gemma: return has_all(t, {"<start_of_turn>", "<end_of_turn>"}) ? f : ChatFormat::None;
    case ChatFormat::Llama3:
      return has_all(t, {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}) ? f : ChatFormat::None;
    default: return f;
  }
}

}  // namespace

ChatFormat detect_chat_format(const TokenizerImpl& t) {
  const std::string& tmpl = t.vocab.chat_template;
  const std::string& arch = t.vocab.architecture;
  if (!tmpl.empty()) {
    if (tmpl.find("<start_of_turn>") != std::string::npos) return usable(t, ChatFormat::Gemma);
    if (tmpl.find("<|start_header_id|>") != std::string::npos) return usable(t, ChatFormat::Llama3);
    if (tmpl.find("<|im_start|>") != std::string::npos) return usable(t, ChatFormat::ChatML);
    if (tmpl.find("[INST]") != std::string::npos) return usable(t, ChatFormat::Llama2);
    return ChatFormat::None;
  }
  if (arch.rfind("gemma", 0) == 0) return usable(t, ChatFormat::Gemma);
  if (arch == "llama") return usable(t, ChatFormat::Llama3);  // a Llama 2 chat GGUF carries its template
  if (arch.rfind("qwen", 0) == 0) return usable(t, ChatFormat::ChatML);  // qwen2, qwen2moe, qwen3, ...
  return ChatFormat::None;
}

std::string chatml_default_system(std::string_view tmpl) {
  // The Jinja source spells the line break as the two characters \n.
  static constexpr std::string_view kOpen = "<|im_start|>system\\n", kClose = "<|im_end|>";
  for (size_t at = tmpl.find(kOpen); at != std::string_view::npos; at = tmpl.find(kOpen, at + 1)) {
    // The quote that opens the literal holding <|im_start|>: a default system
    // message is a literal that runs on to <|im_end|> without closing;
    // '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>' closes.
    const size_t q = tmpl.find_last_of("'\"", at);
    if (q == std::string_view::npos) continue;
    std::string text;
    for (size_t i = at + kOpen.size(); i < tmpl.size() && tmpl[i] != tmpl[q]; ++i) {
      if (tmpl.compare(i, kClose.size(), kClose) == 0) return text;
      if (tmpl[i] == '\\' && i + 1 < tmpl.size()) {
        const char e = tmpl[++i];
        text += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;  // \\ \' \" stand for themselves
      } else {
        text += tmpl[i];
      }
    }
  }
  return {};
}

std::vector<ChatSegment> chat_segments(const TokenizerImpl& t, std::string_view user_text) {
  const std::string text(user_text);
  auto tok = [&](const char* s) { return ChatSegment{t.lookup(s), {}}; };
  const ChatSegment bos{t.vocab.bos, {}};
  switch (t.chat) {
    case ChatFormat::Gemma:
      return {bos,
              tok("<start_of_turn>"),
              {-1, "user\n" + text},
              tok("<end_of_turn>"),
              {-1, "\n"},
              tok("<start_of_turn>"),
              {-1, "model\n"}};
    case ChatFormat::Llama3:
      return {bos,
              tok("<|start_header_id|>"),
              {-1, "user"},
              tok("<|end_header_id|>"),
              {-1, "\n\n" + text},
              tok("<|eot_id|>"),
              tok("<|start_header_id|>"),
              {-1, "assistant"},
              tok("<|end_header_id|>"),
              {-1, "\n\n"}};
    case ChatFormat::Llama2: return {bos, {-1, "[INST] " + text + " [/INST]"}};
    case ChatFormat::ChatML: {
      std::vector<ChatSegment> s;
      if (t.vocab.add_bos && t.vocab.bos >= 0) s.push_back(bos);
      if (!t.chat_system.empty())
        s.insert(s.end(), {tok("<|im_start|>"), {-1, "system\n" + t.chat_system}, tok("<|im_end|>"), {-1, "\n"}});
      s.insert(s.end(), {tok("<|im_start|>"),
                         {-1, "user\n" + text},
                         tok("<|im_end|>"),
                         {-1, "\n"},
                         tok("<|im_start|>"),
                         {-1, "assistant\n"}});
      return s;
    }
    case ChatFormat::None: break;
  }
  fail(
      "this model's chat format is not one topkv knows (architecture '{}', {}); topkv formats Gemma, Llama 3, "
      "Llama 2 and ChatML (Qwen) chat prompts. Pass --raw to send the prompt exactly as written",
      t.vocab.architecture,
      t.vocab.chat_template.empty() ? std::string("no tokenizer.chat_template")
                                    : "tokenizer.chat_template starting '" + t.vocab.chat_template.substr(0, 60) + "'");
}

// The Hugging Face templates' conversations: Gemma folds a system message
// into the first user turn (its template has no system role) and calls the
// assistant "model"; Llama 3 and ChatML give every role its own header; a
// ChatML conversation without a system message starts with the template's
// default one. Llama 2's [INST] form is supported for one user turn only.
std::vector<ChatSegment> chat_turn_segments(const TokenizerImpl& t, std::span<const ChatTurn> turns) {
  TOPKV_CHECK(!turns.empty(), "a chat needs at least one message");
  for (const ChatTurn& m : turns)
    TOPKV_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant", "unknown chat role '{}': use "
                "system, user or assistant", m.role);
  if (turns.size() == 1 && turns[0].role == "user") return chat_segments(t, turns[0].content);
  auto tok = [&](const char* s) { return ChatSegment{t.lookup(s), {}}; };
  const ChatSegment bos{t.vocab.bos, {}};
  std::vector<ChatSegment> s;
  switch (t.chat) {
    case ChatFormat::Gemma: {
      s.push_back(bos);
      std::string system;
      for (const ChatTurn& m : turns) {
        if (m.role == "system") {
          system += m.content + "\n\n";
          continue;
        }
        const std::string text = m.role == "user" ? system + m.content : m.content;
        if (m.role == "user") system.clear();
        s.insert(s.end(), {tok("<start_of_turn>"), {-1, (m.role == "user" ? "user\n" : "model\n") + text},
                           tok("<end_of_turn>"), {-1, "\n"}});
      }
      s.insert(s.end(), {tok("<start_of_turn>"), {-1, "model\n"}});
      return s;
    }
    case ChatFormat::Llama3:
      s.push_back(bos);
      for (const ChatTurn& m : turns)
        s.insert(s.end(), {tok("<|start_header_id|>"), {-1, m.role}, tok("<|end_header_id|>"), {-1, "\n\n" + m.content},
                           tok("<|eot_id|>")});
      s.insert(s.end(), {tok("<|start_header_id|>"), {-1, "assistant"}, tok("<|end_header_id|>"), {-1, "\n\n"}});
      return s;
    case ChatFormat::ChatML:
      if (t.vocab.add_bos && t.vocab.bos >= 0) s.push_back(bos);
      if (turns[0].role != "system" && !t.chat_system.empty())
        s.insert(s.end(), {tok("<|im_start|>"), {-1, "system\n" + t.chat_system}, tok("<|im_end|>"), {-1, "\n"}});
      for (const ChatTurn& m : turns)
        s.insert(s.end(), {tok("<|im_start|>"), {-1, m.role + "\n" + m.content}, tok("<|im_end|>"), {-1, "\n"}});
      s.insert(s.end(), {tok("<|im_start|>"), {-1, "assistant\n"}});
      return s;
    case ChatFormat::Llama2:
      fail("this model's chat format (Llama 2) is supported for one user message only");
    case ChatFormat::None: break;
  }
  return chat_segments(t, "");  // fails, naming the format
}

}  // namespace topkv
