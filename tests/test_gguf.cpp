// GGUF reader and writer: round trip of every metadata and tensor type; every
// malformed-file case gives an Error naming the problem; truncation and byte
// flips never crash; the real Gemma 3 270M file when it is present.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "src/common/dtype.h"
#include "src/common/error.h"
#include "src/model/gguf.h"
#include "src/model/gguf_writer.h"
#include "tests/test_util.h"

using namespace topkv;
namespace fs = std::filesystem;

namespace {

using test::TempDir;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void write_all(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), (std::streamsize)bytes.size());
}

// Raw GGUF bytes, written field by field, for files the writer would refuse.
struct Raw {
  std::string b;
  Raw& u32(uint32_t v) { b.append((const char*)&v, 4); return *this; }
  Raw& u64(uint64_t v) { b.append((const char*)&v, 8); return *this; }
  Raw& str(std::string_view s) { u64(s.size()); b.append(s); return *this; }
  Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b += "GGUF";
    return u32(version).u64(n_tensors).u64(n_kv);
  }
  Raw& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
  Raw& tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).u32((uint32_t)ne.size());
    for (auto e : ne) u64(e);
    return u32(type).u64(offset);
  }
  Raw& pad(size_t align = 32) { b.resize((b.size() + align - 1) / align * align, '\0'); return *this; }
  Raw& zeros(size_t n) { b.append(n, '\0'); return *this; }
};

std::vector<float> random_values(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

const GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                              GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                              GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

// A small valid file: a few metadata values and one tensor of each type.
void write_small_model(const std::string& path, uint32_t alignment = 32) {
  std::mt19937 rng(3);
  GgufWriter w;
  if (alignment != 32) w.set_alignment(alignment);
  w.set_str("general.architecture", "llama");
  w.set_u32("llama.block_count", 2);
  w.set_f32("llama.rope.freq_base", 10000.f);
  w.set_arr_str("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "\xe2\x96\x81the"});
  w.set_arr_f32("tokenizer.ggml.scores", {0.f, 0.f, 0.f, -1.5f});
  w.set_arr_i32("tokenizer.ggml.token_type", {2, 3, 3, 1});
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  int k = 0;
  for (GgmlType t : kAllTypes) {
    int64_t row = ggml_type_info(t).block_elems == 256 ? 256 : 64;
    w.add_tensor_f32(fmt::format("t{}", k++), t, {row, 3}, random_values(row * 3, rng));
  }
  w.write(path);
}

// Opening `bytes` must fail with an Error whose message contains every part.
// The error from the file, and the same message (with the name given for the
// path) from the same bytes in memory (GgufFile::from_memory, the fuzzer's way in).
void expect_error(const TempDir& td, const std::string& bytes, std::vector<std::string> parts) {
  std::string path = td.file("bad.gguf");
  write_all(path, bytes);
  std::string msg;
  try {
    GgufFile::open(path);
    FAIL("opened a malformed file; expected an error containing '" << parts[0] << "'");
  } catch (const Error& e) {
    msg = e.what();
    INFO("message: " << msg);
    for (auto& p : parts) CHECK(msg.find(p) != std::string::npos);
    CHECK(msg.find(path) != std::string::npos);
  }
  const std::vector<uint8_t> copy(bytes.begin(), bytes.end());  // exactly sized: ASan sees any read past it
  try {
    GgufFile::from_memory(copy.data(), copy.size(), path);
    FAIL("parsed a malformed file from memory; expected an error containing '" << parts[0] << "'");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == msg);
  }
}

}  // namespace

