#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <cstring>
#include <filesystem>

#include "bench/kv_dump.h"
#include "bench/synthetic.h"
#include "src/common/error.h"

using namespace topkv;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  auto p = fs::temp_directory_path() / ("topkv_test_kv_dump_" + std::to_string(::getpid()));
  fs::create_directories(p);
  return p;
}

SyntheticData tiny(DType t, uint64_t seed, int64_t n = 777, int d = 64, int group = 4, int heads = 2) {
  SyntheticConfig c;
  c.n_keys = n;
  c.head_dim = d;
  c.group = group;
  c.kv_heads = heads;
  c.n_queries = 5;
  c.dtype = t;
  c.seed = seed;
  return generate_synthetic(c, 2);
}

// `data` written as layer `layer` of a one-layer dump `name` in `dir`; its path.
std::string write_one_layer(const fs::path& dir, const char* name, int layer, const AttentionData& data) {
  KvDumpWriter w("m");
  w.add_layer(layer, data);
  auto path = (dir / name).string();
  w.write(path);
  return path;
}

bool same_rows(const RowStore& a, const RowStore& b) {
  if (a.size() != b.size() || a.dtype() != b.dtype() || a.dim() != b.dim()) return false;
  for (int64_t i = 0; i < a.size(); ++i)
    if (std::memcmp(a.row(i), b.row(i), a.row_bytes())) return false;
  return true;
}

// Row i of a and row j of b hold the same values (as fp32).
bool same_row_f32(const RowStore& a, int64_t i, const RowStore& b, int64_t j) {
  std::vector<float> x((size_t)a.dim()), y((size_t)b.dim());
  a.row_f32(i, x.data());
  b.row_f32(j, y.data());
  return x == y;
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    FAIL("no error (expected '" << needle << "')");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("KV dump: write -> read round trip for f32, f16 and bf16, two layers, GQA heads") {
  auto dir = temp_dir();
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    auto l0 = tiny(t, 1), l5 = tiny(t, 2);
    KvDumpWriter w("tiny-model");
    w.add_layer(0, l0.data);
    w.add_layer(5, l5.data);
    auto path = (dir / (std::string("dump_") + dtype_name(t) + ".safetensors")).string();
    w.write(path);

    KvDumpReader r(path);
    CHECK(r.model() == "tiny-model");
    CHECK(r.layers() == std::vector<int>{0, 5});
    auto s = r.layer_shape(5);
    CHECK(s.kv_heads == 2);
    CHECK(s.q_heads == 8);
    CHECK(s.group() == 4);
    CHECK(s.n_keys == 777);
    CHECK(s.head_dim == 64);
    CHECK(s.n_queries == 5);
    CHECK(s.key_dtype == st_dtype_of(t));
    CHECK(r.scale(0) == Approx(l0.data.scale).epsilon(1e-7));
    CHECK(r.key_position0(0) == 0);
    CHECK(r.query_position0(0) == 777);
    for (auto [layer, src] : {std::pair{0, &l0}, std::pair{5, &l5}})
      for (int h = 0; h < 2; ++h) {
        auto head = r.load_head(layer, h);
        const auto& ref = src->data.heads[(size_t)h];
        CHECK(same_rows(*head.keys, *ref.keys));
        CHECK(same_rows(*head.values, *ref.values));
        CHECK(head.group == 4);
        CHECK(head.n_queries == 5);
        CHECK(head.queries == ref.queries);
      }
    auto data = r.load(5, {1}, std::nullopt, 3);
    CHECK(data.heads.size() == 1);
    CHECK(data.heads[0].n_queries == 3);
    CHECK(data.scale == r.scale(5));
    CHECK(data.source.find("layer 5") != std::string::npos);
  }
  fs::remove_all(dir);
}

