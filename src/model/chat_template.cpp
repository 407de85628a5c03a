// Chat prompts for one user turn, in the formats the supported model
// families were instruction-tuned with. topkv does not run Jinja: a
// tokenizer.chat_template is recognised by the markers it contains, and a
// model without one by its architecture and vocabulary.
//   Gemma   <bos><start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n
//   Llama 3 <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n{text}<|eot_id|>
//           <|start_header_id|>assistant<|end_header_id|>\n\n
//   Llama 2 <s>[INST] {text} [/INST]
// (Hugging Face templates of google/gemma-3-*-it, meta-llama/Meta-Llama-3-*-Instruct,
// meta-llama/Llama-2-*-chat, without a system prompt.)
#include "src/common/error.h"
#include "src/model/tokenizer_impl.h"

namespace topkv {

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::Gemma: return "gemma";
    case ChatFormat::Llama3: return "llama3";
    case ChatFormat::Llama2: return "llama2";
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
    if (tmpl.find("[INST]") != std::string::npos) return usable(t, ChatFormat::Llama2);
    return ChatFormat::None;
  }
  if (arch.rfind("gemma", 0) == 0) return usable(t, ChatFormat::Gemma);
  if (arch == "llama") return usable(t, ChatFormat::Llama3);  // a Llama 2 chat GGUF carries its template
  return ChatFormat::None;
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
    case ChatFormat::None: break;
  }
  fail(
      "this model's chat format is not one topkv knows (architecture '{}', {}); topkv formats Gemma, Llama 3 "
      "and Llama 2 chat prompts. Pass --raw to send the prompt exactly as written",
      t.vocab.architecture,
      t.vocab.chat_template.empty() ? std::string("no tokenizer.chat_template")
                                    : "tokenizer.chat_template starting '" + t.vocab.chat_template.substr(0, 60) + "'");
}

}  // namespace topkv