TEST_CASE("GGUF round trip: every metadata value type and every tensor type") {
  TempDir td;
  std::mt19937 rng(17);
  for (uint32_t alignment : {32u, 64u}) {
    GgufWriter w;
    if (alignment != 32) w.set_alignment(alignment);
    w.set_u8("k.u8", 200);
    w.set_i8("k.i8", -100);
    w.set_u16("k.u16", 60000);
    w.set_i16("k.i16", -30000);
    w.set_u32("k.u32", 4000000000u);
    w.set_i32("k.i32", -2000000000);
    w.set_u64("k.u64", 1ull << 50);
    w.set_i64("k.i64", -(1ll << 50));
    w.set_f32("k.f32", 1.5e-6f);
    w.set_f64("k.f64", 3.141592653589793);
    w.set_bool("k.bool", true);
    w.set_bool("k.false", false);
    w.set_str("k.str", "h\xc3\xa9llo\nworld");
    w.set_str("k.empty", "");
    w.set_arr_str("k.arr_str", {"", "\xe2\x96\x81the", "<0x0A>", std::string(1000, 'x')});
    w.set_arr_f32("k.arr_f32", {1.f, -2.5f, 1e30f});
    w.set_arr_i32("k.arr_i32", {1, -2, 2147483647});
    const uint16_t u16s[3] = {1, 2, 65535};
    w.set_arr("k.arr_u16", GgufType::U16, u16s, 3);
    const double f64s[2] = {0.25, -8.0};
    w.set_arr("k.arr_f64", GgufType::F64, f64s, 2);
    w.set_arr("k.arr_empty", GgufType::U8, nullptr, 0);
    w.set_u32("k.replaced", 1);
    w.set_u32("k.replaced", 2);  // replaces, keeps one entry
    std::vector<std::vector<float>> values;
    std::vector<std::vector<int64_t>> shapes;
    int k = 0;
    for (GgmlType t : kAllTypes) {
      const int64_t be = ggml_type_info(t).block_elems;
      std::vector<int64_t> ne = be == 1 ? std::vector<int64_t>{7, 3, 2} : std::vector<int64_t>{be * 2, 5};
      if (t == GgmlType::F32) ne = {13};
      int64_t n = 1;
      for (auto e : ne) n *= e;
      values.push_back(random_values(n, rng));
      shapes.push_back(ne);
      w.add_tensor_f32(fmt::format("tensor.{}.{}", k++, ggml_type_info(t).name), t, ne, values.back());
    }
    std::vector<uint8_t> raw(ggml_row_bytes(GgmlType::Q8_0, 64));
    for (size_t i = 0; i < raw.size(); ++i) raw[i] = (uint8_t)(i * 7);
    raw[0] = 0x00, raw[1] = 0x3c, raw[34] = 0x00, raw[35] = 0x38;  // finite scales 1.0, 0.5
    w.add_tensor_raw("raw.q8_0", GgmlType::Q8_0, {64}, raw);
    CHECK(w.tensor_count() == std::size(kAllTypes) + 1);
    std::string path = td.file("rt.gguf");
    w.write(path);
    CHECK_FALSE(fs::exists(path + ".tmp"));

    auto f = GgufFile::open(path);
    CHECK(f->version() == 3);
    CHECK(f->alignment() == alignment);
    CHECK(f->data_offset() % alignment == 0);
    CHECK(f->get_u32("k.u8") == 200);
    CHECK(f->get_i32("k.i8") == -100);
    CHECK(f->get_u32("k.u16") == 60000);
    CHECK(f->get_i32("k.i16") == -30000);
    CHECK(f->get_u32("k.u32") == 4000000000u);
    CHECK(f->get_i32("k.i32") == -2000000000);
    CHECK(f->get_u64("k.u64") == (1ull << 50));
    CHECK(f->find_kv("k.i64")->i == -(1ll << 50));
    CHECK(f->get_f32("k.f32") == 1.5e-6f);
    CHECK(f->find_kv("k.f64")->f == 3.141592653589793);
    CHECK(f->get_f32("k.f64") == (float)3.141592653589793);
    CHECK(f->get_bool("k.bool"));
    CHECK_FALSE(f->get_bool("k.false"));
    CHECK(f->get_str("k.str") == "h\xc3\xa9llo\nworld");
    CHECK(f->get_str("k.empty").empty());
    CHECK(f->get_arr_str("k.arr_str") ==
          std::vector<std::string>{"", "\xe2\x96\x81the", "<0x0A>", std::string(1000, 'x')});
    CHECK(f->get_arr_f32("k.arr_f32") == std::vector<float>{1.f, -2.5f, 1e30f});
    CHECK(f->get_arr_i32("k.arr_i32") == std::vector<int32_t>{1, -2, 2147483647});
    CHECK(f->get_arr_i32("k.arr_u16") == std::vector<int32_t>{1, 2, 65535});
    CHECK(f->get_arr_f32("k.arr_f64") == std::vector<float>{0.25f, -8.f});
    CHECK(f->get_arr_size("k.arr_empty") == 0);
    CHECK(f->get_u32("k.replaced") == 2);
    CHECK(f->metadata().size() == 21 + (alignment != 32 ? 1 : 0));
    CHECK(f->metadata()[alignment != 32 ? 1 : 0].key == "k.u8");  // file order kept
    // defaults and value strings
    CHECK(f->get_u32_or("missing", 7) == 7);
    CHECK(f->get_str_or("missing", "x") == "x");
    CHECK(f->get_f32_or("k.f32", 0) == 1.5e-6f);
    CHECK(f->get_bool_or("missing", true));
    CHECK(f->find_kv("k.arr_str")->value_string(2) == "[4 x str: \"\", \"\xe2\x96\x81the\", ...]");
    CHECK(f->find_kv("k.bool")->value_string() == "true");
    CHECK(f->find_kv("k.str")->value_string() == "\"h\xc3\xa9llo\\nworld\"");

    REQUIRE(f->tensors().size() == std::size(kAllTypes) + 1);
    for (size_t i = 0; i < std::size(kAllTypes); ++i) {
      const GgufTensor& t = f->tensors()[i];
      GgmlType type = kAllTypes[i];
      INFO(t.name);
      CHECK(&f->tensor(t.name) == &t);
      CHECK(t.type == type);
      CHECK(t.n_dims == (int)shapes[i].size());
      for (int d = 0; d < 4; ++d) CHECK(t.ne[d] == (d < t.n_dims ? shapes[i][d] : 1));
      CHECK((t.offset % alignment) == 0);
      CHECK(t.row_bytes == ggml_row_bytes(type, t.ne[0]));
      CHECK(t.nbytes == t.row_bytes * t.nrows());
      // each row decodes to exactly what quantising the source row gives
      std::vector<uint8_t> q(t.row_bytes);
      std::vector<float> want(t.ne[0]), got(t.ne[0]);
      for (int64_t r = 0; r < t.nrows(); ++r) {
        quantize_row(type, values[i].data() + r * t.ne[0], q.data(), t.ne[0]);
        REQUIRE(std::memcmp(q.data(), t.row(r), t.row_bytes) == 0);
        dequantize_row(type, t.row(r), got.data(), t.ne[0]);
        dequantize_row(type, q.data(), want.data(), t.ne[0]);
        REQUIRE(got == want);
      }
    }
    const GgufTensor& rt = f->tensor("raw.q8_0");
    CHECK(std::memcmp(rt.data, raw.data(), raw.size()) == 0);
    CHECK(f->tensor_bytes() == w.data_bytes());
    CHECK(f->find("nope") == nullptr);
    CHECK_THROWS_WITH(f->tensor("nope"), Catch::Contains("nope"));
    // the content hash is stable across opens and sees metadata changes
    uint64_t h = f->content_hash();
    CHECK(GgufFile::open(path)->content_hash() == h);
    w.set_u32("k.replaced", 3);
    w.write(path);
    CHECK(GgufFile::open(path)->content_hash() != h);
  }
}

