#include "offload/offloaded_layer.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "offload/pack_file.h"
#include "src/common/error.h"
#include "src/common/omp_scope.h"
#include "src/common/parallel_errors.h"
#include "src/common/timer.h"

namespace topkv {

OffloadedLayer::OffloadedLayer(Config cfg) : cfg_(std::move(cfg)) {
  TOPKV_CHECK(cfg_.kv_heads >= 1 && cfg_.n_heads % cfg_.kv_heads == 0,
              "{} query heads cannot be grouped over {} KV heads", cfg_.n_heads, cfg_.kv_heads);
  TOPKV_CHECK(cfg_.window >= 1 && cfg_.sinks >= 0, "window must be >= 1 and sinks >= 0");
  TOPKV_CHECK(cfg_.streaming.empty() || (int)cfg_.streaming.size() == cfg_.kv_heads,
              "internal: streaming mask has {} entries for {} KV heads", cfg_.streaming.size(), cfg_.kv_heads);
  const size_t d = (size_t)cfg_.head_dim;
  heads_.resize((size_t)cfg_.kv_heads);
  for (int h = 0; h < cfg_.kv_heads; ++h) {
    Head& hd = heads_[(size_t)h];
    hd.streaming = !cfg_.streaming.empty() && cfg_.streaming[(size_t)h];
    hd.sink_k.reserve((size_t)cfg_.sinks * d);
    hd.sink_v.reserve((size_t)cfg_.sinks * d);
    hd.win_k.assign((size_t)cfg_.window * d, 0.f);
    hd.win_v.assign((size_t)cfg_.window * d, 0.f);
    if (!hd.streaming) {
      hd.keys = std::make_shared<RowStore>(cfg_.head_dim, cfg_.store_dtype, cfg_.store_alloc);
      hd.values = std::make_shared<RowStore>(cfg_.head_dim, cfg_.store_dtype, cfg_.store_alloc);
      hd.index = KvIndex::create(cfg_.index, cfg_.build);
      for (const std::string& spec : cfg_.extra_indexes) hd.extra_indexes.push_back(KvIndex::create(spec, cfg_.build));
    }
  }
}

int64_t OffloadedLayer::stored_rows(int h) const {
  const Head& hd = heads_[(size_t)h];
  return hd.keys ? hd.keys->size() : 0;
}

void OffloadedLayer::push_window(Head& h, int64_t pos, const float* k, const float* v) {
  const size_t d = (size_t)cfg_.head_dim, slot = (size_t)(pos % cfg_.window);
  std::copy(k, k + d, h.win_k.begin() + (ptrdiff_t)(slot * d));
  std::copy(v, v + d, h.win_v.begin() + (ptrdiff_t)(slot * d));
}

void OffloadedLayer::prefill(const float* keys, const float* values, int64_t n, size_t tok, size_t hs) {
  begin_prefill(n, /*overlap=*/false);
  prefill_rows(keys, values, 0, n, tok, hs);
  end_prefill();
}

void OffloadedLayer::begin_prefill(int64_t n, bool overlap) {
  TOPKV_CHECK(n_tokens_ == 0 && prefill_total_ < 0, "prefill on a layer that already holds {} tokens", n_tokens_);
  TOPKV_CHECK(n >= 0, "internal: prefill of {} tokens", n);
  n_sinks_ = (int)std::min<int64_t>(cfg_.sinks, n);
  win_len_ = std::min<int64_t>(cfg_.window, n - n_sinks_);
  win_start_ = n - win_len_;
  prefill_total_ = n, prefill_done_ = 0, prefill_overlap_ = overlap;
  const int64_t stored = win_start_ - n_sinks_;
  if (overlap && stored > 0)
    for (Head& hd : heads_)
      if (hd.index) hd.index->begin_build(hd.keys, hd.values, stored);
}

void OffloadedLayer::prefill_rows(const float* keys, const float* values, int64_t t0, int64_t m, size_t tok,
                                  size_t hs) {
  TOPKV_CHECK(prefill_total_ >= 0 && t0 == prefill_done_ && m >= 0 && t0 + m <= prefill_total_,
              "internal: prefill rows {}..{} after {} of {}", t0, t0 + m, prefill_done_, prefill_total_);
  const size_t d = (size_t)cfg_.head_dim;
  const int64_t store_end = win_start_;
  // Heads in parallel: each writes only its own sinks, window, stores and
  // index. The stores' rows are converted to their type here (f16, f8), which
  // on one thread held the 8B's 512K synthetic fill to minutes (session 10:
  // 306 s f16, 548 s f8 on 16 cores).
  ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) if (cfg_.kv_heads > 1 && m * (int64_t)d >= 4096)
  for (int h = 0; h < cfg_.kv_heads; ++h) errors.run([&, h] {
    Head& hd = heads_[(size_t)h];
    std::vector<float> rows;
    const auto row = [&](const float* base, int64_t t) { return base + (t - t0) * tok + h * hs; };
    for (int64_t t = t0; t < std::min<int64_t>(t0 + m, n_sinks_); ++t) {
      hd.sink_k.insert(hd.sink_k.end(), row(keys, t), row(keys, t) + d);
      hd.sink_v.insert(hd.sink_v.end(), row(values, t), row(values, t) + d);
    }
    for (int64_t t = std::max(t0, win_start_); t < t0 + m; ++t) push_window(hd, t, row(keys, t), row(values, t));
    if (hd.streaming) return;
    // This piece's store rows (token-major input -> contiguous rows), in blocks.
    const int64_t lo = std::max<int64_t>(t0, n_sinks_), hi = std::min(t0 + m, store_end);
    const int64_t block = 8192;
    for (const float* src : {keys, values}) {
      RowStore& dst = src == keys ? *hd.keys : *hd.values;
      for (int64_t b0 = lo; b0 < hi; b0 += block) {
        const int64_t cnt = std::min(block, hi - b0);
        rows.resize((size_t)cnt * d);
        for (int64_t i = 0; i < cnt; ++i) std::copy_n(row(src, b0 + i), d, rows.begin() + (ptrdiff_t)(i * d));
        dst.append_f32(rows.data(), cnt);
      }
    }
    if (prefill_overlap_ && hd.index && hi > lo) hd.index->rows_ready(hd.keys->size());
  });
  errors.rethrow();
  prefill_done_ = t0 + m;
}

