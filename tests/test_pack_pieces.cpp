// The pieces a context pack is made of, each against its reference: the
// checksum of scattered parts equals that of one buffer whatever the thread
// count, and changes with any byte; binary blobs in memory equal the files
// save() writes; every index backend round-trips through bytes; index arrays
// saved apart are used in place, copy-on-write; a row store
// over mapped rows equals a copied one (and really is in place); a model
// whose cache is written back position by position decodes exactly as the
// one that prefilled.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "index/kv_index.h"
#include "offload/pack_file.h"
#include "src/common/binary_io.h"
#include "src/common/checksum.h"
#include "src/common/options.h"
#include "src/common/error.h"
#include "src/model/model.h"
#include "src/model/synth.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"

using namespace topkv;

namespace {

using test::model_options;

std::vector<float> random_rows(int64_t n, int d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v((size_t)(n * d));
  for (size_t i = 0; i < v.size(); ++i) v[i] = nd(rng) + 0.3f * (float)(i % (size_t)d % 3);
  return v;
}

// Both indexes answer the queries `q` alike: the same ids and exact scores,
// the same far clusters and far scores.
void check_same_search(const KvIndex& a, const KvIndex& b, const std::vector<float>& q, int64_t k) {
  SearchParams p;
  p.k = k;
  const int nq = (int)(q.size() / (size_t)a.dim());
  const SearchResult r1 = a.search(q.data(), nq, p), r2 = b.search(q.data(), nq, p);
  CHECK(r1.ids == r2.ids);
  CHECK(r1.scores == r2.scores);
  CHECK(r1.far_clusters == r2.far_clusters);
  CHECK(r1.far_scores == r2.far_scores);
}

std::shared_ptr<RowStore> store_of(const std::vector<float>& rows, int d, DType t) {
  auto s = std::make_shared<RowStore>(d, t);
  s->append_f32(rows.data(), (int64_t)rows.size() / d);
  return s;
}

}  // namespace

TEST_CASE("checksum64: parts hash as their concatenation, at any thread count, and every byte counts") {
  std::mt19937_64 rng(3);
  const size_t MiB = size_t(1) << 20;
  std::vector<uint8_t> buf(3 * MiB + MiB / 2 + 13);
  for (auto& b : buf) b = (uint8_t)rng();
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(31), size_t(33), MiB - 1, MiB, MiB + 1, buf.size()}) {
    INFO("n " << n);
    const uint64_t whole = checksum64(buf.data(), n);
    // Split at awkward places: empty parts, parts crossing block boundaries, one-byte parts.
    std::vector<ByteSpan> parts;
    size_t at = 0;
    for (size_t len : {size_t(0), size_t(5), MiB - 3, size_t(0), size_t(1), MiB + 7, size_t(2)}) {
      len = std::min(len, n - at);
      parts.push_back({buf.data() + at, len});
      at += len;
    }
    parts.push_back({buf.data() + at, n - at});
    CHECK(checksum64(parts) == whole);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    CHECK(checksum64(buf.data(), n) == whole);
    omp_set_num_threads(threads);
    if (n == 0) continue;
    CHECK(checksum64(buf.data(), n - 1) != whole);  // truncated
    for (size_t pos : {size_t(0), n / 2, n - 1}) {
      buf[pos] ^= 0x04;
      CHECK(checksum64(buf.data(), n) != whole);
      buf[pos] ^= 0x04;
    }
  }
  // Swapping two blocks changes it (block order counts).
  std::vector<uint8_t> swapped(buf.begin(), buf.begin() + 2 * MiB);
  std::swap_ranges(swapped.begin(), swapped.begin() + MiB, swapped.begin() + MiB);
  CHECK(checksum64(swapped.data(), swapped.size()) != checksum64(buf.data(), 2 * MiB));
}

TEST_CASE("canonical_spec: one spelling per index spec") {
  CHECK(canonical_spec("multipole:ratio=8,iters=5") == canonical_spec("multipole:iters=5,ratio=8"));
  CHECK(canonical_spec("flat") == "flat");
  CHECK(canonical_spec("quest:page=7") != canonical_spec("quest:page=8"));
}