TEST_CASE("metadata getters name the key when it is missing or of the wrong type") {
  TempDir td;
  GgufWriter w;
  w.set_str("s", "x");
  w.set_i32("neg", -1);
  w.set_u64("big", 1ull << 40);
  w.set_arr_f32("af", {1.f});
  w.set_arr_str("as", {"a"});
  std::string path = td.file("g.gguf");
  w.write(path);
  auto f = GgufFile::open(path);
  CHECK_THROWS_WITH(f->get_u32("missing.key"), Catch::Contains("missing.key") && Catch::Contains(path));
  CHECK_THROWS_WITH(f->get_u32("s"), Catch::Contains("'s'") && Catch::Contains("str"));
  CHECK_THROWS_WITH(f->get_u32("neg"), Catch::Contains("neg") && Catch::Contains("u32"));
  CHECK_THROWS_WITH(f->get_u32("big"), Catch::Contains("big"));
  CHECK(f->get_u64("big") == (1ull << 40));
  CHECK(f->get_i32("neg") == -1);
  CHECK_THROWS_WITH(f->get_f32("s"), Catch::Contains("'s'"));
  CHECK_THROWS_WITH(f->get_bool("neg"), Catch::Contains("neg"));
  CHECK_THROWS_WITH(f->get_str("neg"), Catch::Contains("neg"));
  CHECK_THROWS_WITH(f->get_arr_str("af"), Catch::Contains("af") && Catch::Contains("array of f32"));
  CHECK_THROWS_WITH(f->get_arr_f32("as"), Catch::Contains("as"));
  CHECK_THROWS_WITH(f->get_arr_i32("s"), Catch::Contains("'s'"));
  CHECK_THROWS_WITH(f->get_u32_or("s", 1), Catch::Contains("'s'"));  // present but wrong: still an error
}

