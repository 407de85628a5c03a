// CUDA builds only: the file is empty without CUDA.
#ifdef TOPKV_HAVE_CUDA
#include "gpu/device_search_tables.h"

#include <omp.h>

#include <algorithm>

#include "src/common/error.h"
#include "src/common/parallel_errors.h"

namespace topkv {

static_assert(RowStore::kChunkShift == cuda::kStoreChunkShift, "the device search addresses store rows by chunk");

bool DeviceSearchTables::backend_supported(const std::string& index_spec) {
  return KvIndex::create(index_spec)->summary_kind().has_value();  // an empty index: its parameters only
}

bool DeviceSearchTables::stale(const OffloadedLayer& L) const {
  if (covered_.size() != (size_t)L.config().kv_heads) return true;
  for (int h = 0; h < L.config().kv_heads; ++h) {
    const KvIndex* index = L.index(h);
    const int64_t now = index && index->attached() ? index->indexed_rows() : 0;
    if (now != covered_[(size_t)h]) return true;
  }
  return false;
}

int DeviceSearchTables::row_cap(int64_t k, int group) const {
  const int64_t per_head = k + std::max<int64_t>(max_count_, 1);
  return (int)std::max<int64_t>(1, std::min<int64_t>(max_covered_, per_head * group));
}

DeviceSearchTables::Staged DeviceSearchTables::stage(const OffloadedLayer& L, const DeviceTableChoice& tables) {
  const int nkv = L.config().kv_heads, d = L.config().head_dim;
  const DType table_type = tables.type;
  Staged s;
  s.heads.resize((size_t)nkv);
  s.table_type = table_type;
  auto typed = [&](const std::vector<float>& v, const char* what) {
    return encode_table(table_type, v, d, {TableRounding::Nearest}, what);
  };
  // What every head's tables say alike (one index spec), from the first present head.
  struct Shared {
    bool page_bounds = false, far_dropped = false;
    double spread = 0.0, spread_clip = 1.0, expand = 0.0;
  };
  std::vector<Shared> shared((size_t)nkv);
  // Heads in parallel: each exports, encodes and reduces its own tables (at the
  // 8B geometry's 131K, one thread for the layer's 8 heads took most of the
  // seconds between the prefill's last chunk and the first token).
  ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) num_threads(std::max(1, std::min(nkv, omp_get_max_threads())))
  for (int h = 0; h < nkv; ++h) errors.run([&, h] {
    const KvIndex* index = L.index(h);
    if (!index || !index->attached()) return;
    SummaryTables t;
    TOPKV_CHECK(index->export_summaries(t), "the {} index has no device search: run with --search-on host",
                index->name());
    if (tables.page_factor > 1) t = t.coarsened(tables.page_factor);  // the budget's longer pages
    TOPKV_CHECK(t.dim == d && (t.value_means.empty() || t.value_means.size() == (size_t)t.size() * d) &&
                    (t.key_var.empty() || (t.key_var.size() == (size_t)t.size() * d && !t.value_means.empty())),
                "internal: {} summary tables of dimension {} for head_dim {}", index->name(), t.dim, d);
    TOPKV_CHECK(t.size() <= INT32_MAX && t.covered <= INT32_MAX, "the device search holds at most 2^31 groups "
                "and rows per head ({} groups over {} rows)", t.size(), t.covered);
    Shared& sd = shared[(size_t)h];
    sd.page_bounds = t.kind == SummaryTables::Kind::PageBounds;
    Staged::Head& sh = s.heads[(size_t)h];
    sh.present = true;
    sh.n = (int32_t)t.size(), sh.page = (int32_t)t.page, sh.max_count = t.max_count(), sh.covered = t.covered;
    sh.rows = t.encoded_rows(table_type);  // page bounds rounded outward
    sh.value_means = typed(t.value_means, "a value mean");
    sh.key_var = typed(t.key_var, "a key variance");
    if (!t.key_var.empty()) sd.spread = t.spread, sd.spread_clip = t.spread_clip;
    sd.far_dropped = t.far_dropped && !t.value_means.empty();
    if (t.coarse_ratio > 0) {  // two levels: the coarse bounds, reduced here
      const SummaryTables c = t.coarse_level();
      sd.expand = t.expand;
      sh.coarse_n = (int32_t)c.size(), sh.coarse_ratio = (int32_t)t.coarse_ratio;
      sh.coarse_rows = c.encoded_rows(table_type);
      sh.coarse_counts = c.counts;
    }
    sh.counts = std::move(t.counts), sh.offsets = std::move(t.offsets), sh.members = std::move(t.members);
  });
  errors.rethrow();
  for (int h = 0; h < nkv; ++h)
    if (s.heads[(size_t)h].present) {
      const Shared& sd = shared[(size_t)h];
      s.page_bounds = sd.page_bounds, s.far_dropped = sd.far_dropped;
      s.spread = sd.spread, s.spread_clip = sd.spread_clip, s.expand = sd.expand;
      break;
    }
  return s;
}

