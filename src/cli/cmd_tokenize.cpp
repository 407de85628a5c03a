// topkv tokenize: text -> token ids with the model's own tokenizer, for
// debugging prompts (what ids does the model see, where do pieces break).
#include <fmt/format.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "src/cli/commands.h"
#include "src/common/error.h"
#include "src/common/timer.h"
#include "src/model/gguf.h"
#include "src/model/tokenizer.h"
#include "src/model/unicode.h"
#include "src/common/file_io.h"

namespace topkv::cli {

namespace {

// A piece as one printable line: C escapes for controls, backslash and
// bytes that are not UTF-8; every other character as itself.
std::string escape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const Utf8Char c = utf8_decode(s, i);
    if (!c.valid || c.cp < 0x20 || c.cp == 0x7F) {
      const unsigned char b = (unsigned char)s[i];
      out += b == '\n' ? "\\n" : b == '\t' ? "\\t" : b == '\r' ? "\\r" : fmt::format("\\x{:02X}", b);
      i += 1;
      continue;
    }
    if (c.cp == '\\') out += '\\';
    out.append(s, i, c.len);
    i += c.len;
  }
  return out;
}

const char* type_label(TokenType t) {
  switch (t) {
    case TokenType::Control: return "control";
    case TokenType::Unknown: return "unknown";
    case TokenType::UserDefined: return "user";
    case TokenType::Unused: return "unused";
    case TokenType::Byte: return "byte";
    default: return "";
  }
}

std::string read_input(const std::string& path) {
  if (path == "-") return std::string(std::istreambuf_iterator<char>(std::cin), {});
  return read_text_input(path, "text file (-f)", 1ull << 30);
}

}  // namespace

void register_tokenize(CLI::App& app) {
  struct Opts {
    std::string model, prompt, file;
    bool ids_only = false, no_bos = false, special = false, chat = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("tokenize", "Show the token ids (and pieces) the model's tokenizer makes of a text");
  cmd->add_option("-m,--model", o->model, "GGUF model file whose vocabulary to use")->required();
  auto* p = cmd->add_option("-p,--prompt", o->prompt, "Text to tokenize");
  auto* f = cmd->add_option("-f,--file", o->file, "Read the text from this file ('-' for stdin), byte for byte");
  p->excludes(f);
  cmd->add_flag("--ids", o->ids_only, "Print only the ids, as one list [a, b, ...]");
  cmd->add_flag("--no-bos", o->no_bos, "Do not prepend the BOS token (default: as the model's add_bos_token says)");
  cmd->add_flag("--special", o->special,
                "Turn control tokens written in the text (e.g. <start_of_turn>) into their ids; without it they are "
                "tokenized as plain text");
  cmd->add_flag(
      "--chat", o->chat,
      "Wrap the text in the model's chat prompt for one user turn (with BOS where the format has one; control "
      "tokens in the text stay text)");
  cmd->callback([o] {
    TOPKV_CHECK(!o->prompt.empty() || !o->file.empty(), "give the text with -p TEXT or -f FILE");
    const std::string text = o->file.empty() ? o->prompt : read_input(o->file);
    auto gguf = GgufFile::open(o->model);
    const Tokenizer tok = Tokenizer::from_gguf(*gguf);
    Timer timer;
    const std::clock_t cpu0 = std::clock();
    const std::vector<int32_t> ids =
        o->chat ? tok.encode_chat(text) : tok.encode(text, tok.add_bos_default() && !o->no_bos, o->special);
    const double secs = timer.seconds(), cpu_secs = double(std::clock() - cpu0) / CLOCKS_PER_SEC;
    if (o->ids_only) {
      fmt::print("[{}]\n", fmt::join(ids, ", "));
    } else {
      for (int32_t id : ids) {
        const TokenType t = tok.token_type(id);
        const bool raw = t != TokenType::Normal && t != TokenType::Undefined;
        fmt::print("{:>7}  '{}'{}{}\n", id, escape(raw ? tok.token_text(id) : tok.piece(id)), raw ? "  " : "",
                   type_label(t));
      }
    }
    // CPU time too: on a shared machine the wall clock also counts waiting.
    std::fprintf(
        stderr,
        "%zu tokens from %zu bytes (%.2f bytes/token): encode %.3f s wall (%.1f MB/s), %.3f s CPU (%.1f MB/s)\n",
        ids.size(), text.size(), ids.empty() ? 0.0 : (double)text.size() / (double)ids.size(), secs,
        secs > 0 ? (double)text.size() / secs / 1e6 : 0.0, cpu_secs,
        cpu_secs > 0 ? (double)text.size() / cpu_secs / 1e6 : 0.0);
  });
}

}  // namespace topkv::cli
