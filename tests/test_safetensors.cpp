#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "src/common/error.h"
#include "src/common/safetensors.h"
#include "test_util.h"

using namespace topkv;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  auto p = fs::temp_directory_path() / ("topkv_test_safetensors_" + std::to_string(::getpid()));
  fs::create_directories(p);
  return p;
}

std::vector<uint8_t> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void spit(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write((const char*)bytes.data(), (std::streamsize)bytes.size());
}

// A file assembled by hand from the spec: 8-byte little-endian header length,
// the JSON header, the data bytes. What numpy/safetensors.numpy.save_file makes.
std::vector<uint8_t> assemble(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out(8 + header.size() + data.size());
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = (uint8_t)(n >> (8 * i));
  if (!header.empty()) std::memcpy(&out[8], header.data(), header.size());
  if (!data.empty()) std::memcpy(&out[8 + header.size()], data.data(), data.size());
  return out;
}

template <typename T>
void put(std::vector<uint8_t>& v, T x) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &x, sizeof(T));  // little-endian host (x86-64, aarch64)
  v.insert(v.end(), b, b + sizeof(T));
}

// Expects an Error whose message contains `needle`; for a regular file, the
// same message from its bytes in memory (the reader over memory: the fuzzers').
void expect_error(const fs::path& p, const std::string& needle) {
  std::string msg;
  try {
    SafetensorsReader r(p.string());
    FAIL("no error reading " << p << " (expected '" << needle << "')");
  } catch (const Error& e) {
    msg = e.what();
    INFO(msg);
    CHECK(msg.find(needle) != std::string::npos);
  }
  if (!fs::is_regular_file(p)) return;
  const std::vector<uint8_t> bytes = slurp(p);  // exactly sized: ASan sees any read past it
  try {
    SafetensorsReader r(bytes.data(), bytes.size(), p.string());
    FAIL("no error reading " << p << " from memory (expected '" << needle << "')");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == msg);
  }
}

}  // namespace

