#include "offload/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "index/kv_index.h"
#include "src/common/error.h"
#include "src/common/options.h"

namespace topkv {

double MemoryPlan::host_total() const {
  double t = 0;
  for (auto& l : lines) t += l.host;
  return t;
}

double MemoryPlan::gpu_total() const {
  double t = 0;
  for (auto& l : lines) t += l.gpu;
  return t;
}

std::string MemoryPlan::table() const {
  std::string s = fmt::format("  {:<52} {:>12} {:>12}\n", "memory plan", "host", "GPU");
  for (auto& l : lines)
    s += fmt::format("  {:<52} {:>12} {:>12}\n", l.what, format_bytes(l.host), l.gpu ? format_bytes(l.gpu) : "-");
  s += fmt::format("  {:<52} {:>12} {:>12}", "total", format_bytes(host_total()),
                   gpu_total() ? format_bytes(gpu_total()) : "-");
  return s;
}

MemoryPlan plan_memory(const MemoryPlanInput& in) {
  const ModelConfig& c = *in.cfg;
  const OffloadPolicy& p = *in.policy;
  const bool topk = p.attn == AttnMode::TopK;
  const double row = (double)c.head_dim;
  const double kv_per_tok = 2.0 * c.n_head_kv * row * dtype_size(in.kv_dtype);
  MemoryPlan plan;
  plan.lines.push_back({"weights", in.weight_bytes, 0});
  int full = 0, sliding = 0, retrieval = 0;
  for (int il = 0; il < c.n_layer; ++il) {
    const auto& lc = c.layers[(size_t)il];
    if (lc.sliding || lc.window > 0) {
      ++sliding;
      continue;
    }
    ++full;
    if (topk && il >= p.dense_layers) ++retrieval;
  }
  if (sliding) {
    const auto& lc = *std::find_if(c.layers.begin(), c.layers.end(), [](auto& l) { return l.window > 0; });
    const double ring = (double)std::min<int64_t>(in.context, lc.window + in.max_chunk - 1);
    plan.lines.push_back({fmt::format("KV of {} sliding-window layers ({} slots)", sliding, (int64_t)ring),
                          sliding * ring * kv_per_tok, 0});
  }
  const int in_model = in.from_pack || in.retrieval_rings ? full - retrieval : full;
  plan.lines.push_back({fmt::format("KV of {} full-context layers ({} tokens, {})", in_model, in.context,
                                    dtype_name(in.kv_dtype)),
                        in_model * (double)in.context * kv_per_tok, 0});
  if (in.retrieval_rings && !in.from_pack && retrieval) {
    const int64_t slots = std::min<int64_t>(in.context, in.max_chunk);
    plan.lines.push_back({fmt::format("prefill rings of {} top-k layers ({} slots)", retrieval, slots),
                          retrieval * (double)slots * kv_per_tok, 0});
  }
  if (retrieval) {
    const double stored = (double)std::max<int64_t>(0, in.context - p.sinks - p.window);
    const double heads = (double)retrieval * c.n_head_kv;
    const std::string at = store_type_at_spec(p);
    plan.lines.push_back({fmt::format("host KV store, {} layers x {} KV heads ({}{}{})", retrieval, c.n_head_kv,
                                      dtype_name(p.store_dtype), at.empty() ? "" : "; layers ", at),
                          stored * store_bytes_per_position(c, p), 0});
    std::vector<std::string> specs{p.index};
    specs.insert(specs.end(), in.extra_indexes.begin(), in.extra_indexes.end());
    for (const std::string& spec : specs) {
      auto idx = KvIndex::create(spec);
      plan.lines.push_back({fmt::format("indexes ({}, ~{:.0f} B/key)", spec, idx->bytes_per_key_estimate(c.head_dim)),
                            heads * stored * idx->bytes_per_key_estimate(c.head_dim), 0});
    }
    plan.lines.push_back({fmt::format("sinks + window ({} + {} tokens)", p.sinks, p.window),
                          heads * ((double)p.sinks + (double)p.window) * 2.0 * row * sizeof(float), 0});
  }
  plan.lines.insert(plan.lines.end(), in.device_lines.begin(), in.device_lines.end());
  return plan;
}

void check_plan_fits(const MemoryPlan& plan, double available) {
  if (available <= 0) return;
  TOPKV_CHECK(plan.host_total() <= available,
              "this run needs about {} of host memory but {} is available (the least of MemAvailable, the "
              "address-space limit and the cgroup's memory limit):\n{}\nlower the context (-c), use a "
              "smaller index (e.g. --index centroid or quest), or --attn topk with fewer dense layers",
              format_bytes(plan.host_total()), format_bytes(available), plan.table());
}

}  // namespace topkv