void OffloadedLayer::past_runs(int kv_head, bool values, int64_t begin, int64_t end,
                               const std::function<void(const KvPastRun&)>& f) const {
  TOPKV_CHECK(kv_head >= 0 && kv_head < cfg_.kv_heads, "internal: KV head {} of {}", kv_head, cfg_.kv_heads);
  TOPKV_CHECK(prefill_total_ >= 0 && 0 <= begin && begin <= end && end <= prefill_done_,
              "internal: past positions {}..{} of a layer that took {} of a prefill", begin, end, prefill_done_);
  const Head& hd = heads_[(size_t)kv_head];
  TOPKV_CHECK(!hd.streaming, "internal: the past of a streaming head (it keeps no store rows) was asked for");
  const size_t d = (size_t)cfg_.head_dim;
  int64_t p = begin;
  if (p < end && p < n_sinks_) {  // sink i is position i
    const int64_t n = std::min<int64_t>(end, n_sinks_) - p;
    f({p, n, (values ? hd.sink_v : hd.sink_k).data() + (size_t)p * d, DType::F32});
    p += n;
  }
  if (p < end && p < win_start_) {  // store row r is position n_sinks + r
    const RowStore& s = values ? *hd.values : *hd.keys;
    const int64_t e = std::min(end, win_start_);
    s.for_each_span(p - n_sinks_, e - n_sinks_, [&](int64_t first, int64_t n, const void* rows) {
      f({first + n_sinks_, n, rows, s.dtype()});
    });
    p = e;
  }
  const std::vector<float>& ring = values ? hd.win_v : hd.win_k;
  while (p < end) {  // window position q sits in ring slot q % window
    const int64_t slot = p % cfg_.window, n = std::min<int64_t>(end - p, cfg_.window - slot);
    f({p, n, ring.data() + (size_t)slot * d, DType::F32});
    p += n;
  }
}