TEST_CASE("the writer rejects bad tensors and leaves no file behind on failure") {
  TempDir td;
  GgufWriter w;
  CHECK_THROWS_WITH(w.add_tensor_f32("a", GgmlType::Q4_K, {100, 2}, std::vector<float>(200)),
                    Catch::Contains("Q4_K"));
  CHECK_THROWS_WITH(w.add_tensor_f32("a", GgmlType::F32, {2, 2}, std::vector<float>(3)), Catch::Contains("'a'"));
  CHECK_THROWS(w.add_tensor_f32("a", GgmlType::F32, {}, {}));
  CHECK_THROWS(w.add_tensor_f32("a", GgmlType::F32, {1, 1, 1, 1, 1}, {1.f}));
  CHECK_THROWS(w.add_tensor_f32("a", GgmlType::F32, {0}, {}));
  CHECK_THROWS(w.add_tensor_raw("a", GgmlType::Q8_0, {32}, std::vector<uint8_t>(33)));
  CHECK_THROWS_WITH(w.add_tensor_f32("b", (GgmlType)16, {256}, std::vector<float>(256)), Catch::Contains("IQ2_XXS"));
  w.add_tensor_f32("a", GgmlType::F32, {2}, {1.f, 2.f});
  CHECK_THROWS_WITH(w.add_tensor_f32("a", GgmlType::F32, {2}, {1.f, 2.f}), Catch::Contains("twice"));
  CHECK_THROWS(w.set_alignment(48));
  // a filler that fails mid-write: no file, no .tmp
  w.add_tensor("boom", GgmlType::F32, {4}, [](int64_t, int64_t, uint8_t*) { fail("filler failed"); });
  std::string path = td.file("never.gguf");
  CHECK_THROWS_WITH(w.write(path), Catch::Contains("filler failed"));
  CHECK_FALSE(fs::exists(path));
  CHECK_FALSE(fs::exists(path + ".tmp"));
  for (auto& e : fs::directory_iterator(td.dir))  // nor its unique temporary (".never.gguf.XXXXXX")
    CHECK(e.path().filename().string().rfind(".never.gguf", 0) != 0);
  std::ofstream(td.file("plain")) << "a file, not a folder";
  CHECK_THROWS_WITH(w.write(td.file("plain/x.gguf")), Catch::Contains("cannot be written"));
}