TEST_CASE("binary blobs in memory are the bytes of the file, and are checked the same way") {
  test::TempDir tmp("topkv_pack_bin");
  const std::string path = tmp.file("x.bin");
  std::vector<uint8_t> mem;
  for (int mode = 0; mode < 2; ++mode) {
    auto w = mode ? std::make_unique<BinaryWriter>(mem, "TESTBLOB", 3) : std::make_unique<BinaryWriter>(path, "TESTBLOB", 3);
    w->str("hello");
    w->vec(std::vector<int32_t>{7, -1, 42});
    w->pod<double>(2.5);
    w->commit();
  }
  const std::string file = test::slurp(path);
  REQUIRE(mem.size() == file.size());
  CHECK(std::memcmp(mem.data(), file.data(), mem.size()) == 0);
  BinaryReader r("blob", mem.data(), mem.size(), "TESTBLOB", 3);
  CHECK(r.version() == 3);
  CHECK(r.str() == "hello");
  CHECK(r.vec<int32_t>() == std::vector<int32_t>{7, -1, 42});
  CHECK(r.pod<double>() == 2.5);
  r.expect_end();
  CHECK_THROWS_WITH(BinaryReader("blob", mem.data(), mem.size() - 3, "TESTBLOB", 3), Catch::Contains("checksum"));
  CHECK_THROWS_WITH(BinaryReader("blob", mem.data(), 10, "TESTBLOB", 3), Catch::Contains("too short"));
  CHECK_THROWS_WITH(BinaryReader("blob", mem.data(), mem.size(), "TESTBLOB", 2), Catch::Contains("version 3"));
  CHECK_THROWS_WITH(BinaryReader("blob", mem.data(), mem.size(), "OTHERMAG", 3), Catch::Contains("bad magic"));
  std::vector<uint8_t> bad = mem;
  bad[14] ^= 0x10;
  CHECK_THROWS_WITH(BinaryReader("blob", bad.data(), bad.size(), "TESTBLOB", 3), Catch::Contains("corrupted"));
}

TEST_CASE("every index backend round-trips through bytes: the file's bytes, the same answers") {
  test::TempDir tmp("topkv_pack_idx");
  const int d = 64;
  const int64_t n = 777;
  const auto keys = store_of(random_rows(n, d, 1), d, DType::F16), values = store_of(random_rows(n, d, 2), d, DType::F16);
  const std::vector<float> q = random_rows(3, d, 3);
  BuildOptions bo;
  bo.n_threads = 1;
  for (const BackendInfo& b : index_backends()) {
    INFO(b.name);
    auto idx = KvIndex::create(b.name, bo);
    idx->build(keys, values);
    const std::vector<uint8_t> bytes = idx->save_bytes();
    idx->save(tmp.file("i.idx"));
    const std::string file = test::slurp(tmp.file("i.idx"));
    REQUIRE(bytes.size() == file.size());
    CHECK(std::memcmp(bytes.data(), file.data(), bytes.size()) == 0);
    auto back = KvIndex::load_bytes("blob", bytes.data(), bytes.size(), keys, values, bo);
    CHECK(back->name() == b.name);
    CHECK(back->indexed_rows() == n);
    check_same_search(*idx, *back, q, 40);
    // Other keys: the sampled fingerprint refuses them.
    const auto other = store_of(random_rows(n, d, 9), d, DType::F16);
    CHECK_THROWS_WITH(KvIndex::load_bytes("blob", bytes.data(), bytes.size(), other, values, bo),
                      Catch::Contains("fingerprint"));
  }
}