void DeviceSearchTables::upload(cuda::CudaBackend& be, const OffloadedLayer& L, const Staged& s,
                                DeviceStoreCache* cache) {
  be.synchronize();
  owned_.clear();
  const int nkv = L.config().kv_heads;
  TOPKV_CHECK(s.heads.size() == (size_t)nkv, "internal: tables staged for {} heads, the layer has {}",
              s.heads.size(), nkv);
  host_heads_.assign((size_t)nkv, cuda::SummaryHead{});
  present_.assign((size_t)nkv, 0);
  covered_.assign((size_t)nkv, 0);
  max_n_ = 0, max_count_ = 0, max_covered_ = 0, bytes_ = 0, chunk_table_bytes_ = 0;
  page_bounds_ = s.page_bounds;
  far_field_ = false;
  spread_ = s.spread, spread_clip_ = s.spread_clip;
  far_dropped_ = s.far_dropped;
  expand_ = s.expand;
  auto put = [&](const void* src, size_t bytes) -> const void* {
    if (bytes == 0) return nullptr;
    Buffer b = be.alloc(bytes);
    be.from_host(src, b, 0, bytes);
    owned_.push_back(b);
    bytes_ += bytes;
    return b.mem.get();
  };
  auto put_codes = [&](const TableCodes& c, const float*& scale) {
    scale = static_cast<const float*>(put(c.scale.data(), c.scale.size() * 4));  // i8 only
    return put(c.codes.data(), c.codes.size());
  };
  for (int h = 0; h < nkv; ++h) {
    const Staged::Head& t = s.heads[(size_t)h];
    if (!t.present) continue;
    cuda::SummaryHead& sh = host_heads_[(size_t)h];
    present_[(size_t)h] = 1;
    sh.n = t.n, sh.page = t.page;
    sh.rows = put_codes(t.rows, sh.rows_scale);
    sh.counts = static_cast<const int32_t*>(put(t.counts.data(), t.counts.size() * 4));
    sh.offsets = static_cast<const int32_t*>(put(t.offsets.data(), t.offsets.size() * 4));
    sh.members = static_cast<const int32_t*>(put(t.members.data(), t.members.size() * 4));
    sh.value_means = put_codes(t.value_means, sh.value_means_scale);
    sh.key_var = put_codes(t.key_var, sh.key_var_scale);
    sh.coarse_rows = put_codes(t.coarse_rows, sh.coarse_rows_scale);
    sh.coarse_counts = static_cast<const int32_t*>(put(t.coarse_counts.data(), t.coarse_counts.size() * 4));
    sh.coarse_n = t.coarse_n, sh.coarse_ratio = t.coarse_ratio;
    TOPKV_CHECK(s.expand == 0.0 || t.n == 0 || sh.coarse_rows,
                "internal: two levels without the coarse table of KV head {}", h);
    TOPKV_CHECK(s.spread == 0.0 || t.n == 0 || sh.key_var,
                "internal: a far spread term of {} without the variance table of KV head {}", s.spread, h);
    far_field_ |= !t.value_means.codes.empty();
    covered_[(size_t)h] = t.covered;
    max_n_ = std::max(max_n_, sh.n);
    max_count_ = std::max(max_count_, t.max_count);
    max_covered_ = std::max(max_covered_, t.covered);
  }
  put_chunk_tables(be, L, cache);
}

void DeviceSearchTables::refresh_chunks(cuda::CudaBackend& be, const OffloadedLayer& L, DeviceStoreCache& cache) {
  be.synchronize();  // the old chunk tables, and copies a cache may regrow, may still be read
  put_chunk_tables(be, L, &cache);
}

void DeviceSearchTables::put_chunk_tables(cuda::CudaBackend& be, const OffloadedLayer& L, DeviceStoreCache* cache) {
  // Chunk tables of the stores as they are now: they cover every row the
  // tables name (stores only grow, their chunks never move).
  std::vector<Buffer> tables;
  size_t table_bytes = 0;
  auto put_table = [&](const RowStore& st, int64_t covered) {
    std::vector<const uint8_t*> p;
    if (cache) {
      p = cache->chunk_table(st, covered);
    } else {
      p.resize(st.n_chunks());
      for (size_t c = 0; c < p.size(); ++c) p[c] = st.chunk(c);
    }
    if (p.empty()) return static_cast<const uint8_t* const*>(nullptr);
    Buffer b = be.alloc(p.size() * sizeof(void*));
    be.from_host(p.data(), b, 0, p.size() * sizeof(void*));
    tables.push_back(b);
    table_bytes += b.bytes;
    return static_cast<const uint8_t* const*>(b.mem.get());
  };
  for (size_t h = 0; h < host_heads_.size(); ++h) {
    cuda::SummaryHead& sh = host_heads_[h];
    if (!present_[h]) continue;  // no index: a streaming head
    sh.k_chunks = put_table(*L.key_store((int)h), covered_[h]);
    sh.v_chunks = put_table(*L.value_store((int)h), covered_[h]);
  }
  chunk_tables_ = std::move(tables);
  bytes_ += table_bytes - chunk_table_bytes_;
  chunk_table_bytes_ = table_bytes;
  heads_ = be.alloc(host_heads_.size() * sizeof(cuda::SummaryHead));
  be.from_host(host_heads_.data(), heads_, 0, host_heads_.size() * sizeof(cuda::SummaryHead));
}

}  // namespace topkv
#endif  // TOPKV_HAVE_CUDA