TEST_CASE("malformed GGUF files give an Error that names the problem") {
  TempDir td;
  SECTION("not GGUF") {
    CHECK_THROWS_WITH(GgufFile::open(td.file("missing.gguf")), Catch::Contains("cannot open") &&
                                                                Catch::Contains("missing.gguf"));
    CHECK_THROWS_WITH(GgufFile::open(td.dir.string()), Catch::Contains("not a regular file"));
    expect_error(td, "", {"empty"});
    expect_error(td, "GG", {"not a GGUF file"});
    expect_error(td, std::string("ggjt\x03\0\0\0", 8) + std::string(100, '\0'), {"not a GGUF file", "old GGML"});
    expect_error(td, "PK\x03\x04 a zip file, not a model", {"not a GGUF file", "\"PK"});
  }
  SECTION("versions") {
    expect_error(td, Raw().header(0, 0, 1).b, {"version 1"});
    expect_error(td, Raw().header(0, 0, 4).b, {"unsupported GGUF version 4"});
    expect_error(td, Raw().header(0, 0, 0x03000000).b, {"big-endian"});
    auto f = td.file("v2.gguf");
    write_all(f, Raw().header(0, 1, 2).kv_u32("a", 5).b);
    CHECK(GgufFile::open(f)->version() == 2);
    CHECK(GgufFile::open(f)->get_u32("a") == 5);
  }
  SECTION("truncated at every section") {
    std::string path = td.file("ok.gguf");
    write_small_model(path);
    std::string good = read_all(path);
    auto f = GgufFile::open(path);
    const size_t data = f->data_offset();
    expect_error(td, good.substr(0, 12), {"truncated", "header"});
    expect_error(td, good.substr(0, 30), {"truncated", "metadata entry 0"});
    expect_error(td, good.substr(0, 24 + 8 + 20 + 4 + 8 + 2), {"truncated", "'general.architecture'"});
    expect_error(td, good.substr(0, data - 40), {"truncated", "tensor info"});
    expect_error(td, good.substr(0, data + 10), {"truncated", "tensor '"});
    const GgufTensor& last = f->tensor("t10");
    expect_error(td, good.substr(0, data + last.offset + last.nbytes - 1), {"truncated", "tensor 't10'"});
  }
  SECTION("lengths and counts beyond the file") {
    expect_error(td, Raw().header(0, 1).u64(1ull << 40).zeros(64).b, {"key", "length", "beyond the end"});
    expect_error(td, Raw().header(0, 1).str("k").u32(8).u64(1ull << 62).b, {"'k'", "beyond the end"});
    expect_error(td, Raw().header(0, 1).str("k").u32(9).u32(4).u64(1ull << 62).b, {"'k'", "claims", "elements"});
    expect_error(td, Raw().header(0, 1).str("k").u32(9).u32(8).u64(1ull << 62).b, {"'k'", "claims", "strings"});
    expect_error(td, Raw().header(0, 1).str("k").u32(9).u32(8).u64(2).str("a").u64(99).b, {"('k') element 1"});
    expect_error(td, Raw().header(0, 1ull << 40).b, {"truncated", "metadata entry 0 of 1099511627776"});
    expect_error(td, Raw().header(1ull << 40, 0).b, {"truncated", "tensor info 0 of 1099511627776"});
    expect_error(td, Raw().header(3, 0).tensor("a", {8}, 0, 0).b, {"truncated", "tensor info 1 of 3"});
  }
  SECTION("bad metadata values") {
    expect_error(td, Raw().header(0, 1).str("k").u32(13).u32(0).b, {"'k'", "unknown value type 13"});
    expect_error(td, Raw().header(0, 1).str("k").u32(9).u32(77).u64(0).b, {"'k'", "element type 77"});
    expect_error(td, Raw().header(0, 1).str("k").u32(9).u32(9).u64(0).b, {"'k'", "array of arrays"});
    expect_error(td, Raw().header(0, 1).str("k").u32(7).b + "\x02", {"'k'", "bool"});
    expect_error(td, Raw().header(0, 2).kv_u32("k", 1).kv_u32("k", 2).b, {"'k'", "twice"});
    expect_error(td, Raw().header(0, 1).kv_u32("general.alignment", 48).b, {"alignment", "power of two"});
    expect_error(td, Raw().header(0, 1).str("general.alignment").u32(8).str("32").b, {"alignment", "u32"});
  }
  SECTION("bad tensor infos") {
    auto one = [](std::vector<uint64_t> ne, uint32_t type, uint64_t offset, size_t data) {
      return Raw().header(1, 0).tensor("w", std::move(ne), type, offset).pad().zeros(data).b;
    };
    CHECK_NOTHROW([&] { write_all(td.file("good.gguf"), one({8, 2}, 0, 0, 64)); return GgufFile::open(td.file("good.gguf")); }());
    expect_error(td, one({8, 2}, 0, 32, 64), {"'w'", "beyond the end"});
    expect_error(td, one({8, 2}, 0, 8, 128), {"'w'", "offset 8", "alignment"});
    expect_error(td, one({1, 1, 1, 1, 1}, 0, 0, 64), {"'w'", "5 dimensions"});
    expect_error(td, Raw().header(1, 0).str("w").u32(0).u32(0).u64(0).pad().b, {"'w'", "0 dimensions"});
    expect_error(td, one({8, 0}, 0, 0, 64), {"'w'", "dimension 1", "empty"});
    expect_error(td, one({1ull << 40, 1ull << 40}, 0, 0, 64), {"'w'", "overflows"});
    expect_error(td, one({1ull << 62, 2}, 0, 0, 64), {"'w'", "overflows"});
    expect_error(td, one({1ull << 40, 1ull << 22}, 0, 0, 64), {"'w'", "overflows"});  // 2^62 floats = 2^64 bytes
    expect_error(td, one({256}, 16, 0, 64), {"'w'", "IQ2_XXS", "not support"});
    expect_error(td, one({256}, 10, 0, 64), {"'w'", "Q2_K"});
    expect_error(td, one({256}, 200, 0, 64), {"'w'", "unknown", "200"});
    expect_error(td, one({100}, 12, 0, 1024), {"'w'", "multiple", "Q4_K"});
    expect_error(td, Raw().header(1, 0).tensor("", {8}, 0, 0).pad().zeros(64).b, {"empty name"});
    expect_error(td, Raw().header(2, 0).tensor("w", {8}, 0, 0).tensor("w", {8}, 0, 32).pad().zeros(64).b,
                 {"'w'", "twice"});
    expect_error(td, Raw().header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).pad().zeros(96).b,
                 {"'a'", "'b'", "overlap"});
    expect_error(td, Raw().header(2, 0).tensor("a", {8}, 0, 0).tensor("b", {8}, 0, 0).pad().zeros(64).b,
                 {"overlap"});
  }
}

