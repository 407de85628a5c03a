#include "src/cli/policy_options.h"

#include <fmt/format.h>

#include "src/common/error.h"
#include "src/common/options.h"

namespace topkv::cli {

OffloadPolicy cli_default_policy() {
  OffloadPolicy p;
  p.k_fraction = kDefaultKFraction, p.k_min = kDefaultKMin, p.k_max = kDefaultKMax;
  return p;
}

void add_policy_options(CLI::App* cmd, const std::shared_ptr<PolicyArgs>& a) {
  OffloadPolicy& p = a->policy;
  const std::string g = "Attention policy";
  cmd->add_option("--attn", a->attn, "dense: all KV in the model's cache; topk: retrieval layers keep their KV in a "
                  "host store behind per-head indexes and attend to the top-k keys + sinks + window")
      ->group(g)->check(CLI::IsMember(attn_mode_names()));
  cmd->add_option("--index", a->indexes, fmt::format("Index backend with build parameters, e.g. flat, hnswlib:M=32, "
                  "faiss-ivf:nlist=1024, quest:page=16, centroid, multipole (topkv info lists them; default {}). "
                  "With a context pack: one of the indexes built into it (index build and bench decode take several: "
                  "repeat --index, or list them, \"multipole,hnswlib:M=32,efc=200\")", p.index))
      ->group(g);
  cmd->add_option("--k", p.search.k, fmt::format("Keys retrieved per KV head and layer (mean over layers; token "
                  "budget for quest/centroid/multipole): a fixed k, which replaces a k fraction that a pack or --config "
                  "carries. Default: {:g}% of the prompt, at least {} and at most {} keys (--k-fraction {:g} --k-min {} "
                  "--k-max {})", 100 * kDefaultKFraction, kDefaultKMin, kDefaultKMax, kDefaultKFraction, kDefaultKMin,
                  kDefaultKMax))
      ->group(g);
  cmd->add_option("--k-fraction", p.k_fraction, "k as a fraction of the prompt length (e.g. 0.01 = 1%), within "
                  "--k-min and --k-max when given with them (else unbounded); overrides --k")->group(g);
  cmd->add_option("--k-min", p.k_min, fmt::format("With a k fraction: at least this k (default {})", kDefaultKMin))
      ->group(g);
  cmd->add_option("--k-max", p.k_max, fmt::format("With a k fraction: at most this k, 0 = no bound (default {})",
                                                  kDefaultKMax))->group(g);
  cmd->add_option("--k-schedule", a->k_schedule, "uniform: the same k on every retrieval layer; linear: rising "
                  "from first to last with the same total (top-k paper); ends: twice as much at the first and last "
                  "layer as in the middle, the same total; weights:w0/w1/...: k in proportion to one weight a "
                  "retrieval layer, the same total")
      ->group(g);
  cmd->add_option("--ef", p.search.ef, "HNSW search list size (0 = max(k, 64))")->group(g);
  cmd->add_option("--nprobe", p.search.nprobe, "IVF lists probed (0 = backend default)")->group(g);
  cmd->add_option("--threshold", p.search.threshold, "centroid/multipole: keep clusters whose estimated attention "
                  "share is at least this (0 = budget mode)")->group(g);
  cmd->add_option("--rerank", p.search.rerank, "centroid/multipole, budget mode: select clusters until R*k tokens, "
                  "then keep each head's k best of their rows by exact q.k (finds a key among look-alikes; the "
                  "device search does it too, reading R times the rows' keys). 1: off; default: the index spec's "
                  "rerank= (4 for one-level centroid/multipole). A search-time choice: a pack built without it "
                  "serves it")->group(g);
  cmd->add_option("--gqa", a->gqa, "union: each query head searches; mean: one search with the mean query")
      ->group(g)->check(CLI::IsMember({"union", "mean"}));
  cmd->add_option("--dense-layers", p.dense_layers, "The first N layers stay dense (as Quest does)")
      ->group(g)->capture_default_str();
  cmd->add_option("--sinks", p.sinks, "Attention-sink tokens kept exactly")->group(g)->capture_default_str();
  cmd->add_option("--window", p.window, "Recent tokens kept exactly")->group(g)->capture_default_str();
  cmd->add_option("--store-type", a->store_type, "Element type of the host KV store: f16, bf16, q8_0 (int8 "
                  "with an f16 scale per 32 elements, ggml's Q8_0: 53% of f16's bytes, rounding <= 0.4% of the "
                  "block's largest; the 8-bit store to use) or f8 (8-bit E4M3: half of f16's bytes, up to 6% "
                  "rounding per element, which breaks keys with outlier dimensions: Qwen2.5-1.5B at 16K scores "
                  "0.76 of dense with f8, 1.00 with q8_0)")
      ->group(g)->check(CLI::IsMember({"f16", "bf16", "f8", "q8_0"}));
  cmd->add_option("--store-type-at", a->store_type_at, "Host store types per layer, over --store-type: "
                  "LAYER=TYPE[,LAYER=TYPE...], layers counted from 0, e.g. `--store-type q8_0 --store-type-at 0=f16`. "
                  "For layers whose keys have outlier dimensions that no 8-bit type keeps: Qwen2.5-Coder's layer 0 "
                  "holds 7-9x f16's top-k attention error in q8_0 (1.5B), the 0.5B's layers 0 and 8 too; every "
                  "other layer matches f16 within 2%. Each layer named must be a full-context layer of the model")
      ->group(g);
  cmd->add_flag("--stage-rows", p.stage_rows, "CUDA: copy retrieved rows into a staging buffer on the host and "
                "send them in one copy, instead of the GPU reading them in place from pinned host memory. The "
                "store then needs no pinning: from a context pack it is used in place (a much faster start at "
                "1M tokens, a slower decode: one wait per layer and step)")
      ->group(g);
  cmd->add_option("--search-on", a->search_on, "CUDA: where retrieval heads search. gpu: the index's summary "
                  "tables (cluster centroids, Quest page bounds) live on the device and the whole search runs "
                  "there, budget mode (multipole, centroid, quest); host: the host cores search; auto (default): "
                  "gpu where the index and options allow it")
      ->group(g)->check(CLI::IsMember(search_on_names()));
  cmd->add_option("--build-on", a->build_on, "Where centroid and multipole indexes run their blockwise "
                  "k-means, and quest bounds its pages: gpu (CUDA: Lloyd rounds on the device, cuBLAS products, ~3x "
                  "faster to a built index; the page bounds there, the same bits as the host's), host (Faiss and the "
                  "bounds on the host cores), lloyd (the GPU's rounds on the host cores: the indexes gpu builds, on "
                  "any machine; slower), or auto (default: gpu when the run is on the GPU and the index clusters or "
                  "bounds pages, host otherwise)")
      ->group(g)->check(CLI::IsMember(build_on_names()));
  cmd->add_option("--device-table-type", a->device_table_type, "CUDA, --search-on gpu: element type of the "
                  "device summary tables: auto (default: f16 while the GPU holds them beside the rest of the run, else i8, "
                  "then for Quest's page bounds i8 with pages 2 or 4 times longer (coarser selection), chosen before "
                  "the prefill and reported), f16, bf16, f32, f8 (E4M3) or i8 (int8 with a scale per "
                  "dimension). The 8-bit types take half of f16's table memory, so more of the store fits the store "
                  "cache; Quest's page bounds are rounded outward and stay bounds. With multipole on Qwen2.5, whose "
                  "keys have a few very large dimensions, f8 raised next-token KL to dense 20-30x; i8 keeps each "
                  "dimension's own range (next-token KL as f16's)")
      ->group(g)->check(CLI::IsMember({"auto", "f16", "bf16", "f32", "f8", "i8"}));
  cmd->add_option("--device-fold", p.device_fold, "CUDA, --search-on gpu: evicted rows attended exactly on the "
                  "device before they are folded into the index on a host thread; the new tables are used from a fixed "
                  "step, a quarter of this later (so a greedy run repeats itself)")
      ->group(g)->capture_default_str();
  cmd->add_flag("--sync-folds", p.sync_folds, "CUDA, --search-on gpu: fold evicted rows into the index on the "
                "decode path (the step waits for it, as on the CPU runtime) instead of on a host thread while "
                "the device keeps attending them exactly")
      ->group(g);
  cmd->add_option("--store-cache", a->store_cache, "CUDA, --search-on gpu: GPU memory for copies of the host "
                  "store's rows, so retrieved rows are read there instead of over PCIe where they fit: auto "
                  "(default: what --gpu-mem-budget or the GPU leaves, less 1 GiB), off, or a size such as 16G. "
                  "Taken after the first decode steps; not with --stage-rows")
      ->group(g);
  cmd->add_option("--heads", p.heads_file, "DuoAttention head pattern (TSV of gate values, one row per layer, one "
                  "column per KV head); heads below --heads-threshold keep only sinks + window")
      ->group(g)->check(CLI::ExistingFile);
  cmd->add_option("--heads-threshold", p.heads_threshold, "Gate value below which a head streams")
      ->group(g)->capture_default_str();
  cmd->add_option("--heads-sparsity", p.heads_sparsity, "Make this fraction of heads (lowest gates) stream; "
                  "overrides --heads-threshold")->group(g);
  cmd->add_option("--config", a->config, "JSON file with any of the policy fields (flags given here win)")
      ->group(g)->check(CLI::ExistingFile);
}

std::vector<std::string> split_index_specs(const std::string& list) {
  std::vector<std::string> specs;
  for (const std::string& piece : split_list(list)) {
    TOPKV_CHECK(!piece.empty(), "--index '{}' has an empty spec (two commas in a row, or one at an end)", list);
    const bool param = piece.find('=') != std::string::npos && piece.find(':') == std::string::npos;
    if (param && !specs.empty()) specs.back() += "," + piece;
    else specs.push_back(piece);
  }
  return specs;
}

std::vector<std::string> PolicyArgs::index_specs() const {
  std::vector<std::string> out;
  for (const std::string& value : indexes)
    for (std::string& spec : split_index_specs(value)) out.push_back(std::move(spec));
  return out;
}

OffloadPolicy PolicyArgs::resolve(const CLI::App& cmd, const OffloadPolicy& base, bool many_indexes) const {
  OffloadPolicy out = base;
  if (!config.empty()) out.apply_json_file(config);
  auto given = [&](const char* name) { return cmd.count(name) > 0; };
  if (given("--attn")) out.attn = parse_attn_mode(attn);
  const std::vector<std::string> specs = index_specs();
  TOPKV_CHECK(many_indexes || specs.size() <= 1, "--index names {} indexes: a run searches one (`topkv index "
              "build` builds several into a pack, `bench decode` times each)", specs.size());
  if (!specs.empty()) out.index = specs.front();
  if (given("--k")) out.search.k = policy.search.k;
  // --k-fraction overrides --k, with the bounds given beside it (none
  // else: a fraction asked for is not capped silently); --k alone overrides
  // a fraction the base carries (the default, a pack built with one, a
  // config file's k_fraction).
  if (given("--k-fraction")) out.k_fraction = policy.k_fraction, out.k_min = 1, out.k_max = 0;
  else if (given("--k")) out.k_fraction = 0;
  if (given("--k-min")) out.k_min = policy.k_min;
  if (given("--k-max")) out.k_max = policy.k_max;
  TOPKV_CHECK(out.k_fraction > 0 || (!given("--k-min") && !given("--k-max")), "--k-min and --k-max bound a k that "
              "follows the context (--k-fraction); with a fixed --k {} they would do nothing: drop them, or give "
              "--k-fraction", out.search.k);
  if (given("--k-schedule")) {
    try {
      set_k_schedule(out, k_schedule);
    } catch (const Error& e) {
      fail("--k-schedule: {}", e.what());
    }
  }
  if (given("--ef")) out.search.ef = policy.search.ef;
  if (given("--nprobe")) out.search.nprobe = policy.search.nprobe;
  if (given("--threshold")) out.search.threshold = policy.search.threshold;
  if (given("--rerank")) out.search.rerank = policy.search.rerank;
  if (given("--gqa")) out.search.gqa = gqa == "mean" ? GqaMode::Mean : GqaMode::Union;
  if (given("--dense-layers")) out.dense_layers = policy.dense_layers;
  if (given("--sinks")) out.sinks = policy.sinks;
  if (given("--window")) out.window = policy.window;
  if (given("--store-type")) out.store_dtype = parse_store_dtype(store_type);
  if (given("--store-type-at")) set_store_type_at(out, store_type_at);
  if (given("--stage-rows")) out.stage_rows = policy.stage_rows;
  if (given("--search-on")) out.search_on = parse_search_on(search_on);
  if (given("--build-on")) out.build_on = parse_build_on(build_on);
  if (given("--device-table-type")) set_device_table_spec(out, device_table_type);
  if (given("--device-fold")) out.device_fold = policy.device_fold;
  if (given("--sync-folds")) out.sync_folds = policy.sync_folds;
  if (given("--store-cache")) out.store_cache = parse_store_cache(store_cache);
  if (given("--heads")) out.heads_file = policy.heads_file;
  if (given("--heads-threshold")) out.heads_threshold = policy.heads_threshold;
  if (given("--heads-sparsity")) out.heads_sparsity = policy.heads_sparsity;
  out.validate();
  return out;
}

}  // namespace topkv::cli
