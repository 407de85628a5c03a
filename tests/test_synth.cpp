// Synthetic models: the file has the requested geometry, the tensor names,
// shapes and metadata keys of a real llama / gemma3 GGUF, sensible weight
// scales, a usable SentencePiece-style vocabulary; bad settings are rejected.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "src/common/error.h"
#include "src/model/gguf.h"
#include "src/model/synth.h"
#include "tests/test_util.h"

using namespace topkv;
namespace fs = std::filesystem;

namespace {

using test::TempDir;

// Mean and standard deviation of a tensor's dequantised values.
std::pair<double, double> moments(const GgufTensor& t) {
  std::vector<float> row(t.ne[0]);
  double s = 0, s2 = 0;
  for (int64_t r = 0; r < t.nrows(); ++r) {
    dequantize_row(t.type, t.row(r), row.data(), t.ne[0]);
    for (float v : row) s += v, s2 += (double)v * v;
  }
  const double n = (double)t.nelements(), mean = s / n;
  return {mean, std::sqrt(std::max(0.0, s2 / n - mean * mean))};
}

void check_shape(const GgufFile& f, const std::string& name, std::vector<int64_t> ne, GgmlType type) {
  INFO(name);
  const GgufTensor* t = f.find(name);
  REQUIRE(t != nullptr);
  CHECK(t->n_dims == (int)ne.size());
  for (size_t d = 0; d < ne.size(); ++d) CHECK(t->ne[d] == ne[d]);
  CHECK(ggml_type_info(t->type).name == std::string(ggml_type_info(type).name));
}

// Number of UTF-8 characters.
size_t utf8_len(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}
std::string drop_last_char(const std::string& s) {
  size_t i = s.size() - 1;
  while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) --i;
  return s.substr(0, i);
}

}  // namespace

TEST_CASE("synthetic llama model: geometry, tensors, metadata, weight scales") {
  TempDir td;
  SynthConfig c = synth_defaults("llama");
  c.layers = 3, c.width = 96, c.heads = 6, c.kv_heads = 2, c.head_dim = 32, c.ffn = 160, c.vocab = 700;
  c.context = 2048, c.rope_base = 5e5f, c.type = GgmlType::Q8_0, c.seed = 42;
  std::string path = td.file("llama.gguf");
  synth_write(c, path);
  auto f = GgufFile::open(path);
  CHECK(f->get_str("general.architecture") == "llama");
  CHECK(f->get_u32("llama.block_count") == 3);
  CHECK(f->get_u32("llama.embedding_length") == 96);
  CHECK(f->get_u32("llama.attention.head_count") == 6);
  CHECK(f->get_u32("llama.attention.head_count_kv") == 2);
  CHECK(f->get_u32("llama.attention.key_length") == 32);
  CHECK(f->get_u32("llama.rope.dimension_count") == 32);
  CHECK(f->get_u32("llama.feed_forward_length") == 160);
  CHECK(f->get_u32("llama.context_length") == 2048);
  CHECK(f->get_f32("llama.rope.freq_base") == 5e5f);
  CHECK(f->get_f32("llama.attention.layer_norm_rms_epsilon") == 1e-5f);
  CHECK(f->get_str("tokenizer.ggml.model") == "llama");
  CHECK(f->get_arr_size("tokenizer.ggml.tokens") == 700);
  CHECK(f->get_u32("tokenizer.ggml.bos_token_id") == 1);
  CHECK(f->get_u32("tokenizer.ggml.eos_token_id") == 2);
  CHECK(f->get_bool("tokenizer.ggml.add_bos_token"));
  CHECK(f->get_bool("tokenizer.ggml.add_space_prefix"));
  CHECK(f->tensors().size() == 3 + 3 * 9);
  check_shape(*f, "token_embd.weight", {96, 700}, GgmlType::Q8_0);
  check_shape(*f, "output.weight", {96, 700}, GgmlType::Q8_0);
  check_shape(*f, "output_norm.weight", {96}, GgmlType::F32);
  for (int l = 0; l < 3; ++l) {
    auto n = [l](const char* w) { return fmt::format("blk.{}.{}.weight", l, w); };
    check_shape(*f, n("attn_norm"), {96}, GgmlType::F32);
    check_shape(*f, n("attn_q"), {96, 192}, GgmlType::Q8_0);
    check_shape(*f, n("attn_k"), {96, 64}, GgmlType::Q8_0);
    check_shape(*f, n("attn_v"), {96, 64}, GgmlType::Q8_0);
    check_shape(*f, n("attn_output"), {192, 96}, GgmlType::Q8_0);
    check_shape(*f, n("ffn_norm"), {96}, GgmlType::F32);
    check_shape(*f, n("ffn_gate"), {96, 160}, GgmlType::Q8_0);
    check_shape(*f, n("ffn_up"), {96, 160}, GgmlType::Q8_0);
    check_shape(*f, n("ffn_down"), {160, 96}, GgmlType::Q8_0);
  }
  // matrices ~ N(0, 1/fan_in), norms ~ 1
  for (auto& t : f->tensors()) {
    INFO(t.name);
    auto [mean, sd] = moments(t);
    if (t.n_dims == 1) {
      CHECK(std::fabs(mean - 1.0) < 0.02);
      CHECK(sd == Approx(0.05).epsilon(0.3));
    } else {
      CHECK(std::fabs(mean) < 0.01);
      CHECK(sd == Approx(1.0 / std::sqrt((double)t.ne[0])).epsilon(0.1));
    }
  }
  // deterministic in the seed
  std::string again = td.file("again.gguf"), other = td.file("other.gguf");
  synth_write(c, again);
  c.seed = 43;
  synth_write(c, other);
  CHECK(GgufFile::open(again)->content_hash() == f->content_hash());
  CHECK(GgufFile::open(other)->content_hash() != f->content_hash());
  // tied output: no output.weight
  c.tied_output = true;
  synth_write(c, again);
  CHECK(GgufFile::open(again)->find("output.weight") == nullptr);
}