TEST_CASE("KV dump: the first keys are left out on request, and skipping them all is an error") {
  auto dir = temp_dir();
  auto src = tiny(DType::F16, 2, 301, 64, 2, 2);
  KvDumpReader r(write_one_layer(dir, "skip.safetensors", 3, src.data));
  for (int64_t skip : {int64_t{0}, int64_t{1}, int64_t{4}, int64_t{300}}) {
    CAPTURE(skip);
    auto data = r.load(3, {0, 1}, std::nullopt, 0, skip);
    for (int h = 0; h < 2; ++h) {
      const auto& got = data.heads[(size_t)h];
      const auto& ref = src.data.heads[(size_t)h];
      REQUIRE(got.keys->size() == 301 - skip);
      REQUIRE(got.values->size() == 301 - skip);
      for (int64_t i = 0; i < 301 - skip; ++i) {
        CHECK(same_row_f32(*got.keys, i, *ref.keys, i + skip));
        CHECK(same_row_f32(*got.values, i, *ref.values, i + skip));
      }
      CHECK(got.queries == ref.queries);
    }
    if (skip) CHECK(data.source.find(fmt::format("first {} keys left out", skip)) != std::string::npos);
  }
  CHECK_THROWS_WITH(r.load_head(3, 0, std::nullopt, 0, 301), Catch::Matchers::Contains("leaves none"));
  CHECK_THROWS_WITH(r.load_head(3, 0, std::nullopt, 0, -1), Catch::Matchers::Contains("skipped"));
  fs::remove_all(dir);
}

TEST_CASE("KV dump: heads load into another element type on request") {
  auto dir = temp_dir();
  auto src = tiny(DType::BF16, 3, 4097, 128, 1, 1);
  KvDumpReader r(write_one_layer(dir, "conv.safetensors", 2, src.data));
  auto h = r.load_head(2, 0, DType::F32);
  REQUIRE(h.keys->dtype() == DType::F32);
  for (int64_t i : {0L, 1L, 4096L}) {  // bf16 -> f32 is exact
    CHECK(same_row_f32(*h.keys, i, *src.data.heads[0].keys, i));
    CHECK(same_row_f32(*h.values, i, *src.data.heads[0].values, i));
  }
  auto f16 = r.load_head(2, 0, DType::F16);
  CHECK(f16.keys->dtype() == DType::F16);
  CHECK(f16.keys->size() == 4097);
  fs::remove_all(dir);
}

TEST_CASE("KV dump: a dump made by another tool (hand-assembled, GQA order, extra tensors) reads right") {
  // As a Python script would write it: BF16 keys, F16 queries, token ids, no
  // scale (defaults to 1/sqrt(d)), keys starting at position 100.
  auto dir = temp_dir();
  const int kvh = 2, qh = 6, n = 3, d = 4, nq = 2;
  std::vector<uint16_t> keys(kvh * n * d), values(kvh * n * d), queries(nq * qh * d);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = f32_to_bf16((float)i), values[i] = f32_to_bf16(-(float)i);
  // query (j, head h, dim c) = 100 j + 10 h + c: the loaded copy shows where it came from
  for (int j = 0; j < nq; ++j)
    for (int h = 0; h < qh; ++h)
      for (int c = 0; c < d; ++c) queries[(j * qh + h) * d + c] = f32_to_f16(100.f * j + 10.f * h + c);
  std::vector<int64_t> ids = {5, 6, 7};
  SafetensorsWriter w;
  w.set_metadata("format", "topkv.kv_dump");
  w.set_metadata("model", "py");
  w.set_metadata("key_position0", "100");
  w.add("layer3.keys", StDType::BF16, {kvh, n, d}, keys.data());
  w.add("layer3.values", StDType::BF16, {kvh, n, d}, values.data());
  w.add("layer3.queries", StDType::F16, {nq, qh, d}, queries.data());
  w.add("token_ids", StDType::I64, {3}, ids.data());
  auto path = (dir / "py.safetensors").string();
  w.write(path);

  KvDumpReader r(path);
  CHECK(r.scale(3) == Approx(0.5));
  CHECK(r.key_position0(3) == 100);
  CHECK(r.query_position0(3) == 103);
  auto h1 = r.load_head(3, 1);  // KV head 1 serves query heads 3, 4, 5
  REQUIRE(h1.group == 3);
  for (int j = 0; j < nq; ++j)
    for (int g = 0; g < 3; ++g)
      for (int c = 0; c < d; ++c) CHECK(h1.step_queries(j)[g * d + c] == 100.f * j + 10.f * (3 + g) + c);
  std::vector<float> row(d);
  h1.keys->row_f32(2, row.data());
  CHECK(row[3] == (float)(1 * n * d + 2 * d + 3));
  h1.values->row_f32(0, row.data());
  CHECK(row[0] == -(float)(n * d));
  fs::remove_all(dir);
}

