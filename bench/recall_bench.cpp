#include "bench/recall_bench.h"

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "bench/recall_metrics.h"
#include "index/kmeans.h"
#include "src/common/error.h"
#include "src/common/options.h"
#include "src/common/progress.h"
#include "src/common/timer.h"

namespace topkv {

namespace {

constexpr int kWarmupSearches = 10;

const char* const kSearchParams[] = {"k", "ef", "nprobe", "threshold", "gqa"};

std::string canonical_param(const std::string& p) { return p == "budget" ? "k" : p; }

// Every combination of the sweeps that apply to backend `name`, as lists of
// (param, value); one empty combination when none applies.
std::vector<std::vector<std::pair<std::string, std::string>>> sweep_points(const std::vector<SweepSpec>& sweeps,
                                                                           const std::string& name) {
  std::vector<std::vector<std::pair<std::string, std::string>>> points = {{}};
  std::vector<std::string> seen;
  for (auto& s : sweeps) {
    if (!s.backend.empty() && s.backend != name) continue;
    TOPKV_CHECK(std::find(seen.begin(), seen.end(), s.param) == seen.end(),
                "parameter '{}' of backend '{}' is swept twice: give one --sweep per parameter", s.param, name);
    seen.push_back(s.param);
    std::vector<std::vector<std::pair<std::string, std::string>>> next;
    for (auto& pt : points)
      for (auto& v : s.values) {
        next.push_back(pt);
        next.back().emplace_back(s.param, v);
      }
    points = std::move(next);
  }
  return points;
}

}  // namespace

const char* gqa_name(GqaMode m) { return m == GqaMode::Mean ? "mean" : "union"; }

SweepSpec parse_sweep_spec(std::string_view text) {
  const size_t eq = text.find('=');
  TOPKV_CHECK(eq != std::string_view::npos && eq > 0 && eq + 1 < text.size(),
              "bad sweep '{}': use BACKEND.PARAM=VALUES, e.g. hnswlib.ef=16,32,64 or k=16:512:x2", text);
  std::string lhs(text.substr(0, eq)), rhs(text.substr(eq + 1));
  SweepSpec s;
  const size_t dot = lhs.find('.');
  s.param = canonical_param(dot == std::string::npos ? lhs : lhs.substr(dot + 1));
  if (dot != std::string::npos) s.backend = lhs.substr(0, dot);
  TOPKV_CHECK(dot == std::string::npos || !s.backend.empty(), "bad sweep '{}': empty backend name", text);
  TOPKV_CHECK(std::find(std::begin(kSearchParams), std::end(kSearchParams), s.param) != std::end(kSearchParams),
              "bad sweep '{}': unknown search parameter '{}' (use k or budget, ef, nprobe, threshold, gqa)", text,
              s.param);
  if (s.param == "gqa") {
    size_t start = 0;
    while (start <= rhs.size()) {
      size_t c = rhs.find(',', start);
      std::string v = rhs.substr(start, c == std::string::npos ? std::string::npos : c - start);
      TOPKV_CHECK(v == "union" || v == "mean", "bad sweep '{}': gqa takes union or mean, not '{}'", text, v);
      s.values.push_back(v);
      if (c == std::string::npos) break;
      start = c + 1;
    }
  } else if (s.param == "threshold") {
    for (double v : parse_double_list(rhs)) {
      TOPKV_CHECK(v >= 0 && v <= 1, "bad sweep '{}': a threshold is a share of attention in [0, 1]", text);
      s.values.push_back(fmt::format("{}", v));
    }
  } else {
    for (int64_t v : parse_sweep(rhs)) {
      TOPKV_CHECK(s.param != "k" || v >= 1, "bad sweep '{}': k must be at least 1", text);
      TOPKV_CHECK(v >= 0 && v <= (int64_t)1 << 30, "bad sweep '{}': value {} out of range", text, v);
      s.values.push_back(std::to_string(v));
    }
  }
  TOPKV_CHECK(!s.values.empty(), "bad sweep '{}': no values", text);
  return s;
}

void apply_search_param(SearchParams& p, const std::string& param, const std::string& value) {
  if (param == "k") p.k = std::stoll(value);
  else if (param == "ef") p.ef = std::stoi(value);
  else if (param == "nprobe") p.nprobe = std::stoi(value);
  else if (param == "threshold") p.threshold = std::stod(value);
  else if (param == "gqa") p.gqa = value == "mean" ? GqaMode::Mean : GqaMode::Union;
  else fail("unknown search parameter '{}'", param);
}

std::string search_label(const SearchParams& p, const std::vector<std::string>& shown) {
  std::string s = fmt::format("k={}", p.k);
  for (auto& n : shown) {
    if (n == "ef") s += fmt::format(",ef={}", p.ef);
    if (n == "nprobe") s += fmt::format(",nprobe={}", p.nprobe);
    if (n == "threshold") s += fmt::format(",threshold={}", p.threshold);
    if (n == "gqa") s += fmt::format(",gqa={}", gqa_name(p.gqa));
  }
  return s;
}

Stat summarize(const std::vector<double>& v) {
  return {mean(v), percentile(v, 5), percentile(v, 50), percentile(v, 99)};
}

RecallBenchResult run_recall_bench(const AttentionData& data, const RecallBenchConfig& cfg) {
  // ---- validate everything before the long work
  TOPKV_CHECK(cfg.k >= 1, "--k must be at least 1 (got {})", cfg.k);
  TOPKV_CHECK(!data.heads.empty(), "no attention data to benchmark");
  TOPKV_CHECK(!cfg.index_specs.empty(), "no index backend to benchmark: give --index");
  const AttentionHead& head = data.heads[0];
  TOPKV_CHECK(head.n_keys() >= 1 && head.n_queries >= 1, "the measured head has {} keys and {} queries",
              head.n_keys(), head.n_queries);
  TOPKV_CHECK(std::isfinite(data.scale) && data.scale > 0, "the attention scale {} is not positive", data.scale);
  for (auto& h : data.heads)
    TOPKV_CHECK(h.dim() == head.dim() && h.group == head.group && h.n_queries == head.n_queries,
                "every KV head of the layer needs the measured head's shape");
  const int threads = cfg.threads > 0 ? cfg.threads : std::max(1u, std::thread::hardware_concurrency());
  std::vector<Spec> specs;
  for (auto& text : cfg.index_specs) {
    specs.push_back(parse_spec(text));
    KvIndex::create(specs.back());  // unknown backend or build parameter: Error now
  }
  for (auto& s : cfg.sweeps) {
    bool used = s.backend.empty();
    for (auto& sp : specs) used = used || sp.name == s.backend;
    TOPKV_CHECK(used, "--sweep {}.{} names backend '{}' but no --index uses it", s.backend, s.param, s.backend);
  }
  for (auto& sp : specs) sweep_points(cfg.sweeps, sp.name);  // swept twice: Error now

  RecallBenchResult res;
  res.config = cfg;
  res.source = data.source;
  res.n_keys = head.n_keys();
  res.head_dim = head.dim();
  res.group = head.group;
  res.n_queries = head.n_queries;
  res.kv_heads = (int)data.heads.size();
  res.threads = threads;
  res.dtype = dtype_name(head.keys->dtype());
  res.scale = data.scale;

  Timer truth_timer;
  const std::vector<QueryTruth> truth = exact_truth(head, data.scale, cfg.k, threads, cfg.progress);
  res.truth_seconds = truth_timer.seconds();
  std::vector<double> oracle;
  for (auto& t : truth) oracle.push_back(t.topk_mass);
  res.oracle_mass = mean(oracle);

  const int G = head.group, nq = head.n_queries, n_heads = (int)data.heads.size();
  tbb::task_arena arena(threads);
  for (size_t si = 0; si < specs.size(); ++si) {
    const Spec& spec = specs[si];
    BuildOptions bo;
    bo.n_threads = threads;
    bo.seed = cfg.seed;
    bo.progress = cfg.progress && n_heads == 1;
    if (cfg.kmeans == "lloyd") bo.kmeans = std::make_shared<LloydKMeans>();
    std::vector<std::unique_ptr<KvIndex>> idx;
    double build_seconds = 0;
    {
      Progress bar("build " + cfg.index_specs[si], n_heads, "heads", cfg.progress && n_heads > 1);
      for (int h = 0; h < n_heads; ++h) {
        idx.push_back(KvIndex::create(spec, bo));
        Timer t;
        idx.back()->build(data.heads[(size_t)h].keys, data.heads[(size_t)h].values);
        if (h == 0) build_seconds = t.seconds();
        bar.add(1);
      }
    }
    const MemoryReport memory = idx[0]->memory();

    for (auto& point : sweep_points(cfg.sweeps, spec.name)) {
      RecallRow row;
      row.index = cfg.index_specs[si];
      row.backend = spec.name;
      row.build_params = spec.params.str();
      row.params.k = cfg.k;
      std::vector<std::string> shown;
      for (auto& [param, value] : point) {
        apply_search_param(row.params, param, value);
        shown.push_back(param);
      }
      row.params.n_threads = 1;
      row.params.scale = data.scale;
      row.label = search_label(row.params, shown);
      row.build_seconds = build_seconds;
      row.memory = memory;
      row.n_keys = head.n_keys();

      const KvIndex& index = *idx[0];
      for (int j = 0; j < std::min(kWarmupSearches, nq); ++j) index.search(head.step_queries(j), G, row.params);
      std::vector<double> lat, rec, mass, err, scored, ids, summaries;
      for (int j = 0; j < nq; ++j) {
        Timer t;
        SearchResult r = index.search(head.step_queries(j), G, row.params);
        lat.push_back(t.us());
        scored.push_back(fraction_scored(r, head.n_keys()));
        ids.push_back((double)r.ids.size());
        summaries.push_back((double)r.stats.summaries_scored);
        for (int g = 0; g < G; ++g) {
          const float* q = head.step_queries(j) + (size_t)g * head.dim();
          QueryMetrics m = evaluate_query(r, g, q, truth[(size_t)j * G + g], *head.keys, *head.values, data.scale,
                                          cfg.k);
          rec.push_back(m.recall);
          mass.push_back(m.mass_recall);
          err.push_back(m.output_error);
        }
      }
      row.recall = summarize(rec);
      row.mass_recall = summarize(mass);
      row.output_error = summarize(err);
      row.fraction_scored = mean(scored);
      row.ids_per_search = mean(ids);
      row.summaries_per_search = mean(summaries);
      row.latency_us = summarize(lat);
      row.qps = row.latency_us.mean > 0 ? 1e6 / row.latency_us.mean : 0;

      if (n_heads > 1) {
        std::vector<double> layer;
        arena.execute([&] {
          for (int j = 0; j < nq; ++j) {
            Timer t;
            tbb::parallel_for(0, n_heads, [&](int h) {
              idx[(size_t)h]->search(data.heads[(size_t)h].step_queries(j), G, row.params);
            });
            layer.push_back(t.us());
          }
        });
        row.layer_heads = n_heads;
        row.layer_latency_us = summarize(layer);
      }
      if (cfg.progress)
        std::fprintf(stderr, "%s %s: recall@%d %.4f, mass %.4f, %.0f QPS\n", row.index.c_str(), row.label.c_str(),
                     cfg.k, row.recall.mean, row.mass_recall.mean, row.qps);
      res.rows.push_back(std::move(row));
    }
  }
  return res;
}

}  // namespace topkv