TEST_CASE("synthetic gemma3 model: QK-norms, post-norms, sliding-window pattern, tied output") {
  TempDir td;
  SynthConfig c = synth_defaults("gemma3");
  c.layers = 7, c.width = 64, c.heads = 4, c.kv_heads = 1, c.head_dim = 48, c.ffn = 128, c.vocab = 600;
  c.sliding_window = 32, c.global_every = 3, c.rope_base_local = 2e4f, c.type = GgmlType::F16;
  std::string path = td.file("gemma.gguf");
  synth_write(c, path);
  auto f = GgufFile::open(path);
  CHECK(f->get_str("general.architecture") == "gemma3");
  CHECK(f->get_u32("gemma3.block_count") == 7);
  CHECK(f->get_u32("gemma3.embedding_length") == 64);
  CHECK(f->get_u32("gemma3.attention.head_count") == 4);
  CHECK(f->get_u32("gemma3.attention.head_count_kv") == 1);
  CHECK(f->get_u32("gemma3.attention.key_length") == 48);
  CHECK(f->get_u32("gemma3.attention.value_length") == 48);
  CHECK(f->get_u32("gemma3.attention.sliding_window") == 32);
  CHECK(f->get_f32("gemma3.rope.freq_base") == 1e6f);
  CHECK(f->get_f32("gemma3.rope.freq_base_swa") == 2e4f);
  CHECK(f->get_f32("gemma3.attention.layer_norm_rms_epsilon") == 1e-6f);
  // layers 2 and 5 are global (every 3rd)
  const GgufKV* pattern = f->find_kv("gemma3.attention.sliding_window_pattern");
  REQUIRE(pattern != nullptr);
  REQUIRE(pattern->arr_type == GgufType::BOOL);
  REQUIRE(pattern->arr_count == 7);
  for (int l = 0; l < 7; ++l) CHECK((pattern->arr_data[l] != 0) == (l != 2 && l != 5));
  CHECK_FALSE(f->get_bool("tokenizer.ggml.add_space_prefix"));
  CHECK(f->get_u32("tokenizer.ggml.bos_token_id") == 2);
  CHECK(f->get_u32("tokenizer.ggml.eos_token_id") == 1);
  CHECK(f->get_u32("tokenizer.ggml.padding_token_id") == 0);
  auto tokens = f->get_arr_str("tokenizer.ggml.tokens");
  CHECK(tokens[105] == "<start_of_turn>");
  CHECK(tokens[106] == "<end_of_turn>");
  CHECK(f->tensors().size() == 2 + 7 * 13);
  CHECK(f->find("output.weight") == nullptr);
  check_shape(*f, "token_embd.weight", {64, 600}, GgmlType::F16);
  for (int l = 0; l < 7; ++l) {
    auto n = [l](const char* w) { return fmt::format("blk.{}.{}.weight", l, w); };
    check_shape(*f, n("attn_q"), {64, 192}, GgmlType::F16);
    check_shape(*f, n("attn_k"), {64, 48}, GgmlType::F16);
    check_shape(*f, n("attn_v"), {64, 48}, GgmlType::F16);
    check_shape(*f, n("attn_q_norm"), {48}, GgmlType::F32);
    check_shape(*f, n("attn_k_norm"), {48}, GgmlType::F32);
    check_shape(*f, n("attn_output"), {192, 64}, GgmlType::F16);
    for (const char* norm : {"attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"})
      check_shape(*f, n(norm), {64}, GgmlType::F32);
    check_shape(*f, n("ffn_gate"), {64, 128}, GgmlType::F16);
    check_shape(*f, n("ffn_up"), {64, 128}, GgmlType::F16);
    check_shape(*f, n("ffn_down"), {128, 64}, GgmlType::F16);
  }
}