void OffloadedLayer::end_prefill() {
  TOPKV_CHECK(prefill_total_ >= 0 && prefill_done_ == prefill_total_,
              "internal: prefill ends after {} of {} tokens", prefill_done_, prefill_total_);
  n_tokens_ = prefill_total_;
  const bool overlap = prefill_overlap_;
  prefill_total_ = -1;
  // Build (or finish building) every retrieval head's index; heads in
  // parallel, each single-threaded unless there are fewer heads than cores.
  std::vector<int> todo;
  for (int h = 0; h < cfg_.kv_heads; ++h)
    if (heads_[(size_t)h].index && heads_[(size_t)h].keys->size() > 0) todo.push_back(h);
  std::vector<std::string> errors(todo.size());
  // Each head's build may run OpenMP loops of its own (Faiss's add and
  // k-means) on its share of the threads (Config::build.n_threads): they
  // need a second active level, or they run on one thread each.
  const int head_threads = (int)std::min<size_t>(todo.size(), (size_t)std::max(1, omp_get_max_threads()));
  ScopedOmpLevels nested(head_threads > 1 && cfg_.build.n_threads > 1 ? 2 : 0);
#pragma omp parallel for schedule(dynamic, 1) num_threads(head_threads) if (head_threads > 1)
  for (size_t i = 0; i < todo.size(); ++i) {
    Head& hd = heads_[(size_t)todo[i]];
    try {
      if (overlap) hd.index->end_build();
      else hd.index->build(hd.keys, hd.values);
      for (auto& extra : hd.extra_indexes) extra->build(hd.keys, hd.values);
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  }
  for (auto& e : errors) TOPKV_CHECK(e.empty(), "{}", e);
}

void OffloadedLayer::save(PackWriter& w, const std::string& prefix) const {
  const int64_t d = cfg_.head_dim;
  const auto f32_span = [&](const float* p, int64_t rows) { return PackWriter::Span{p, (size_t)(rows * d) * sizeof(float)}; };
  for (int h = 0; h < cfg_.kv_heads; ++h) {
    const Head& hd = heads_[(size_t)h];
    const std::string name = fmt::format("{}h{}.", prefix, h);
    w.add(name + "sinks_k", StDType::F32, {n_sinks_, d}, {f32_span(hd.sink_k.data(), n_sinks_)});
    w.add(name + "sinks_v", StDType::F32, {n_sinks_, d}, {f32_span(hd.sink_v.data(), n_sinks_)});
    // The ring in position order, so a pack does not depend on slot layout.
    std::vector<float> wk((size_t)(win_len_ * d)), wv(wk.size());
    for (int64_t i = 0; i < win_len_; ++i) {
      const size_t slot = (size_t)((win_start_ + i) % cfg_.window) * d;
      std::copy_n(hd.win_k.data() + slot, d, wk.data() + i * d);
      std::copy_n(hd.win_v.data() + slot, d, wv.data() + i * d);
    }
    w.add_owned(name + "window_k", StDType::F32, {win_len_, d}, wk);
    w.add_owned(name + "window_v", StDType::F32, {win_len_, d}, wv);
    if (hd.streaming || hd.keys->size() == 0) continue;
    TOPKV_CHECK(hd.index->attached() && hd.keys->size() == win_start_ - n_sinks_,
                "internal: head {} holds {} store rows and an index over {}, expected {}", h, hd.keys->size(),
                hd.index->indexed_rows(), win_start_ - n_sinks_);
    for (const auto& [store, what] : {std::pair{hd.keys.get(), "keys"}, std::pair{hd.values.get(), "values"}}) {
      std::vector<PackWriter::Span> parts;
      store->for_each_span(0, store->size(), [&](int64_t, int64_t cnt, const void* rows) {
        parts.push_back({rows, (size_t)cnt * store->row_bytes()});
      });
      w.add(name + what, st_dtype_of(store->dtype()), {store->size(), st_row_elems(store->dtype(), d)},
            std::move(parts));
    }
    for (size_t i = 0; i <= hd.extra_indexes.size(); ++i) {
      const KvIndex& index = i == 0 ? *hd.index : *hd.extra_indexes[i - 1];
      TOPKV_CHECK(index.indexed_rows() == hd.keys->size(), "internal: index {} of head {} covers {} of {} rows: "
                  "save right after prefill", index.name(), h, index.indexed_rows(), hd.keys->size());
      // The index's header and small fields as one blob, its large arrays as
      // tensors "<blob>.<array>" that a restore uses in place.
      const std::string blob_name = fmt::format("{}index.{}", name, i);
      PackArrayWriter arrays(w, blob_name + ".");
      std::vector<uint8_t> blob = index.save_bytes(&arrays);
      const int64_t bytes = (int64_t)blob.size();
      w.add_owned(blob_name, StDType::U8, {bytes}, std::move(blob));
    }
  }
}

void OffloadedLayer::restore(const PackReader& r, const std::string& prefix, int64_t n, int index_slot) {
  TOPKV_CHECK(n_tokens_ == 0, "internal: restore on a layer that already holds {} tokens", n_tokens_);
  TOPKV_CHECK(n >= 1, "context pack '{}' holds {} tokens: nothing to restore", r.path(), n);
  const int64_t d = cfg_.head_dim;
  // The split prefill() and append() keep: sinks fill first, then the window, then the store.
  n_sinks_ = (int)std::min<int64_t>(cfg_.sinks, n);
  win_len_ = std::min<int64_t>(cfg_.window, n - n_sinks_);
  win_start_ = n - win_len_;
  const int64_t stored = win_start_ - n_sinks_;
  const std::string backend = parse_spec(cfg_.index).name;
  for (int h = 0; h < cfg_.kv_heads; ++h) {
    Head& hd = heads_[(size_t)h];
    const std::string head = fmt::format("{}h{}", prefix, h), name = head + ".";
    const auto rows = [&](const char* what, int64_t m) {
      return reinterpret_cast<const float*>(r.tensor(name + what, StDType::F32, {m, d}));
    };
    // The exact parts are fp32 and few: a value that is not finite would make
    // every step's attention NaN (a pack re-sealed past its checksums).
    const auto finite_rows = [&](const char* what, int64_t m) {
      const float* x = rows(what, m);
      for (int64_t i = 0; i < m * d; ++i)
        TOPKV_CHECK(std::isfinite(x[i]), "context pack '{}': tensor '{}{}' holds {} at row {}: the pack is corrupt; "
                    "rebuild it with `topkv index build`", r.path(), name, what, x[i], i / d);
      return x;
    };
    const float *sk = finite_rows("sinks_k", n_sinks_), *sv = finite_rows("sinks_v", n_sinks_);
    hd.sink_k.assign(sk, sk + n_sinks_ * d);
    hd.sink_v.assign(sv, sv + n_sinks_ * d);
    const float *wk = finite_rows("window_k", win_len_), *wv = finite_rows("window_v", win_len_);
    for (int64_t i = 0; i < win_len_; ++i) push_window(hd, win_start_ + i, wk + i * d, wv + i * d);
    TOPKV_CHECK(hd.streaming != r.has(name + "keys") || stored == 0,
                "context pack '{}': KV head {} is a {} head there, but a {} head here (the DuoAttention head "
                "pattern differs)", r.path(), head, hd.streaming ? "retrieval" : "streaming",
                hd.streaming ? "streaming" : "retrieval");
    if (hd.streaming || stored == 0) continue;
    const StDType st = st_dtype_of(cfg_.store_dtype);
    const int64_t cols = st_row_elems(cfg_.store_dtype, d);
    for (auto [store, what] : {std::pair{hd.keys.get(), "keys"}, std::pair{hd.values.get(), "values"}}) {
      const std::string tensor = name + what;
      const size_t row_bytes = store->row_bytes();
      // The last partial chunk in place too, copy-on-write, with room to append.
      const auto map_tail = [&r, &tensor, st, stored, cols, row_bytes](int64_t first, size_t chunk_bytes) {
        SafetensorsReader::CowView v =
            r.tensor_copy_on_write(tensor, st, {stored, cols}, first * row_bytes, chunk_bytes);
        return std::shared_ptr<uint8_t>(std::move(v.owner), v.data);
      };
      store->append_mapped(r.tensor(tensor, st, {stored, cols}), stored, r.owner(), map_tail);
    }
    const std::string index = fmt::format("{}index.{}", name, index_slot);
    auto [blob, bytes] = r.blob(index);
    PackArrayReader arrays(r, index + ".");
    hd.index = KvIndex::load_bytes(r.path() + ":" + index, blob, bytes, hd.keys, hd.values, cfg_.build, &arrays);
    TOPKV_CHECK(hd.index->name() == backend, "context pack '{}' holds a {} index for {}, but this layer uses {}",
                r.path(), hd.index->name(), head, backend);
  }
  n_tokens_ = n;
}

void OffloadedLayer::append(const float* key, const float* value) {
  fill_appended(begin_append(), key, value);
}

OffloadedLayer::Placement OffloadedLayer::begin_append() {
  const size_t d = (size_t)cfg_.head_dim;
  const int64_t pos = n_tokens_;
  const bool to_sink = n_sinks_ < cfg_.sinks && win_len_ == 0;
  for (int h = 0; h < cfg_.kv_heads; ++h) {
    Head& hd = heads_[(size_t)h];
    if (to_sink) {  // the sink's data comes with fill_appended
      hd.sink_k.resize(hd.sink_k.size() + d);
      hd.sink_v.resize(hd.sink_v.size() + d);
      continue;
    }
    if (win_len_ == cfg_.window && !hd.streaming) {  // oldest window token -> store
      const size_t slot = (size_t)(win_start_ % cfg_.window);
      hd.keys->append_f32(hd.win_k.data() + slot * d, 1);
      hd.values->append_f32(hd.win_v.data() + slot * d, 1);
      if (!hd.index->attached())
        hd.index->build(hd.keys, hd.values);
      else if (hd.keys->size() - hd.index->indexed_rows() >= cfg_.fold_every)
        hd.index->add_new_rows();  // rows not folded yet are still found by the exact tail scan
    }
  }
  if (to_sink) {
    ++n_sinks_;
  } else if (win_len_ == cfg_.window) {
    ++win_start_;
  } else {
    if (win_len_ == 0) win_start_ = pos;
    ++win_len_;
  }
  ++n_tokens_;
  return {pos, to_sink ? n_sinks_ - 1 : -1};
}

void OffloadedLayer::fold_pending(std::span<const int64_t> upto) {
  TOPKV_CHECK(upto.empty() || upto.size() == heads_.size(), "internal: fold_pending up to {} rows for {} heads",
              upto.size(), heads_.size());
  for (size_t h = 0; h < heads_.size(); ++h) {
    Head& hd = heads_[h];
    if (!hd.streaming && hd.index && hd.index->attached()) hd.index->add_new_rows(upto.empty() ? -1 : upto[h]);
  }
}

void OffloadedLayer::fill_appended(const Placement& at, const float* key, const float* value) {
  const size_t d = (size_t)cfg_.head_dim;
  for (int h = 0; h < cfg_.kv_heads; ++h) {
    Head& hd = heads_[(size_t)h];
    const float* k = key + h * d;
    const float* v = value + h * d;
    if (at.sink >= 0) {
      std::copy(k, k + d, hd.sink_k.begin() + (ptrdiff_t)(at.sink * d));
      std::copy(v, v + d, hd.sink_v.begin() + (ptrdiff_t)(at.sink * d));
    } else {
      push_window(hd, at.pos, k, v);
    }
  }
}

void OffloadedLayer::retrieve(const float* queries, float scale, std::vector<Retrieved>& out) const {
  const int G = cfg_.n_heads / cfg_.kv_heads;
  const size_t d = (size_t)cfg_.head_dim;
  // A query that is not finite (corrupt weights, Inf in a pack's values)
  // would make every score NaN: say so instead of attending to noise.
  const size_t nq = (size_t)cfg_.n_heads * d;
  for (size_t i = 0; i < nq; ++i)
    TOPKV_CHECK(std::isfinite(queries[i]), "the attention query holds {} (query head {}, element {}): the model's "
                "weights or the context's values are not finite; check the model file and the pack (`topkv index "
                "info --verify`)", queries[i], i / d, i % d);
  out.assign((size_t)cfg_.kv_heads, Retrieved{});
  ParallelErrors errors;  // an index that throws must not end the process (src/common/parallel_errors.h)
#pragma omp parallel for schedule(dynamic, 1) if (cfg_.kv_heads > 1)
  for (int h = 0; h < cfg_.kv_heads; ++h) errors.run([&] {
    const Head& hd = heads_[(size_t)h];
    Retrieved& r = out[(size_t)h];
    if (!hd.index || hd.keys->size() == 0) return;
    const float* q = queries + (size_t)h * G * d;
    SearchParams p = cfg_.search;
    p.k = cfg_.k;
    p.n_threads = std::max(1, cfg_.search_threads);
    if (p.scale == 0) p.scale = scale;
    Timer t;
    SearchResult sr = hd.index->search(q, G, p);
    r.ids = std::move(sr.ids);
    r.scores = std::move(sr.scores);
    // Multipole: each far cluster enters as one weighted row, score
    // s_j + ln N_j and value V̄_j (DESIGN.md, "Multipole").
    const size_t nf = sr.far_clusters.size();
    r.far_clusters = (int64_t)nf;
    r.far.assign((size_t)G, AttnPartial((int)d));
    if (nf) {
      // In parallel over blocks of far clusters (this head's threads), the
      // blocks' partials merged exactly; values read in place from the summaries.
      const int nt = (int)std::clamp<int64_t>((int64_t)nf / 256, 1, p.n_threads);
      std::vector<float> logw(nf), fs((size_t)G * nf);
      for (size_t j = 0; j < nf; ++j) logw[j] = std::log((float)sr.summaries->counts[(size_t)sr.far_clusters[j]]);
      for (size_t i = 0; i < (size_t)G * nf; ++i) fs[i] = sr.far_scores[i] * scale;
      std::vector<AttnPartial> part((size_t)nt * G, AttnPartial((int)d));
#pragma omp parallel for num_threads(nt) schedule(static)
      for (int b = 0; b < nt; ++b) {
        const size_t lo = nf * (size_t)b / (size_t)nt, hi = nf * (size_t)(b + 1) / (size_t)nt;
        for (int g = 0; g < G; ++g)
          partial_add_gather(part[(size_t)b * G + g], fs.data() + (size_t)g * nf + lo, logw.data() + lo,
                             sr.summaries->value_means.data(), sr.far_clusters.data() + lo, (int64_t)(hi - lo));
      }
      for (int b = 0; b < nt; ++b)
        for (int g = 0; g < G; ++g) partial_merge(r.far[(size_t)g], part[(size_t)b * G + g]);
    }
    r.search_s = t.seconds();
  });
  errors.rethrow();
}

void OffloadedLayer::attend(const float* queries, float scale, float* out, AttendStats* stats) const {
  const int G = cfg_.n_heads / cfg_.kv_heads;
  const size_t d = (size_t)cfg_.head_dim;
  std::vector<Retrieved> found;
  retrieve(queries, scale, found);
  ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) if (cfg_.kv_heads > 1)
  for (int h = 0; h < cfg_.kv_heads; ++h) errors.run([&] {
    const Head& hd = heads_[(size_t)h];
    const Retrieved& r = found[(size_t)h];
    const size_t m = r.ids.size();
    std::vector<float> fs(m);
    for (int g = 0; g < G; ++g) {
      AttnPartial p((int)d);
      add_exact_parts(hd, queries + ((size_t)h * G + g) * d, scale, p);  // sinks + window
      if (m) {
        AttnPartial retrieved((int)d);
        for (size_t j = 0; j < m; ++j) fs[j] = r.scores[(size_t)g * m + j] * scale;
        partial_add_rows(retrieved, fs.data(), *hd.values, r.ids.data(), (int64_t)m);
        partial_merge(p, retrieved);
      }
      if (!r.far.empty()) partial_merge(p, r.far[(size_t)g]);
      partial_finish(p, out + ((size_t)h * G + g) * d);
    }
  });
  errors.rethrow();
  if (stats) {
    *stats = {};
    for (auto& r : found) {
      stats->retrieved += (int64_t)r.ids.size();
      stats->far_clusters += r.far_clusters;
      stats->search_s = std::max(stats->search_s, r.search_s);
    }
    stats->exact = (int64_t)cfg_.kv_heads * (n_sinks_ + win_len_);
  }
}