TEST_CASE("index arrays saved apart into a pack are used in place, copy-on-write, and answer the same") {
  test::TempDir tmp("topkv_pack_arrays");
  const int d = 64;
  const int64_t n = 901, more = 75;
  const std::vector<float> rows_k = random_rows(n + more, d, 4), rows_v = random_rows(n + more, d, 5);
  const std::vector<float> q = random_rows(4, d, 6);
  BuildOptions bo;
  bo.n_threads = 1;
  for (const char* spec : {"quest:page=13", "centroid", "centroid:levels=2,coarse_ratio=4", "multipole",
                           "multipole:levels=2,block=300"}) {
    INFO(spec);
    // Each index over its own stores: both grow by the same rows below.
    std::vector<float> first_k(rows_k.begin(), rows_k.begin() + n * d), first_v(rows_v.begin(), rows_v.begin() + n * d);
    const auto ka = store_of(first_k, d, DType::F16), va = store_of(first_v, d, DType::F16);
    const auto kb = store_of(first_k, d, DType::F16), vb = store_of(first_v, d, DType::F16);
    auto built = KvIndex::create(spec, bo);
    built->build(ka, va);
    const std::string path = tmp.file("arrays.pack");
    std::vector<uint8_t> blob;
    {
      PackWriter w;
      PackArrayWriter arrays(w, "ix.");
      blob = built->save_bytes(&arrays);
      w.add_owned("ix", StDType::U8, {(int64_t)blob.size()}, blob);
      w.write(path);
    }
    CHECK(blob.size() < 400);  // the header only: every array is a tensor
    CHECK_THROWS_WITH(KvIndex::load_bytes("blob", blob.data(), blob.size(), kb, vb, bo),
                      Catch::Contains("load it from that pack"));
    PackReader r(path);
    auto [data, bytes] = r.blob("ix");
    PackArrayReader arrays(r, "ix.");
    auto loaded = KvIndex::load_bytes("ix", data, bytes, kb, vb, bo, &arrays);
    const MemoryReport mb = built->memory(), ml = loaded->memory();
    CHECK(ml.mapped_bytes > 0);
    CHECK(ml.structure_bytes + ml.mapped_bytes >= mb.structure_bytes / 2);
    CHECK(ml.structure_bytes < mb.structure_bytes);
    check_same_search(*built, *loaded, q, 50);
    // Folds write counts, centroids, means and bounds in place: private pages.
    for (int64_t at = n; at < n + more; at += 25) {
      ka->append_f32(rows_k.data() + at * d, 25), va->append_f32(rows_v.data() + at * d, 25);
      kb->append_f32(rows_k.data() + at * d, 25), vb->append_f32(rows_v.data() + at * d, 25);
      CHECK(built->add_new_rows() == 25);
      CHECK(loaded->add_new_rows() == 25);
      check_same_search(*built, *loaded, q, 50);
    }
    CHECK_NOTHROW(r.verify_all(false));  // the file never changed
    // A second load sees the pack as written, not the first one's folds.
    PackArrayReader again_arrays(r, "ix.");
    const auto k0 = store_of(first_k, d, DType::F16), v0 = store_of(first_v, d, DType::F16);
    auto again = KvIndex::load_bytes("ix", data, bytes, k0, v0, bo, &again_arrays);
    auto rebuilt = KvIndex::create(spec, bo);
    rebuilt->build(k0, v0);
    check_same_search(*rebuilt, *again, q, 50);
  }
}