TEST_CASE("K-quant weight types fall back to 32-blocks where rows are not a multiple of 256") {
  TempDir td;
  SynthConfig c = synth_preset("tiny-gemma3");
  c.width = 320, c.heads = 4, c.head_dim = 64, c.ffn = 512, c.layers = 1, c.type = GgmlType::Q4_K;
  CHECK(synth_matrix_type(GgmlType::Q4_K, 320) == GgmlType::Q5_0);
  CHECK(synth_matrix_type(GgmlType::Q5_K, 320) == GgmlType::Q5_1);
  CHECK(synth_matrix_type(GgmlType::Q6_K, 320) == GgmlType::Q8_0);
  CHECK(synth_matrix_type(GgmlType::Q6_K, 512) == GgmlType::Q6_K);
  std::string path = td.file("k.gguf");
  synth_write(c, path);
  auto f = GgufFile::open(path);
  check_shape(*f, "blk.0.attn_q.weight", {320, 256}, GgmlType::Q5_0);
  check_shape(*f, "blk.0.attn_output.weight", {256, 320}, GgmlType::Q4_K);
  check_shape(*f, "blk.0.ffn_down.weight", {512, 320}, GgmlType::Q4_K);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_1, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::BF16}) {
    c.type = t;
    synth_write(c, path);
    auto g = GgufFile::open(path);
    auto [mean, sd] = moments(g->tensor("blk.0.ffn_down.weight"));
    CHECK(sd == Approx(1.0 / std::sqrt(512.0)).epsilon(0.15));
  }
}

TEST_CASE("synthetic vocabulary: special and byte tokens, unique pieces that merge pairwise") {
  for (std::string arch : {"llama", "gemma3"}) {
    for (int size : {synth_min_vocab(arch), 1000, 5000, 40000}) {
      INFO(arch << " " << size);
      SynthVocab v = synth_vocab(arch, size);
      REQUIRE((int)v.tokens.size() == size);
      REQUIRE(v.scores.size() == v.tokens.size());
      REQUIRE(v.types.size() == v.tokens.size());
      std::set<std::string> all(v.tokens.begin(), v.tokens.end());
      CHECK(all.size() == v.tokens.size());
      CHECK(v.types[v.unk] == 2);
      CHECK(v.types[v.bos] == 3);
      CHECK(v.types[v.eos] == 3);
      int bytes = 0;
      float last_score = 1e9f;
      for (size_t i = 0; i < v.tokens.size(); ++i) {
        const std::string& t = v.tokens[i];
        if (v.types[i] == 6) {
          CHECK(t == fmt::format("<0x{:02X}>", bytes));
          ++bytes;
        }
        if (v.types[i] != 1) continue;
        CHECK(v.scores[i] < last_score);  // earlier pieces score higher
        last_score = v.scores[i];
        if (utf8_len(t) > 1) {
          INFO(t);
          CHECK(all.count(drop_last_char(t)) == 1);  // reachable by merging pairs
        }
      }
      CHECK(bytes == 256);
    }
  }
  SynthVocab l = synth_vocab("llama", 2000);
  CHECK(l.tokens[0] == "<unk>");
  CHECK(l.tokens[1] == "<s>");
  CHECK(l.tokens[2] == "</s>");
  CHECK(l.tokens[3] == "<0x00>");
  std::set<std::string> all(l.tokens.begin(), l.tokens.end());
  for (const char* piece : {"\xe2\x96\x81the", "\xe2\x96\x81" "and", "\xe2\x96\x81people", "\xe2\x96\x81The", "ing"})
    CHECK(all.count(piece) == 1);
  SynthVocab g = synth_vocab("gemma3", 2000);
  CHECK(g.tokens[0] == "<pad>");
  CHECK(g.tokens[1] == "<eos>");
  CHECK(g.tokens[2] == "<bos>");
  CHECK(g.tokens[3] == "<unk>");
  CHECK(g.tokens[105] == "<start_of_turn>");
  CHECK(g.tokens[106] == "<end_of_turn>");
  CHECK(g.types[105] == 3);
  CHECK_THROWS_WITH(synth_vocab("gemma3", 300), Catch::Contains("at least"));
  CHECK_THROWS(synth_vocab("gpt2", 3000));
}