void OffloadedLayer::add_exact_parts(const Head& hd, const float* q, float scale, AttnPartial& p) const {
  const size_t d = (size_t)cfg_.head_dim;
  std::vector<float> s((size_t)std::max<int64_t>(n_sinks_, win_len_));
  for (int t = 0; t < n_sinks_; ++t) s[(size_t)t] = dot_f32(hd.sink_k.data() + t * d, q, d) * scale;
  partial_add(p, s.data(), nullptr, hd.sink_v.data(), n_sinks_);
  // The window's positions sit in the ring as at most two contiguous runs of
  // slots; the softmax does not care about their order.
  const int64_t first = win_start_ % cfg_.window, run1 = std::min<int64_t>(win_len_, cfg_.window - first);
  for (auto [a, len] : {std::pair<int64_t, int64_t>{first, run1}, std::pair<int64_t, int64_t>{0, win_len_ - run1}}) {
    for (int64_t i = 0; i < len; ++i) s[(size_t)i] = dot_f32(hd.win_k.data() + (size_t)(a + i) * d, q, d) * scale;
    partial_add(p, s.data(), nullptr, hd.win_v.data() + (size_t)a * d, len);
  }
}

void OffloadedLayer::attend_exact(const float* queries, float scale, float* out) const {
  exact_pass(queries, scale, out, -1);
}