TEST_CASE("a GGUF parsed from memory is the file parsed from its mapping") {
  TempDir td;
  std::string path = td.file("ok.gguf");
  write_small_model(path);
  const std::string bytes = read_all(path);
  auto f = GgufFile::open(path);
  auto m = GgufFile::from_memory(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "in memory");
  CHECK(m->path() == "in memory");
  CHECK(m->file_size() == f->file_size());
  CHECK(m->data_offset() == f->data_offset());
  CHECK(m->content_hash() == f->content_hash());
  REQUIRE(m->metadata().size() == f->metadata().size());
  for (size_t i = 0; i < f->metadata().size(); ++i) {
    CHECK(m->metadata()[i].key == f->metadata()[i].key);
    CHECK(m->metadata()[i].value_string(1000) == f->metadata()[i].value_string(1000));
  }
  REQUIRE(m->tensors().size() == f->tensors().size());
  for (size_t i = 0; i < f->tensors().size(); ++i) {
    const GgufTensor &a = m->tensors()[i], &b = f->tensors()[i];
    CHECK(a.name == b.name);
    CHECK(a.shape_string() == b.shape_string());
    CHECK(a.data == reinterpret_cast<const uint8_t*>(bytes.data()) + m->data_offset() + a.offset);  // not copied
    CHECK(std::equal(a.data, a.data + a.nbytes, b.data));
  }
}

TEST_CASE("truncating or flipping bytes of a valid file never crashes") {
  TempDir td;
  std::string path = td.file("ok.gguf");
  write_small_model(path, 64);
  const std::string good = read_all(path);
  int opened = 0, rejected = 0, n_files = 0;
  // Touch everything a caller might: metadata strings, arrays, every tensor row.
  // (A new file each time: truncating one in place is slow on disks mounted
  // with `discard`.)
  auto exercise = [&](const std::string& bytes) {
    std::string bad_path = td.file(fmt::format("fuzz{}.gguf", n_files++));
    write_all(bad_path, bytes);
    try {
      auto f = GgufFile::open(bad_path);
      for (auto& kv : f->metadata()) (void)kv.value_string(1000);
      for (auto& t : f->tensors()) {
        std::vector<float> y(t.ne[0]);
        for (int64_t r = 0; r < t.nrows(); ++r) dequantize_row(t.type, t.row(r), y.data(), t.ne[0]);
        if (t.nrows()) (void)dot_quant_row(t.type, t.row(t.nrows() - 1), y.data(), t.ne[0]);
      }
      (void)f->content_hash();
      ++opened;
    } catch (const Error&) {
      ++rejected;
    }
  };
  size_t data_end = 0;  // end of the last tensor's bytes; the file may pad past it
  {
    auto f = GgufFile::open(path);
    for (auto& t : f->tensors()) data_end = std::max<size_t>(data_end, f->data_offset() + t.offset + t.nbytes);
  }
  for (size_t len = 0; len < data_end; len += (len < 600 ? 1 : 37)) exercise(good.substr(0, len));
  CHECK(opened == 0);  // every prefix that cuts into the tensor data is rejected
  std::mt19937 rng(2024);
  std::uniform_int_distribution<size_t> pos(0, good.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255), nflip(1, 4);
  for (int it = 0; it < 1500; ++it) {
    std::string b = good;
    // bias towards the header and metadata, where flips change structure
    for (int k = nflip(rng); k-- > 0;) b[it % 2 ? pos(rng) % 700 : pos(rng)] = (char)byte(rng);
    exercise(b);
  }
  exercise(good);
  CHECK(opened > 0);
  CHECK(rejected > 0);
}