TEST_CASE("safetensors: write -> read round trip for every dtype, shapes, metadata, split spans") {
  auto dir = temp_dir();
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.f, 2.f);
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {1}, {7}, {3, 5, 7}, {2, 1, 129}};
  for (StDType t : {StDType::F32, StDType::F16, StDType::BF16, StDType::I32, StDType::I64, StDType::U8,
                    StDType::F64}) {
    SafetensorsWriter w;
    std::vector<std::vector<uint8_t>> blobs(shapes.size());  // the writer reads them at write()
    for (size_t s = 0; s < shapes.size(); ++s) {
      int64_t numel = 1;
      for (auto x : shapes[s]) numel *= x;
      auto& b = blobs[s];
      b.resize((size_t)numel * st_dtype_size(t));
      for (auto& x : b) x = (uint8_t)rng();
      // split the bytes in two spans where possible
      size_t cut = b.size() / 3;
      w.add(fmt::format("t{}", s), t, shapes[s], {{b.data(), cut}, {b.data() + cut, b.size() - cut}});
    }
    w.set_metadata("model", "tiny");
    w.set_metadata("note", "ünïcödé ok");
    auto path = dir / (std::string("rt_") + st_dtype_name(t) + ".safetensors");
    w.write(path.string());
    CHECK_FALSE(fs::exists(path.string() + ".tmp"));
    const auto bytes = slurp(path);
    REQUIRE(bytes.size() > 8);
    CHECK((bytes[0] | bytes[1] << 8) % 8 == 0);  // header padded to 8 bytes

    SafetensorsReader r(path.string());
    const SafetensorsReader m(bytes.data(), bytes.size(), "in memory");  // the same parser over the bytes
    CHECK(r.file_bytes() == bytes.size());
    CHECK(m.file_bytes() == bytes.size());
    CHECK(m.metadata() == r.metadata());
    REQUIRE(m.tensors().size() == r.tensors().size());
    for (size_t s = 0; s < r.tensors().size(); ++s) {
      const TensorInfo &a = m.tensors()[s], &b = r.tensors()[s];
      CHECK(a.name == b.name);
      CHECK(a.dtype == b.dtype);
      CHECK(a.shape == b.shape);
      CHECK(a.begin == b.begin);
      CHECK(a.end == b.end);
      CHECK(m.data(a) >= bytes.data());  // in place, not copied
      CHECK(m.data(a) + a.nbytes() <= bytes.data() + bytes.size());
      CHECK(std::memcmp(m.data(a), r.data(b), a.nbytes()) == 0);
      if (a.nbytes() < 2) continue;
      // Copy-on-write from memory is a private copy, with the room asked for zeroed.
      auto v = m.map_copy_on_write(a, 1, a.nbytes() + 16);
      CHECK(std::memcmp(v.data, m.data(a) + 1, a.nbytes() - 1) == 0);
      CHECK(std::all_of(v.data + a.nbytes() - 1, v.data + a.nbytes() + 15, [](uint8_t x) { return x == 0; }));
      v.data[0] ^= 0xff;
      CHECK(m.data(a)[1] != v.data[0]);  // the bytes read from are untouched
    }
    CHECK(r.metadata().at("model") == "tiny");
    CHECK(r.metadata_or("note", "") == "ünïcödé ok");
    CHECK(r.metadata_or("absent", "dflt") == "dflt");
    REQUIRE(r.tensors().size() == shapes.size());
    for (size_t s = 0; s < shapes.size(); ++s) {
      const auto& ti = r.get(fmt::format("t{}", s));
      CHECK(ti.dtype == t);
      CHECK(ti.shape == shapes[s]);
      REQUIRE(ti.nbytes() == blobs[s].size());
      CHECK((blobs[s].empty() || std::memcmp(r.data(ti), blobs[s].data(), blobs[s].size()) == 0));
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("safetensors: float tensors convert to fp32, bad element ranges and types are errors") {
  auto dir = temp_dir();
  std::vector<float> x(37);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (auto& v : x) v = nd(rng);
  std::vector<uint16_t> h(x.size()), b(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = f32_to_f16(x[i]), b[i] = f32_to_bf16(x[i]);
  std::vector<int32_t> ids = {1, -2, 3};
  SafetensorsWriter w;
  w.add("f32", StDType::F32, {37}, x.data());
  w.add("f16", StDType::F16, {37}, h.data());
  w.add("bf16", StDType::BF16, {37}, b.data());
  w.add("ids", StDType::I32, {3}, ids.data());
  auto path = dir / "conv.safetensors";
  w.write(path.string());
  SafetensorsReader r(path.string());
  std::vector<float> out(10);
  r.read_f32(r.get("f32"), 5, 10, out.data());
  for (int i = 0; i < 10; ++i) CHECK(out[i] == x[5 + i]);
  r.read_f32(r.get("f16"), 27, 10, out.data());
  for (int i = 0; i < 10; ++i) CHECK(out[i] == f16_to_f32(h[27 + i]));
  r.read_f32(r.get("bf16"), 0, 10, out.data());
  for (int i = 0; i < 10; ++i) CHECK(out[i] == bf16_to_f32(b[i]));
  CHECK_THROWS_AS(r.read_f32(r.get("f32"), 30, 10, out.data()), Error);  // past the end
  CHECK_THROWS_AS(r.read_f32(r.get("ids"), 0, 1, out.data()), Error);   // not a float tensor
  CHECK(std::memcmp(r.data(r.get("ids")), ids.data(), 12) == 0);
  try {
    r.get("nope");
    FAIL("missing tensor not reported");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("bf16") != std::string::npos);  // lists what the file has
  }
  CHECK(r.find("nope") == nullptr);
  fs::remove_all(dir);
}

TEST_CASE("safetensors: a file assembled by hand per the spec (as numpy's save_file writes it) parses") {
  auto dir = temp_dir();
  std::vector<uint8_t> data;
  for (float v : {1.f, 2.f, 3.f, 4.f, 5.f, -6.5f}) put(data, v);  // a: F32 [2, 3] at [0, 24)
  put<int64_t>(data, -1);                                          // b: I64 [2] at [24, 40)
  put<int64_t>(data, int64_t(1) << 40);
  put<uint16_t>(data, 0x3c00);                                     // c: F16 scalar at [40, 42)
  // JSON order differs from buffer order; metadata last; header padded with spaces.
  std::string header =
      R"({"b":{"dtype":"I64","shape":[2],"data_offsets":[24,40]},)"
      R"("c":{"dtype":"F16","shape":[],"data_offsets":[40,42]},)"
      R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"__metadata__":{"format":"np"}})";
  for (bool pad : {false, true}) {
    std::string hd = header;
    if (pad) hd.append((8 - hd.size() % 8) % 8 + 8, ' ');
    auto path = dir / "numpy.safetensors";
    spit(path, assemble(hd, data));
    SafetensorsReader r(path.string());
    CHECK(r.metadata().at("format") == "np");
    REQUIRE(r.tensors().size() == 3);
    CHECK(r.tensors()[0].name == "a");  // buffer order
    const auto& a = r.get("a");
    CHECK(a.shape == std::vector<int64_t>{2, 3});
    std::vector<float> av(6);
    r.read_f32(a, 0, 6, av.data());
    CHECK(av == std::vector<float>{1, 2, 3, 4, 5, -6.5f});
    int64_t bv[2];
    std::memcpy(bv, r.data(r.get("b")), 16);
    CHECK(bv[0] == -1);
    CHECK(bv[1] == int64_t(1) << 40);
    CHECK(r.get("c").numel() == 1);
    float c;
    r.read_f32(r.get("c"), 0, 1, &c);
    CHECK(c == 1.0f);
  }
  fs::remove_all(dir);
}

