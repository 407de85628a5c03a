#include "bench/kv_dump.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "src/common/error.h"

namespace topkv {

namespace {

constexpr char kFormat[] = "topkv.kv_dump";
constexpr int kFormatVersion = 1;

std::string tensor_name(int layer, const char* what) { return fmt::format("layer{}.{}", layer, what); }

// "layer12.keys" -> 12; -1 for other names.
int layer_of_keys(const std::string& name) {
  const std::string pre = "layer", post = ".keys";
  if (name.size() <= pre.size() + post.size() || name.compare(0, pre.size(), pre) != 0 ||
      name.compare(name.size() - post.size(), post.size(), post) != 0)
    return -1;
  std::string digits = name.substr(pre.size(), name.size() - pre.size() - post.size());
  if (digits.empty() || digits.size() > 6 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::atoi(digits.c_str());
}

int64_t parse_position(const std::string& path, const std::string& key, const std::string& v) {
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  TOPKV_CHECK(!v.empty() && *end == 0 && x >= 0, "KV dump '{}': metadata {}='{}' is not a position", path, key, v);
  return x;
}

}  // namespace

KvDumpReader::KvDumpReader(const std::string& path) : file_(path, "KV dump") {
  const std::string format = file_.metadata_or("format", "");
  TOPKV_CHECK(format == kFormat,
              "'{}' is not a topkv KV dump: its metadata 'format' is '{}', expected '{}' (see bench/kv_dump.h "
              "for the convention)", path, format, kFormat);
  const std::string version = file_.metadata_or("format_version", "1");
  TOPKV_CHECK(version == std::to_string(kFormatVersion),
              "KV dump '{}' has format_version {}; this topkv reads version {}", path, version, kFormatVersion);
  for (auto& t : file_.tensors())
    if (int l = layer_of_keys(t.name); l >= 0) layers_.push_back(l);
  std::sort(layers_.begin(), layers_.end());
  TOPKV_CHECK(!layers_.empty(), "KV dump '{}' has no layer{{L}}.keys tensor", path);
  for (int l : layers_) layer_shape(l);  // validate every layer up front
  const std::string scale = file_.metadata_or("scale", "");
  if (!scale.empty()) {
    char* end = nullptr;
    double s = std::strtod(scale.c_str(), &end);
    TOPKV_CHECK(*end == 0 && std::isfinite(s) && s > 0, "KV dump '{}': metadata scale='{}' is not a positive number",
                path, scale);
  }
}

KvDumpLayerShape KvDumpReader::layer_shape(int layer) const {
  auto it = std::find(layers_.begin(), layers_.end(), layer);
  if (it == layers_.end()) {
    std::string have;
    for (int l : layers_) have += (have.empty() ? "" : ", ") + std::to_string(l);
    fail("KV dump '{}' has no layer {} (it has layers {})", path(), layer, have);
  }
  const TensorInfo& k = file_.get(tensor_name(layer, "keys"));
  const TensorInfo& v = file_.get(tensor_name(layer, "values"));
  const TensorInfo& q = file_.get(tensor_name(layer, "queries"));
  auto where = [&](const TensorInfo& t) { return fmt::format("KV dump '{}': {} {}", path(), t.name, t.shape_str()); };
  TOPKV_CHECK(k.shape.size() == 3, "{}: keys must be [kv_heads, n_keys, head_dim]", where(k));
  TOPKV_CHECK(v.shape == k.shape, "{}: values must have the keys' shape {}", where(v), k.shape_str());
  TOPKV_CHECK(q.shape.size() == 3, "{}: queries must be [n_queries, q_heads, head_dim]", where(q));
  TOPKV_CHECK(st_is_row_type(k.dtype) && v.dtype == k.dtype,
              "{}: keys and values must both be F32, F16 or BF16 (keys {}, values {})", where(k),
              st_dtype_name(k.dtype), st_dtype_name(v.dtype));
  TOPKV_CHECK(st_is_row_type(q.dtype), "{}: queries must be F32, F16 or BF16 (got {})", where(q),
              st_dtype_name(q.dtype));
  KvDumpLayerShape s;
  s.kv_heads = (int)k.shape[0];
  s.n_keys = k.shape[1];
  s.head_dim = (int)k.shape[2];
  s.n_queries = (int)q.shape[0];
  s.q_heads = (int)q.shape[1];
  s.key_dtype = k.dtype;
  s.query_dtype = q.dtype;
  TOPKV_CHECK(s.kv_heads >= 1 && s.n_keys >= 1 && s.head_dim >= 1, "{}: empty keys", where(k));
  TOPKV_CHECK(q.shape[2] == s.head_dim, "{}: query head_dim {} differs from the keys' {}", where(q), q.shape[2],
              s.head_dim);
  TOPKV_CHECK(s.n_queries >= 1, "{}: no queries", where(q));
  TOPKV_CHECK(s.q_heads >= s.kv_heads && s.q_heads % s.kv_heads == 0,
              "{}: {} query heads are not a multiple of the {} KV heads (GQA)", where(q), s.q_heads, s.kv_heads);
  return s;
}

float KvDumpReader::scale(int layer) const {
  const std::string s = file_.metadata_or("scale", "");
  return s.empty() ? 1.f / std::sqrt((float)layer_shape(layer).head_dim) : std::strtof(s.c_str(), nullptr);
}

int64_t KvDumpReader::key_position0(int layer) const {
  const std::string key = fmt::format("layer{}.key_position0", layer);
  std::string v = file_.metadata_or(key, "");
  if (!v.empty()) return parse_position(path(), key, v);
  return parse_position(path(), "key_position0", file_.metadata_or("key_position0", "0"));
}

int64_t KvDumpReader::query_position0(int layer) const {
  std::string v = file_.metadata_or("query_position0", "");
  return v.empty() ? key_position0(layer) + layer_shape(layer).n_keys
                   : parse_position(path(), "query_position0", v);
}

AttentionHead KvDumpReader::load_head(int layer, int kv_head, std::optional<DType> dtype, int max_queries,
                                      int64_t skip_keys) const {
  const KvDumpLayerShape s = layer_shape(layer);
  TOPKV_CHECK(kv_head >= 0 && kv_head < s.kv_heads, "KV dump '{}' layer {} has KV heads 0..{}; head {} asked for",
              path(), layer, s.kv_heads - 1, kv_head);
  TOPKV_CHECK(max_queries >= 0, "the number of queries must be >= 0 (0 = all)");
  TOPKV_CHECK(skip_keys >= 0 && skip_keys < s.n_keys, "KV dump '{}' layer {} holds {} keys: {} skipped leaves none "
              "(skip 0 .. {})", path(), layer, s.n_keys, skip_keys, s.n_keys - 1);
  const DType file_type = row_dtype_of(s.key_dtype), store_type = dtype.value_or(file_type);
  const int d = s.head_dim;
  AttentionHead h;
  h.group = s.group();
  h.n_queries = max_queries > 0 ? std::min(max_queries, s.n_queries) : s.n_queries;
  for (const char* what : {"keys", "values"}) {
    const TensorInfo& t = file_.get(tensor_name(layer, what));
    auto store = std::make_shared<RowStore>(d, store_type);
    const uint8_t* rows = file_.data(t) + (size_t)kv_head * s.n_keys * d * dtype_size(file_type);
    // Through fp32 in batches: every value is checked to be finite (a NaN key
    // makes every metric NaN), and converted when the store type differs.
    const int64_t batch = 4096;
    const size_t file_row = (size_t)d * dtype_size(file_type);
    std::vector<float> buf((size_t)batch * d);
    for (int64_t i = skip_keys; i < s.n_keys; i += batch) {
      const int64_t m = std::min(batch, s.n_keys - i);
      to_f32(file_type, rows + (size_t)i * file_row, buf.data(), (size_t)(m * d));
      for (int64_t e = 0; e < m * d; ++e)
        TOPKV_CHECK(std::isfinite(buf[(size_t)e]), "KV dump '{}' layer {}: the {} of KV head {} hold {} at row {}: "
                    "the dump is corrupt (record it again with `topkv kv dump`)", path(), layer, what, kv_head,
                    buf[(size_t)e], i + e / d);
      if (store_type == file_type) store->append_raw(rows + (size_t)i * file_row, m);
      else store->append_f32(buf.data(), m);
    }
    (what[0] == 'k' ? h.keys : h.values) = std::move(store);
  }
  const TensorInfo& q = file_.get(tensor_name(layer, "queries"));
  h.queries.resize((size_t)h.n_queries * h.group * d);
  for (int j = 0; j < h.n_queries; ++j)
    for (int g = 0; g < h.group; ++g) {
      int64_t qh = (int64_t)kv_head * h.group + g;
      file_.read_f32(q, ((int64_t)j * s.q_heads + qh) * d, d, &h.queries[((size_t)j * h.group + g) * d]);
    }
  for (float x : h.queries)
    TOPKV_CHECK(std::isfinite(x), "KV dump '{}' layer {}: a query of KV head {} holds a non-finite value", path(),
                layer, kv_head);
  return h;
}

AttentionData KvDumpReader::load(int layer, const std::vector<int>& kv_heads, std::optional<DType> dtype,
                                 int max_queries, int64_t skip_keys) const {
  AttentionData out;
  out.scale = scale(layer);
  for (int h : kv_heads) out.heads.push_back(load_head(layer, h, dtype, max_queries, skip_keys));
  out.source = fmt::format("dump {} (model {}) layer {}{}", path(), model(), layer,
                           skip_keys ? fmt::format(", its first {} keys left out", skip_keys) : "");
  return out;
}

void KvDumpWriter::add_layer(int layer, const AttentionData& data) {
  TOPKV_CHECK(layer >= 0, "layer index must be >= 0 (got {})", layer);
  TOPKV_CHECK(!data.heads.empty(), "layer {} has no heads to dump", layer);
  for (auto& [l, d] : layers_) {
    TOPKV_CHECK(l != layer, "layer {} added twice to the dump", layer);
    TOPKV_CHECK(d->scale == data.scale, "a dump has one scale: layer {} has {}, layer {} has {}", l, d->scale, layer,
                data.scale);
  }
  TOPKV_CHECK(std::isfinite(data.scale) && data.scale > 0, "layer {}: the attention scale {} is not positive", layer,
              data.scale);
  const AttentionHead& h0 = data.heads[0];
  for (auto& h : data.heads) {
    TOPKV_CHECK(h.keys && h.values, "layer {}: a head without keys or values", layer);
    TOPKV_CHECK(h.n_keys() == h0.n_keys() && h.values->size() == h0.n_keys() && h.dim() == h0.dim() &&
                    h.values->dim() == h0.dim() && h.keys->dtype() == h0.keys->dtype() &&
                    h.values->dtype() == h0.keys->dtype() && h.n_queries == h0.n_queries && h.group == h0.group &&
                    h.queries.size() == (size_t)h.n_queries * h.group * h.dim(),
                "layer {}: every head of a dumped layer needs the same shapes and element type", layer);
  }
  layers_.emplace_back(layer, &data);
}

void KvDumpWriter::write(const std::string& path) {
  TOPKV_CHECK(!layers_.empty(), "nothing to dump: add a layer first");
  SafetensorsWriter w;
  w.set_metadata("format", kFormat);
  w.set_metadata("format_version", std::to_string(kFormatVersion));
  w.set_metadata("model", model_);
  w.set_metadata("scale", fmt::format("{:.9g}", layers_[0].second->scale));
  w.set_metadata("key_position0", "0");
  w.set_metadata("rope", "applied");
  query_buffers_.assign(layers_.size(), {});
  for (size_t li = 0; li < layers_.size(); ++li) {
    const auto& [layer, data] = layers_[li];
    const AttentionHead& h0 = data->heads[0];
    const int kvh = (int)data->heads.size(), d = h0.dim(), G = h0.group, nq = h0.n_queries;
    const int64_t n = h0.n_keys();
    const StDType dt = st_dtype_of(h0.keys->dtype());
    for (const char* what : {"keys", "values"}) {
      std::vector<SafetensorsWriter::Span> parts;
      for (auto& h : data->heads) {
        const RowStore& s = what[0] == 'k' ? *h.keys : *h.values;
        s.for_each_span(0, n, [&](int64_t, int64_t cnt, const void* rows) {
          parts.push_back({rows, (size_t)cnt * s.row_bytes()});
        });
      }
      w.add(tensor_name(layer, what), dt, {kvh, n, d}, std::move(parts));
    }
    auto& qb = query_buffers_[li];
    qb.resize((size_t)nq * kvh * G * d);
    for (int j = 0; j < nq; ++j)
      for (int h = 0; h < kvh; ++h)
        std::copy_n(data->heads[(size_t)h].step_queries(j), (size_t)G * d,
                    qb.begin() + (ptrdiff_t)(((size_t)j * kvh + h) * G * d));
    w.add(tensor_name(layer, "queries"), StDType::F32, {nq, kvh * G, d}, qb.data());
  }
  w.write(path);
}

}  // namespace topkv