TEST_CASE("the real Gemma 3 270M Q4_K_M file opens and has the documented geometry") {
  std::string path;
  if (const char* env = std::getenv("TOPKV_MODEL")) path = env;
  else path = std::string(TOPKV_SOURCE_DIR) + "/.models/gemma-3-270m-q4_k_m.gguf";
  if (!fs::exists(path)) {
    WARN("skipped: no model at " << path << " (set TOPKV_MODEL or place the file under .models/)");
    return;
  }
  auto f = GgufFile::open(path);
  CHECK(f->version() == 3);
  CHECK(f->get_str("general.architecture") == "gemma3");
  CHECK(f->get_u32("gemma3.block_count") == 18);
  CHECK(f->get_u32("gemma3.embedding_length") == 640);
  CHECK(f->get_u32("gemma3.feed_forward_length") == 2048);
  CHECK(f->get_u32("gemma3.attention.head_count") == 4);
  CHECK(f->get_u32("gemma3.attention.head_count_kv") == 1);
  CHECK(f->get_u32("gemma3.attention.key_length") == 256);
  CHECK(f->get_u32("gemma3.attention.value_length") == 256);
  CHECK(f->get_u32("gemma3.attention.sliding_window") == 512);
  CHECK(f->get_u32("gemma3.context_length") == 32768);
  CHECK(f->get_f32("gemma3.rope.freq_base") == 1e6f);
  CHECK(f->get_f32("gemma3.attention.layer_norm_rms_epsilon") == Approx(1e-6f));
  CHECK(f->get_str("tokenizer.ggml.model") == "llama");
  auto tokens = f->get_arr_str("tokenizer.ggml.tokens");
  REQUIRE(tokens.size() == 262144);
  CHECK(tokens[0] == "<pad>");
  CHECK(tokens[1] == "<eos>");
  CHECK(tokens[2] == "<bos>");
  CHECK(tokens[3] == "<unk>");
  CHECK(tokens[105] == "<start_of_turn>");
  CHECK(tokens[106] == "<end_of_turn>");
  CHECK(f->get_arr_f32("tokenizer.ggml.scores").size() == 262144);
  CHECK(f->get_arr_i32("tokenizer.ggml.token_type").size() == 262144);
  CHECK(f->get_u32("tokenizer.ggml.bos_token_id") == 2);
  CHECK(f->get_u32("tokenizer.ggml.eos_token_id") == 1);
  CHECK(f->get_bool("tokenizer.ggml.add_bos_token"));
  CHECK_FALSE(f->get_bool("tokenizer.ggml.add_space_prefix"));
  CHECK(f->tensors().size() == 2 + 18 * 13);  // no output.weight: tied to token_embd
  CHECK(f->find("output.weight") == nullptr);
  const GgufTensor& emb = f->tensor("token_embd.weight");
  CHECK(emb.ne[0] == 640);
  CHECK(emb.ne[1] == 262144);
  std::set<std::string> types;
  for (auto& t : f->tensors()) types.insert(ggml_type_info(t.type).name);
  CHECK(types == std::set<std::string>{"F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"});
  for (int l = 0; l < 18; ++l)
    for (const char* n : {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output",
                          "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm"})
      CHECK(f->find(fmt::format("blk.{}.{}.weight", l, n)) != nullptr);
  // every tensor's first and last rows decode to finite values, and the fused
  // dot agrees with the reference on real weights
  std::mt19937 rng(5);
  for (auto& t : f->tensors()) {
    std::vector<float> y(t.ne[0]), x = random_values(t.ne[0], rng);
    for (int64_t r : {(int64_t)0, t.nrows() - 1}) {
      dequantize_row(t.type, t.row(r), y.data(), t.ne[0]);
      for (float v : y) REQUIRE(std::isfinite(v));
      REQUIRE(dot_quant_row(t.type, t.row(r), x.data(), t.ne[0]) ==
              Approx(dot_quant_row_ref(t.type, t.row(r), x.data(), t.ne[0])).epsilon(1e-4).margin(1e-4));
    }
  }
  CHECK(f->content_hash() == GgufFile::open(path)->content_hash());
}
