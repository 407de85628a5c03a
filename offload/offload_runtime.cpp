#include "offload/offload_runtime.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "index/kmeans.h"
#include "index/page_bounds.h"
#include "offload/memory_plan.h"
#include "offload/pack_file.h"
#include "src/common/error.h"
#include "src/common/options.h"
#include "src/common/progress.h"
#include "src/common/timer.h"
#include "src/model/model.h"

namespace topkv {

OffloadRuntime::OffloadRuntime(const ModelConfig& cfg, const OffloadPolicy& policy, bool progress)
    : cfg_(cfg), policy_(policy), progress_(progress) {
  policy_.validate();
  TOPKV_CHECK(policy_.attn == AttnMode::TopK, "internal: OffloadRuntime built for dense attention");
  // --build-on lloyd: the GPU engine's k-means on the host (its twin).
  if (policy_.build_on == BuildOn::Lloyd) kmeans_ = std::make_shared<LloydKMeans>();
  std::unique_ptr<HeadPattern> pattern;
  if (!policy_.heads_file.empty())
    pattern = std::make_unique<HeadPattern>(load_head_pattern(policy_.heads_file, cfg_.n_layer, cfg_.n_head_kv,
                                                              policy_.heads_threshold, policy_.heads_sparsity));
  slot_.assign((size_t)cfg_.n_layer, -1);
  for (int il : offloaded_layers(cfg_, policy_.dense_layers)) {
    std::vector<char> streaming((size_t)cfg_.n_head_kv, 0);
    if (pattern)
      for (int h = 0; h < cfg_.n_head_kv; ++h) streaming[(size_t)h] = pattern->is_streaming(il, h);
    slot_[(size_t)il] = (int)retrieval_layers_.size();
    retrieval_layers_.push_back(il);
    streaming_.push_back(std::move(streaming));
  }
  TOPKV_CHECK(!retrieval_layers_.empty(),
              "--attn topk has no layer to serve: every full-context layer is among the first --dense-layers {} "
              "(the model has {} layers); lower --dense-layers",
              policy_.dense_layers, cfg_.n_layer);
  // A layer kept dense by --dense-layers keeps no store, so naming it is no
  // error (a pack built without dense layers serves runs with some); a layer
  // the model does not have, or a sliding-window one, is.
  const std::vector<int> full = offloaded_layers(cfg_, 0);
  for (const auto& [il, type] : policy_.store_dtype_at)
    TOPKV_CHECK(std::find(full.begin(), full.end(), il) != full.end(), "--store-type-at {}: layer {} is not a "
                "full-context layer of this model (those are {}): name only those", store_type_at_spec(policy_), il,
                fmt::join(full, ", "));
  for (int il : retrieval_layers_)
    TOPKV_CHECK(!dtype_blocked(policy_.store_dtype_of(il)) || cfg_.head_dim % (int)kQ8Block == 0,
                "--store-type {} stores blocks of {} elements; this model's head_dim {} is not a multiple: use f16 "
                "(or f8 for 8 bits, which rounds keys with outlier dimensions badly: see --help)",
                dtype_name(policy_.store_dtype_of(il)), kQ8Block, cfg_.head_dim);
  // Reject a bad index spec, and a search parameter it would ignore, before any prefill work.
  TOPKV_CHECK(KvIndex::create(policy_.index)->reranks() || policy_.search.rerank <= 1.0,
              "--rerank {} applies to one-level centroid and multipole indexes; index '{}' would ignore it",
              policy_.search.rerank, policy_.index);
  topkv::k_per_layer(1, (int)retrieval_layers_.size(), policy_.k_schedule, policy_.k_weights);  // a weights schedule's length
}

bool build_on_gpu(const OffloadPolicy& policy, bool cuda) {
  if (!cuda || policy.build_on == BuildOn::Host || policy.build_on == BuildOn::Lloyd) return false;
  if (policy.build_on == BuildOn::Gpu) return true;
  const auto index = KvIndex::create(policy.index);
  return index->uses_kmeans() || index->uses_page_bounds();
}

bool OffloadRuntime::overrides(int layer) const {
  return layer >= 0 && layer < (int)slot_.size() && slot_[(size_t)layer] >= 0;
}

const OffloadedLayer* OffloadRuntime::layer(int il) const {
  return overrides(il) ? layers_.empty() ? nullptr : layers_[(size_t)slot_[(size_t)il]].get() : nullptr;
}

OffloadedLayer::Config OffloadRuntime::layer_config(int i) const {
  OffloadedLayer::Config c;
  c.n_heads = cfg_.n_head;
  c.kv_heads = cfg_.n_head_kv;
  c.head_dim = cfg_.head_dim;
  c.sinks = policy_.sinks;
  c.window = policy_.window;
  c.k = k_[(size_t)i];
  c.search = policy_.search;
  c.index = policy_.index;
  c.store_dtype = policy_.store_dtype_of(retrieval_layers_[(size_t)i]);
  c.streaming = streaming_[(size_t)i];
  // A layer's KV heads build (OffloadedLayer::end_prefill) and a step's heads
  // search in parallel, each head on its share of the run's threads
  // (--threads): with fewer KV heads than cores (Gemma 3 has one) a head's
  // build and summary scoring use the spare cores. The share is one whenever
  // fill_layers builds layers in parallel (it does so only with fewer than
  // two threads per KV head).
  const int head_share = std::max(1, omp_get_max_threads() / std::max(1, cfg_.n_head_kv));
  c.build.n_threads = head_share;
  c.search_threads = head_share;
  c.extra_indexes = extra_indexes_;
  c.build.kmeans = kmeans_;
  c.build.bounds = bounds_;
  return c;
}

void OffloadRuntime::take_prefill(const Model& model) {
  take_context(model.n_past(), model.kv_reader());
}

// Each layer in flight holds a piece of its context (kContextPiece
// positions) as fp32 K and V, the reader's output, while its store fills:
// 512 MiB at the Llama-3-8B geometry. The stores (each layer's store type)
// and indexes of every layer are what must stay; what is left of the free
// memory bounds the layers staged at once (at least one).
int OffloadRuntime::layers_in_flight(int64_t n) const {
  const int nl = (int)retrieval_layers_.size();
  const double staging = 2.0 * cfg_.n_head_kv * (double)std::min(n, kContextPiece) * cfg_.head_dim * sizeof(float);
  const double stores = (double)n * store_bytes_per_position(cfg_, policy_) +
                        (double)nl * cfg_.n_head_kv * n * KvIndex::create(policy_.index)->bytes_per_key_estimate(cfg_.head_dim);
  const double avail = host_memory_available();
  int cap = std::max(1, std::min(nl, omp_get_max_threads()));
  if (avail > 0 && staging > 0) cap = (int)std::clamp((avail - stores) / staging, 1.0, (double)cap);
  return cap;
}

void OffloadRuntime::start_context(int64_t n) {
  TOPKV_CHECK(layers_.empty(), "the offloaded runtime already holds a prompt; start a new one");
  TOPKV_CHECK(n >= 1, "the offloaded runtime needs a prefilled prompt");
  k_ = k_for_context(n);
  layers_.resize(retrieval_layers_.size());
}

std::vector<int64_t> OffloadRuntime::k_for_context(int64_t n) const {
  return topkv::k_per_layer(policy_.mean_k(n), (int)retrieval_layers_.size(), policy_.k_schedule, policy_.k_weights);
}

void OffloadRuntime::take_context(int64_t n, const KvReader& read) {
  start_context(n);
  const int64_t keys_total = (int64_t)layers_.size() * cfg_.n_head_kv * std::max<int64_t>(0, n - policy_.sinks - policy_.window);
  Progress bar("index build", keys_total, "keys", progress_ && keys_total >= 100000);
  std::atomic<int64_t> read_us{0};
  // One pair of staging buffers a layer in flight, kept from layer to layer
  // and piece to piece: a fresh pair a layer was faulted in and zeroed by one
  // thread each time (the readers' resize), while the synthetic generator ran
  // on every core (session 30: its reading took 212 s of a 310 s fill on the
  // 16-core GPU host, bench/results/gpu_session30/). A layer is read in
  // pieces: whole, a layer of the 8B's 1M context was 8 GiB of staging, 8% of
  // the run's peak host memory (bench/results/gpu_session31/).
  const int in_flight = layers_in_flight(n);
  const int nkv = cfg_.n_head_kv;
  const size_t d = (size_t)cfg_.head_dim;
  std::vector<std::pair<std::vector<float>, std::vector<float>>> staging((size_t)in_flight);
  fill_layers(in_flight, [&](int i, int worker, OffloadedLayer& layer) {
    auto& [k, v] = staging[(size_t)worker];
    const int il = retrieval_layers_[(size_t)i];
    layer.begin_prefill(n, /*overlap=*/false);
    int64_t indexed = 0;
    for (int64_t t0 = 0; t0 < n; t0 += kContextPiece) {
      const int64_t m = std::min(kContextPiece, n - t0);
      Timer rt;
      read_positions(read, il, t0, m, (size_t)nkv * d, k, v);  // [kv][m][d]
      read_us += (int64_t)(rt.seconds() * 1e6);
      layer.prefill_rows(k.data(), v.data(), t0, m, d, (size_t)m * d);
      int64_t stored = 0;
      for (int h = 0; h < nkv; ++h) stored += layer.stored_rows(h);
      bar.add(stored - indexed), indexed = stored;
    }
    layer.end_prefill();
  });
  bar.finish();
  stats_.read_s = (double)read_us.load() * 1e-6;
}

void OffloadRuntime::begin_context(int64_t n) {
  start_context(n);
  for (int i = 0; i < (int)layers_.size(); ++i) {
    layers_[(size_t)i] = std::make_unique<OffloadedLayer>(layer_config(i));
    layers_[(size_t)i]->begin_prefill(n, /*overlap=*/true);
  }
  absorbed_ = 0;
}

void OffloadRuntime::absorb(int64_t upto, const KvReader& read) {
  TOPKV_CHECK(absorbed_ >= 0 && upto >= absorbed_, "internal: absorb up to {} after {}", upto, absorbed_);
  const int64_t m = upto - absorbed_;
  if (m == 0) return;
  std::vector<float> k, v;
  for (size_t i = 0; i < layers_.size(); ++i) {
    read_positions(read, retrieval_layers_[i], absorbed_, m, (size_t)cfg_.n_head_kv * cfg_.head_dim, k, v);
    layers_[i]->prefill_rows(k.data(), v.data(), absorbed_, m, (size_t)cfg_.head_dim, (size_t)m * cfg_.head_dim);
  }
  absorbed_ = upto;
}

bool OffloadRuntime::serves_prefill_past() const {
  for (const std::vector<char>& heads : streaming_)
    if (std::find(heads.begin(), heads.end(), 1) != heads.end()) return false;
  return true;
}

int64_t OffloadRuntime::past_end(int layer) const {
  return absorbed_ >= 0 && layer >= 0 && layer < (int)slot_.size() && slot_[(size_t)layer] >= 0 ? absorbed_ : 0;
}

void OffloadRuntime::past_runs(int layer, int kv_head, bool values, int64_t begin, int64_t end,
                               const std::function<void(const KvPastRun&)>& f) const {
  TOPKV_CHECK(absorbed_ >= 0 && end <= past_end(layer), "internal: the past of layer {} up to {} was asked for, "
              "the runtime holds {}", layer, end, past_end(layer));
  layers_[(size_t)slot_[(size_t)layer]]->past_runs(kv_head, values, begin, end, f);
}

void OffloadRuntime::end_context() {
  TOPKV_CHECK(absorbed_ >= 0, "internal: end_context without begin_context");
  Timer t;
  absorbed_ = -1;
  try {
    for (auto& layer : layers_) layer->end_prefill();  // each waits for its heads' blocks, then finishes
  } catch (...) {
    layers_.clear();  // no half-built runtime: a later take_* starts afresh
    throw;
  }
  layers_ready(t);  // build_s: what the overlap left after the prefill
}

void OffloadRuntime::layers_ready(const Timer& since) {
  Timer ready;
  for (int i = 0; i < (int)layers_.size(); ++i) on_layer_ready(i);
  stats_.ready_s = ready.seconds();
  stats_.build_s = since.seconds();
  stats_.keys_indexed = 0;
  for (auto& l : layers_)
    for (int h = 0; h < cfg_.n_head_kv; ++h) stats_.keys_indexed += l->stored_rows(h);
}

void OffloadRuntime::fill_layers(int in_flight, const std::function<void(int, int, OffloadedLayer&)>& fill) {
  Timer t;
  const int nl = (int)layers_.size();
  // Layers in parallel when the model has more KV heads than there are cores
  // to spread over a layer's heads, at most in_flight at once; otherwise one
  // layer at a time, its index builds using every core (Gemma 3: one KV
  // head, three layers). Nested parallelism is off by default, so an inner
  // build inside a parallel layer loop runs on one thread.
  const bool layers_parallel = nl > 1 && cfg_.n_head_kv * 2 > omp_get_max_threads();
  std::vector<std::string> errors((size_t)nl);
#pragma omp parallel for schedule(dynamic, 1) num_threads(in_flight) if (layers_parallel && in_flight > 1)
  for (int i = 0; i < nl; ++i) {
    try {
      auto layer = std::make_unique<OffloadedLayer>(layer_config(i));
      fill(i, omp_get_thread_num(), *layer);  // this loop's team: in_flight threads, or the caller alone
      layers_[(size_t)i] = std::move(layer);
    } catch (const std::exception& e) {
      errors[(size_t)i] = e.what();
    }
  }
  for (auto& e : errors)
    if (!e.empty()) {
      layers_.clear();  // no half-filled runtime: a later take_* starts afresh
      fail("{}", e);
    }
  layers_ready(t);
}

void OffloadRuntime::build_extra_indexes(const std::vector<std::string>& specs) {
  TOPKV_CHECK(layers_.empty(), "internal: extra indexes are built with the context, not after it");
  extra_indexes_.clear();
  std::vector<std::string> seen{canonical_spec(policy_.index)};
  for (const std::string& spec : specs) {
    KvIndex::create(spec);  // an unknown backend or parameter is an Error now, before any work
    const std::string c = canonical_spec(spec);
    TOPKV_CHECK(std::find(seen.begin(), seen.end(), c) == seen.end(), "--index {} is given twice", spec);
    seen.push_back(c);
    extra_indexes_.push_back(spec);
  }
}

void OffloadRuntime::save(PackWriter& w) const {
  TOPKV_CHECK(!layers_.empty(), "internal: saving an offloaded runtime that holds no context");
  for (size_t i = 0; i < layers_.size(); ++i) layers_[i]->save(w, fmt::format("offload.L{}.", retrieval_layers_[i]));
  nlohmann::json streaming = nlohmann::json::array();
  for (auto& s : streaming_) streaming.push_back(std::vector<int>(s.begin(), s.end()));
  std::vector<std::string> indexes{canonical_spec(policy_.index)};
  for (auto& spec : extra_indexes_) indexes.push_back(canonical_spec(spec));
  w.meta()["offload"] = {{"tokens", layers_[0]->n_tokens()},
                         {"retrieval_layers", retrieval_layers_},
                         {"streaming", streaming},
                         {"indexes", indexes}};
}

void OffloadRuntime::take_pack(const PackReader& r) {
  int64_t n = 0;
  std::vector<int> layers;
  std::vector<std::vector<int>> streaming;
  std::vector<std::string> indexes;
  try {
    const nlohmann::json& j = r.meta().at("offload");
    n = j.at("tokens").get<int64_t>();
    layers = j.at("retrieval_layers").get<std::vector<int>>();
    streaming = j.at("streaming").get<std::vector<std::vector<int>>>();
    indexes = j.at("indexes").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    fail("context pack '{}' has no readable offload description ({}): rebuild it", r.path(), e.what());
  }
  const int slot = (int)(std::find(indexes.begin(), indexes.end(), canonical_spec(policy_.index)) - indexes.begin());
  TOPKV_CHECK(slot < (int)indexes.size(), "context pack '{}' holds the indexes {}, not {}: query one of those "
              "(--index), or rebuild the pack with `topkv index build --index {}`", r.path(),
              fmt::join(indexes, ", "), policy_.index, policy_.index);
  // The run's top-k layers are the pack's or, with more dense first layers
  // (ContextPack::policy_for_run's model_holds_context), a subset of them:
  // each layer's store and index are saved under its own name.
  TOPKV_CHECK(streaming.size() == layers.size(), "context pack '{}': {} streaming masks for {} layers", r.path(),
              streaming.size(), layers.size());
  std::vector<size_t> at;  // the pack's position of each run layer
  for (int il : retrieval_layers_) {
    const size_t j = (size_t)(std::find(layers.begin(), layers.end(), il) - layers.begin());
    TOPKV_CHECK(j < layers.size(), "context pack '{}' serves layers {} with top-k attention but this run would "
                "serve {}: use the pack's model and --dense-layers", r.path(), fmt::join(layers, ","),
                fmt::join(retrieval_layers_, ","));
    TOPKV_CHECK((int)streaming[j].size() == cfg_.n_head_kv, "context pack '{}': layer {} has a streaming mask of "
                "{} heads, the model has {}", r.path(), il, streaming[j].size(), cfg_.n_head_kv);
    at.push_back(j);
  }
  start_context(n);
  for (size_t i = 0; i < at.size(); ++i) streaming_[i].assign(streaming[at[i]].begin(), streaming[at[i]].end());
  // Restoring stages nothing: the stores are mapped, only tails and indexes are copied.
  const int in_flight = std::max(1, std::min((int)layers_.size(), omp_get_max_threads()));
  fill_layers(in_flight, [&](int i, int, OffloadedLayer& layer) {
    layer.restore(r, fmt::format("offload.L{}.", retrieval_layers_[(size_t)i]), n, slot);
  });
}

void OffloadRuntime::decode_attention(int layer, const float* q, const float* k, const float* v, int64_t pos,
                                      float scale, float* out) {
  TOPKV_CHECK(!layers_.empty(), "decode on the offloaded runtime before take_prefill");
  OffloadedLayer& l = *layers_[(size_t)slot_[(size_t)layer]];
  TOPKV_CHECK(pos == l.n_tokens(), "offloaded layer {} holds {} tokens but the model decodes position {}", layer,
              l.n_tokens(), pos);
  Timer t;
  l.append(k, v);
  AttendStats st;
  l.attend(q, scale, out, &st);
  stats_.attend_s += t.seconds();
  stats_.search_s += st.search_s;
  stats_.retrieved += st.retrieved;
  stats_.far_clusters += st.far_clusters;
  stats_.exact += st.exact;
  if (layer == retrieval_layers_.back()) ++stats_.steps;
  if (measure_error_) record_error(slot_[(size_t)layer], q, scale, out);
}

void OffloadRuntime::record_error(int i, const float* q, float scale, const float* out) {
  const size_t n = (size_t)cfg_.n_head * cfg_.head_dim;
  std::vector<float> exact(n);
  const int64_t k = k_.empty() ? policy_.search.k : k_[(size_t)i];
  const double mass = layers_[(size_t)i]->attend_exact_and_mass(q, scale, exact.data(), k);
  err_sq_.resize(layers_.size(), 0.0);
  ref_sq_.resize(layers_.size(), 0.0);
  for (size_t j = 0; j < n; ++j) {
    err_sq_[(size_t)i] += ((double)out[j] - exact[j]) * ((double)out[j] - exact[j]);
    ref_sq_[(size_t)i] += (double)exact[j] * exact[j];
  }
  mass_sum_.resize(layers_.size(), 0.0);
  mass_steps_.resize(layers_.size(), 0);
  mass_sum_[(size_t)i] += mass;
  ++mass_steps_[(size_t)i];
}

std::vector<double> OffloadRuntime::oracle_topk_mass() const {
  std::vector<double> m(retrieval_layers_.size(), 0.0);
  for (size_t i = 0; i < mass_sum_.size(); ++i) m[i] = mass_steps_[i] ? mass_sum_[i] / (double)mass_steps_[i] : 0.0;
  return m;
}

std::vector<double> OffloadRuntime::attention_rel_error() const {
  std::vector<double> e(retrieval_layers_.size(), 0.0);
  for (size_t i = 0; i < err_sq_.size(); ++i) e[i] = ref_sq_[i] > 0 ? std::sqrt(err_sq_[i] / ref_sq_[i]) : 0.0;
  return e;
}

size_t OffloadRuntime::host_bytes() const {
  size_t b = 0;
  for (auto& l : layers_) b += l->host_bytes() + l->window_bytes();
  return b;
}

size_t OffloadRuntime::in_place_bytes() const {
  size_t b = 0;
  for (auto& l : layers_) b += l->in_place_bytes();
  return b;
}

std::vector<MemoryPlan::Line> OffloadRuntime::device_plan_at(int64_t n, const DeviceTableChoice& tables) const {
  (void)n, (void)tables;
  std::vector<MemoryPlan::Line> lines;
  // An engine's work space where this runtime's index takes it.
  const auto index = KvIndex::create(policy_.index);
  if (const double b = kmeans_ && index->uses_kmeans() ? kmeans_->device_bytes(cfg_.head_dim) : 0.0; b > 0)
    lines.push_back({"k-means work space (--build-on gpu)", 0, b});
  if (const double b = bounds_ && index->uses_page_bounds() ? bounds_->device_bytes(cfg_.head_dim) : 0.0; b > 0)
    lines.push_back({"page bounds work space (--build-on gpu)", 0, b});
  return lines;
}

int64_t OffloadRuntime::device_bytes_estimate(int64_t n, const DeviceTableChoice& tables) const {
  double b = 0;
  for (const MemoryPlan::Line& l : device_plan_at(n, tables)) b += l.gpu;
  return (int64_t)b;
}

std::vector<int64_t> OffloadRuntime::device_reserves(int64_t n) const {
  std::vector<int64_t> out;
  for (const DeviceTableChoice& t : device_table_choices()) out.push_back(device_bytes_estimate(n, t));
  if (out.empty()) out.push_back(device_bytes_estimate(n));
  return out;
}

void OffloadRuntime::set_device_tables(const DeviceTableChoice& c) {
  const std::vector<DeviceTableChoice> choices = device_table_choices();
  TOPKV_CHECK(std::find(choices.begin(), choices.end(), c) != choices.end(), "internal: device tables as {} are not "
              "among this runtime's choices", c.name());
  TOPKV_CHECK(layers_.empty(), "internal: the device tables are chosen before the runtime takes a context");
  device_tables_ = c;
}

std::string OffloadRuntime::describe() const {
  std::string ks;
  for (size_t i = 0; i < retrieval_layers_.size(); ++i)
    ks += fmt::format("{}{}:{}", i ? " " : "", retrieval_layers_[i], k_.empty() ? policy_.search.k : k_[i]);
  int streaming = 0;
  for (auto& s : streaming_) streaming += (int)std::count(s.begin(), s.end(), 1);
  return fmt::format("top-k attention on {} of {} layers (layer:k {}), index {}, sinks {}, window {}, "
                     "{} streaming KV heads",
                     retrieval_layers_.size(), cfg_.n_layer, ks, policy_.index, policy_.sinks, policy_.window,
                     streaming);
}

}  // namespace topkv