TEST_CASE("a row store over mapped rows uses whole chunks in place and equals a copied store") {
  const int d = 8;
  const int64_t C = RowStore::kChunkRows;
  for (DType t : {DType::F16, DType::BF16, DType::F32}) {
    for (int64_t n : {int64_t(1), int64_t(123), C, 2 * C + 77}) {
      INFO(dtype_name(t) << " n " << n);
      const std::vector<float> rows = random_rows(n + 50, d, (uint64_t)n);
      const auto ref = store_of(rows, d, t);  // the rows as a store would hold them
      auto mem = std::make_shared<std::vector<uint8_t>>((size_t)n * ref->row_bytes());
      for (int64_t i = 0; i < n; ++i) std::memcpy(mem->data() + (size_t)i * ref->row_bytes(), ref->row(i), ref->row_bytes());
      RowStore s(d, t);
      s.append_mapped(mem->data(), n, mem);
      CHECK(s.size() == n);
      CHECK(s.mapped_bytes() == (size_t)(n / C) * C * ref->row_bytes());
      if (n >= C) CHECK(s.chunk(0) == mem->data());       // in place
      if (n % C) CHECK(s.chunk(s.n_chunks() - 1) != mem->data() + (n / C) * C * ref->row_bytes());  // tail copied
      s.append_f32(rows.data() + (size_t)n * d, 50);      // appends go on after the mapped rows
      REQUIRE(s.size() == n + 50);
      for (int64_t i : {int64_t(0), n / 2, n - 1, n, n + 49})
        CHECK(std::memcmp(s.row(i), ref->row(i), ref->row_bytes()) == 0);
      CHECK(s.fingerprint(s.size()) == ref->fingerprint(ref->size()));
    }
  }
  // Not on a chunk boundary, or with an allocator (pinned memory): everything is copied.
  const std::vector<float> rows = random_rows(C + 3, d, 5);
  const auto ref = store_of(rows, d, DType::F16);
  auto mem = std::make_shared<std::vector<uint8_t>>((size_t)(C + 3) * ref->row_bytes());
  ref->for_each_span(0, C + 3, [&](int64_t first, int64_t cnt, const void* p) {
    std::memcpy(mem->data() + (size_t)first * ref->row_bytes(), p, (size_t)cnt * ref->row_bytes());
  });
  RowStore offset(d, DType::F16);
  offset.append_f32(rows.data(), 1);
  offset.append_mapped(mem->data() + ref->row_bytes(), C + 2, mem);
  RowStore allocated(d, DType::F16, [](size_t b) { return std::shared_ptr<uint8_t>(new uint8_t[b], std::default_delete<uint8_t[]>()); });
  allocated.append_mapped(mem->data(), C + 3, mem);
  for (const RowStore* s : {&offset, &allocated}) {
    CHECK(s->mapped_bytes() == 0);
    CHECK(s->chunk(0) != mem->data());
    for (int64_t i : {int64_t(0), int64_t(1), C - 1, C, C + 2}) CHECK(std::memcmp(s->row(i), ref->row(i), ref->row_bytes()) == 0);
  }
}

TEST_CASE("a model whose cache is read from a position and written back decodes exactly like the one that prefilled") {
  test::TempDir tmp("topkv_pack_model");
  for (const char* preset : {"tiny-gemma3", "tiny-llama"}) {
    for (DType kv : {DType::F32, DType::F16}) {
      INFO(preset << " kv " << dtype_name(kv));
      const std::string path = tmp.file(std::string(preset) + ".gguf");
      synth_write(synth_preset(preset), path);
      std::shared_ptr<const GgufFile> file = GgufFile::open(path);
      const ModelConfig cfg = read_model_config(*file);
      auto be = make_cpu_backend();
      // The prompt is longer than a sliding window plus a chunk, so the ring
      // wraps: the window's positions sit in two runs of slots, the second longer.
      const int64_t P = 72;
      std::vector<int32_t> prompt((size_t)P);
      for (int64_t i = 0; i < P; ++i) prompt[(size_t)i] = (int32_t)((i * 131 + 7) % cfg.n_vocab);
      const ModelOptions a_opt = model_options(P + 20, 16, kv);
      const ModelOptions b_opt = model_options(P + 33, 5, kv);  // other ring sizes
      Model a(file, *be, a_opt), b(file, *be, b_opt);
      std::vector<float> la = a.prefill(prompt, 16), k, v;
      for (int il = 0; il < cfg.n_layer; ++il) {
        const int64_t window = cfg.layers[(size_t)il].window, from = window > 0 ? P - window : 0;
        a.read_kv(il, k, v, from);
        REQUIRE(k.size() == (size_t)(cfg.n_head_kv * (P - from) * cfg.head_dim));
        b.write_kv(il, k.data(), v.data(), from, P - from);
        if (window > 0) CHECK_THROWS_WITH(a.read_kv(il, k, v, 0), Catch::Contains("keeps only its last"));
      }
      b.set_n_past(P);
      CHECK(b.n_past() == P);
      for (int s = 0; s < 12; ++s) {
        const int32_t tok = (int32_t)(std::max_element(la.begin(), la.end()) - la.begin());
        la = a.decode(tok);
        CHECK(b.decode(tok) == la);
      }
    }
  }
  std::shared_ptr<const GgufFile> file = GgufFile::open(tmp.file("tiny-llama.gguf"));
  auto be = make_cpu_backend();
  Model m(file, *be, model_options(10, 4));
  std::vector<float> k(64 * 1024, 0.5f);
  CHECK_THROWS_WITH(m.read_kv(0, k, k, 1), Catch::Contains("cannot read positions from 1"));
}