TEST_CASE("KV dump: files that break the convention are rejected with a clear Error") {
  auto dir = temp_dir();
  auto path = (dir / "bad.safetensors").string();
  std::vector<float> k(2 * 3 * 4, 1.f), q(2 * 4 * 4, 1.f), q3(2 * 3 * 4, 1.f);
  auto make = [&](const std::function<void(SafetensorsWriter&)>& edit, bool with_format = true) {
    SafetensorsWriter w;
    if (with_format) w.set_metadata("format", "topkv.kv_dump");
    edit(w);
    w.write(path);
  };
  auto kv = [&](SafetensorsWriter& w) {
    w.add("layer0.keys", StDType::F32, {2, 3, 4}, k.data());
    w.add("layer0.values", StDType::F32, {2, 3, 4}, k.data());
  };
  make([&](SafetensorsWriter& w) { kv(w); w.add("layer0.queries", StDType::F32, {2, 4, 4}, q.data()); }, false);
  expect_error([&] { KvDumpReader r(path); }, "not a topkv KV dump");
  make([&](SafetensorsWriter& w) { w.set_metadata("format_version", "2"); kv(w);
                                    w.add("layer0.queries", StDType::F32, {2, 4, 4}, q.data()); });
  expect_error([&] { KvDumpReader r(path); }, "format_version");
  make([&](SafetensorsWriter& w) { w.add("other", StDType::F32, {4}, q.data()); });
  expect_error([&] { KvDumpReader r(path); }, "no layer{L}.keys");
  make([&](SafetensorsWriter& w) { w.add("layer0.keys", StDType::F32, {2, 3, 4}, k.data());
                                    w.add("layer0.queries", StDType::F32, {2, 4, 4}, q.data()); });
  expect_error([&] { KvDumpReader r(path); }, "no tensor 'layer0.values'");
  make([&](SafetensorsWriter& w) { w.add("layer0.keys", StDType::F32, {2, 3, 4}, k.data());
                                    w.add("layer0.values", StDType::F32, {2, 4, 3}, k.data());
                                    w.add("layer0.queries", StDType::F32, {2, 4, 4}, q.data()); });
  expect_error([&] { KvDumpReader r(path); }, "values must have the keys' shape");
  make([&](SafetensorsWriter& w) { kv(w); w.add("layer0.queries", StDType::F32, {2, 3, 4}, q3.data()); });
  expect_error([&] { KvDumpReader r(path); }, "not a multiple");
  make([&](SafetensorsWriter& w) { kv(w); w.add("layer0.queries", StDType::F32, {2, 8, 2}, q.data()); });
  expect_error([&] { KvDumpReader r(path); }, "head_dim");
  make([&](SafetensorsWriter& w) { w.add("layer0.keys", StDType::I32, {2, 3, 4}, k.data());
                                    w.add("layer0.values", StDType::I32, {2, 3, 4}, k.data());
                                    w.add("layer0.queries", StDType::F32, {2, 4, 4}, q.data()); });
  expect_error([&] { KvDumpReader r(path); }, "F32, F16 or BF16");
  make([&](SafetensorsWriter& w) { w.set_metadata("scale", "-1"); kv(w);
                                    w.add("layer0.queries", StDType::F32, {2, 4, 4}, q.data()); });
  expect_error([&] { KvDumpReader r(path); }, "scale");
  make([&](SafetensorsWriter& w) { w.set_metadata("key_position0", "x"); kv(w);
                                    w.add("layer0.queries", StDType::F32, {2, 4, 4}, q.data()); });
  {
    KvDumpReader r(path);
    expect_error([&] { r.key_position0(0); }, "not a position");
    expect_error([&] { r.load_head(1, 0); }, "has no layer 1");
    expect_error([&] { r.load_head(0, 2); }, "head 2");
    CHECK(r.load_head(0, 1).keys->size() == 3);
  }
  expect_error([&] { KvDumpReader r((dir / "missing.safetensors").string()); }, "cannot open");

  KvDumpWriter empty("m");
  expect_error([&] { empty.write(path); }, "nothing to dump");
  auto a = tiny(DType::F16, 1, 50), b = tiny(DType::F16, 2, 60);
  a.data.heads.push_back(std::move(b.data.heads[0]));  // heads of different lengths
  KvDumpWriter mixed("m");
  expect_error([&] { mixed.add_layer(0, a.data); }, "same shapes");
  fs::remove_all(dir);
}