TEST_CASE("bad synthetic settings are rejected with the flag named") {
  auto bad = [](auto mutate, const char* needle) {
    SynthConfig c = synth_preset("tiny-llama");
    mutate(c);
    CHECK_THROWS_WITH(synth_validate(c), Catch::Contains(needle));
  };
  bad([](SynthConfig& c) { c.arch = "mamba"; }, "--arch");
  bad([](SynthConfig& c) { c.layers = 0; }, "--layers");
  bad([](SynthConfig& c) { c.width = -5; }, "--width");
  bad([](SynthConfig& c) { c.heads = 6, c.kv_heads = 4; }, "--kv-heads");
  bad([](SynthConfig& c) { c.head_dim = 33; }, "--head-dim");
  bad([](SynthConfig& c) { c.vocab = 200; }, "--vocab");
  bad([](SynthConfig& c) { c.ffn = 100, c.type = GgmlType::Q4_0; }, "--ffn");
  bad([](SynthConfig& c) { c.width = 100, c.type = GgmlType::Q8_0; }, "--width");
  bad([](SynthConfig& c) { c.rope_base = 0; }, "--rope-base");
  bad([](SynthConfig& c) { c.arch = "gemma3", c.global_every = 0; }, "--global-every");
  bad([](SynthConfig& c) { c.arch = "gemma3", c.sliding_window = 0; }, "--sliding-window");
  CHECK_THROWS_WITH(synth_preset("llama4"), Catch::Contains("llama3-8b"));
  CHECK_THROWS_WITH(synth_defaults("rwkv"), Catch::Contains("rwkv"));
  for (auto& name : synth_preset_names()) CHECK_NOTHROW(synth_validate(synth_preset(name)));
  // the Llama-3-8B preset has the documented shape and a size to warn about
  SynthConfig l8 = synth_preset("llama3-8b");
  CHECK(l8.layers == 32);
  CHECK(l8.width == 4096);
  CHECK(l8.heads == 32);
  CHECK(l8.kv_heads == 8);
  CHECK(l8.head_dim == 128);
  CHECK(l8.ffn == 14336);
  CHECK(l8.vocab == 128256);
  CHECK(synth_file_bytes(l8) > (4ull << 30));
}

TEST_CASE("topkv model synth / info on the command line") {
  const std::string exe = std::string(TOPKV_BINARY_DIR) + "/bin/topkv";
  if (!fs::exists(exe)) {
    WARN("skipped: " << exe << " is not built (build the topkv target)");
    return;
  }
  TempDir td;
  auto run = [&](const std::string& args) {
    return std::system((exe + " " + args + " > " + td.file("out.txt") + " 2>&1").c_str());
  };
  const std::string out = td.file("m.gguf");
  CHECK(run("model synth --preset tiny-gemma3 --type q8_0 -q -o " + out) == 0);
  CHECK(GgufFile::open(out)->get_u32("gemma3.block_count") == 6);
  CHECK(run("model synth --preset tiny-gemma3 -q -o " + out) != 0);  // exists, no --force
  CHECK(run("model synth --preset tiny-gemma3 --layers 3 --force -q -o " + out) == 0);
  CHECK(GgufFile::open(out)->get_u32("gemma3.block_count") == 3);
  CHECK(run("model info " + out) == 0);
  for (const char* args : {"--arch llama --sliding-window 8", "--preset tiny-llama --arch gemma3", "--type q3_k",
                           "--heads 5 --kv-heads 2", "--arch gemma3 --tied", "--layers x"})
    CHECK(run(std::string("model synth ") + args + " -q -o " + td.file("bad.gguf")) != 0);
  CHECK_FALSE(fs::exists(td.file("bad.gguf")));
  CHECK(run("model info " + td.file("missing.gguf")) != 0);
}