double OffloadedLayer::attend_exact_and_mass(const float* queries, float scale, float* out, int64_t k) const {
  return exact_pass(queries, scale, out, std::max<int64_t>(k, 0));
}

namespace {

// The share of the softmax mass held by `near` (sinks + window, as a partial)
// and the k largest of the store's scores x[0, n) (reordered), whose whole
// mass the exact pass's partial `stored` holds already (no second exp per row).
double topk_mass(const AttnPartial& near, const AttnPartial& stored, float* x, int64_t n, int64_t k) {
  const float top = std::max(near.m, stored.m);
  if (!std::isfinite(top)) return 1.0;  // nothing held
  const auto mass = [top](const AttnPartial& p) { return p.l > 0 ? (double)p.l * std::exp((double)p.m - top) : 0.0; };
  const double exact_part = mass(near), all = mass(stored);
  double kept = 0;
  const int64_t kk = std::clamp<int64_t>(k, 0, n);
  std::nth_element(x, x + kk, x + n, std::greater<float>());
  for (int64_t i = 0; i < kk; ++i) kept += std::exp((double)x[i] - top);
  return (exact_part + kept) / (exact_part + all);
}

}  // namespace

// One pass of scores per query head serves both the exact output and, with
// k >= 0, the oracle mass (mean over query heads; 0 when k < 0).
double OffloadedLayer::exact_pass(const float* queries, float scale, float* out, int64_t k) const {
  const int G = cfg_.n_heads / cfg_.kv_heads;
  const size_t d = (size_t)cfg_.head_dim;
  double sum = 0;
  std::vector<float> xs;
  std::vector<AttnPartial> stored;
  for (int h = 0; h < cfg_.kv_heads; ++h) {
    const Head& hd = heads_[(size_t)h];
    const int64_t n = hd.keys ? hd.keys->size() : 0;
    const float* qh = queries + (size_t)h * G * d;
    xs.resize(k >= 0 ? (size_t)(G * n) : 0);
    // The store's rows, once for the G query heads of this KV head (none: G empty partials).
    if (n > 0) partial_exact_group(qh, G, scale, *hd.keys, *hd.values, n, stored, k >= 0 ? xs.data() : nullptr);
    else stored.assign((size_t)G, AttnPartial((int)d));
    for (int g = 0; g < G; ++g) {
      const float* q = qh + (size_t)g * d;
      AttnPartial p((int)d);
      add_exact_parts(hd, q, scale, p);  // sinks + window
      const AttnPartial near = p;
      partial_merge(p, stored[(size_t)g]);
      partial_finish(p, out + ((size_t)h * G + g) * d);
      if (k >= 0) sum += topk_mass(near, stored[(size_t)g], xs.data() + (size_t)g * n, n, k);
    }
  }
  return k >= 0 ? sum / (double)(cfg_.kv_heads * G) : 0.0;
}

size_t OffloadedLayer::host_bytes() const {
  size_t b = 0;
  for (auto& h : heads_) {
    if (!h.keys) continue;
    b += (size_t)h.keys->size() * h.keys->row_bytes() * 2;
    if (h.index && h.index->indexed_rows() > 0) {
      const MemoryReport m = h.index->memory();
      b += m.owned() + m.mapped_bytes;
    }
  }
  return b;
}

size_t OffloadedLayer::in_place_bytes() const {
  size_t b = 0;
  for (auto& h : heads_) {
    if (!h.keys) continue;
    b += h.keys->mapped_bytes() + h.values->mapped_bytes();
    if (h.index && h.index->indexed_rows() > 0) b += h.index->memory().mapped_bytes;
  }
  return b;
}

size_t OffloadedLayer::window_bytes() const {
  return heads_.size() * (size_t)(cfg_.sinks + cfg_.window) * cfg_.head_dim * 2 * sizeof(float);
}

}  // namespace topkv