TEST_CASE("safetensors: truncated and corrupt files are rejected with a clear Error") {
  auto dir = temp_dir();
  auto p = dir / "bad.safetensors";
  std::vector<uint8_t> d8(8, 1), d16(16, 2);
  auto one = [](const std::string& extra = "") {
    return std::string(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})") + extra + "}";
  };

  spit(p, {1, 2, 3});
  expect_error(p, "too short");
  auto good = assemble(one(), d8);
  good.pop_back();
  spit(p, good);
  expect_error(p, "outside");  // last tensor runs past the end: truncated
  auto huge = assemble(one(), d8);
  huge[5] = 0x7f;
  spit(p, huge);
  expect_error(p, "100 MB");
  auto over = assemble(one(), d8);
  over[0] = 0xff;
  spit(p, over);
  expect_error(p, "truncated");
  spit(p, assemble("[1,2]", {}));
  expect_error(p, "not a JSON object");
  spit(p, assemble(R"({"x":{"dtype":"F32",)", d8));
  expect_error(p, "not valid JSON");
  spit(p, assemble(R"({"x":{"dtype":"F8_E5M2","shape":[2],"data_offsets":[0,2]}})", std::vector<uint8_t>(2)));
  expect_error(p, "unsupported safetensors dtype");
  spit(p, assemble(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8));
  expect_error(p, "bad dimension");
  spit(p, assemble(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8));
  expect_error(p, "needs 12 bytes");
  spit(p, assemble(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", d8));
  expect_error(p, "data_offsets");
  spit(p, assemble(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d8));
  expect_error(p, "outside");
  spit(p, assemble(R"({"x":{"dtype":"F32","shape":[2]}})", d8));
  expect_error(p, "data_offsets");
  spit(p, assemble(R"({"x":{"shape":[2],"data_offsets":[0,8]}})", d8));
  expect_error(p, "missing dtype");
  spit(p, assemble(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", d16));
  expect_error(p, "overlap or hole");
  spit(p, assemble(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", d16));
  expect_error(p, "overlap or hole");
  spit(p, assemble(one(), d16));
  expect_error(p, "trailing");
  spit(p, assemble(one(R"(,"__metadata__":{"k":3})"), d8));
  expect_error(p, "not a string");
  spit(p, assemble(R"({"x":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", d8));
  expect_error(p, "overflows");
  expect_error(dir / "missing.safetensors", "cannot open");
  expect_error(dir, "not a regular file");
  fs::remove_all(dir);
}

TEST_CASE("safetensors writer: bad tensors are refused and a failed write leaves nothing behind") {
  std::vector<float> x(6, 1.f);
  SafetensorsWriter w;
  CHECK_THROWS_AS(w.add("a", StDType::F32, {2, 4}, {{x.data(), 24}}), Error);  // 8 elements, 6 given
  CHECK_THROWS_AS(w.add("__metadata__", StDType::F32, {6}, x.data()), Error);
  CHECK_THROWS_AS(w.add("a", StDType::F32, {-6}, {{x.data(), 0}}), Error);
  w.add("a", StDType::F32, {6}, x.data());
  CHECK_THROWS_AS(w.add("a", StDType::F32, {6}, x.data()), Error);  // twice
  // A folder that cannot be made (under a regular file): an Error, nothing written.
  test::TempDir td("topkv_st_writer");
  std::ofstream(td.file("plain")) << "a file";
  const auto bad_dir = fs::path(td.file("plain")) / "f.safetensors";
  CHECK_THROWS_WITH(w.write(bad_dir.string()), Catch::Contains("cannot be written"));
  // A failed write leaves no temporary beside the target.
  w.add("b", StDType::F32, {2}, x.data());
  const std::string ok = td.file("ok.safetensors");
  w.write(ok);
  size_t entries = 0;
  for (auto& e : fs::directory_iterator(td.dir)) entries += e.path().filename().string()[0] == '.';
  CHECK(entries == 0);
  CHECK(parse_st_dtype("BF16") == StDType::BF16);
  CHECK_THROWS_AS(parse_st_dtype("bf16"), Error);  // the spec's names are upper case
  CHECK(row_dtype_of(StDType::F16) == DType::F16);
  CHECK_THROWS_AS(row_dtype_of(StDType::I64), Error);
}
