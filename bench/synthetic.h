// Synthetic attention data that is hard to search for the reasons real KV
// caches are (each property below is a parameter, so a benchmark can switch it
// off and see what it costs):
//
//  * Keys share a large offset and have uneven per-dimension variance. Real
//    keys sit in a narrow cone with a few "massive" dimensions, concentrated in
//    the low-frequency RoPE pairs, so inner product != cosine and graph/cluster
//    structure built on keys is lopsided.
//  * Queries are out of distribution for the keys (RetrievalAttention; the
//    top-k paper, Sec. 3, "a vector database over the keys"): their mean is a
//    large vector mostly in dimensions where keys vary little, so a query is far
//    from every key and its nearest keys by L2 are not its best by inner
//    product. A structure built from key-to-key neighbourhoods lands the query
//    in the wrong place.
//  * RoPE (NeoX pairing: dimension p pairs with p + d/2, angle pos * base^(-2p/d))
//    rotates keys by their position and queries by theirs (decode steps after
//    the context), so q·k depends on the distance between them.
//  * A few sink keys (the first tokens) that many queries hit strongly
//    (StreamingLLM's attention sinks).
//  * Local structure: a slowly drifting topic (an AR(1) process of correlation
//    length `topic_len` tokens) makes neighbouring keys alike (what Quest's
//    pages and Squeezed Attention's clusters exploit); values share it.
//  * Recency: queries align with the offset, which RoPE turns into a bonus for
//    the newest keys that decays with distance.
//  * Retrieval: some queries focus sharply on a few random far keys, so the
//    attention is sparse but not trivially "sinks + recent window".
//
// The generative model (per KV head; d = head_dim; pairs p < d/4 are "content"
// pairs (high frequency), pairs p >= d/4 are "offset" pairs (low frequency)):
//   raw key_t   = o + s ⊙ (sqrt(w) x_t + sqrt(1-w) z_t)  [+ sink_norm·sqrt(d)·u  if t < n_sinks]
//   key_t       = RoPE(raw key_t, t)
//   value_t     = mu_v + sqrt(w) x_t[perm] + sqrt(1-w) xi_t   (sinks: 0.1 xi_t, the "no-op" sink)
//   raw query   = m_g + a·o + e          (m_g, e on content pairs; a·o sets the recency bonus)
//   query       = RoPE(raw query, n + j) + sum_j delta_j · c_j
// where o is the offset (on offset pairs), s the per-dimension std (log-uniform
// over a `dim_spread` range), x_t the topic, z, xi white noise, u a random unit
// vector on the offset pairs orthogonal to o, m_g the OOD query mean of query head g (weighted to dims with small
// s), e the query noise. The last term plants sink and retrieval hits: c_j is
// the whitened direction of target key j, scaled to add exactly one logit to
// it (the sinks share one averaged direction), and the deltas are calibrated
// (a few Newton steps against a stratified estimate of the rest's softmax
// normaliser) so that the sinks and each far target get about their requested
// share of the attention. Scores are q·k / sqrt(d). The shares are reached
// only approximately, and not at all where physics forbids: any direction that
// lifts one key lifts the best of n other random keys by about sqrt(2 ln n / d)
// as much, so at head_dim 64 a far key hardly stands out of 20000 (at 128 it
// gets most of its share; measured in tests/test_synthetic.cpp).
//
// Deterministic for a seed, whatever the thread count: every block of rows and
// every query draws from its own counter-seeded random stream.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/attention_data.h"
#include "src/common/dtype.h"

namespace topkv {

struct SyntheticConfig {
  // ---- shapes
  int64_t n_keys = 100000;   // context length (keys per KV head)
  int head_dim = 128;        // even, >= 4
  int n_queries = 200;       // decode steps (queries at positions n_keys, n_keys + 1, ...)
  int group = 4;             // GQA group: query heads per KV head
  int kv_heads = 1;          // independent KV heads ("a layer")
  DType dtype = DType::F16;  // element type of the key/value stores
  uint64_t seed = 1;
  // ---- keys
  double key_offset = 2.0;    // |o| / sqrt(d): shared offset, on the low-frequency pairs
  double dim_spread = 8.0;    // max / min per-dimension std of the key noise (>= 1)
  double topic_len = 200.0;   // correlation length in tokens of the AR(1) topic (0 = no local structure)
  double topic_weight = 0.5;  // share of the key/value variance carried by the topic, in [0, 1]
  double rope_base = 10000.0; // RoPE base (Llama 3: 500000); 0 = no RoPE
  // ---- queries
  double query_shift = 2.0;   // |query mean| / sqrt(d), mostly in low-key-variance dims (0 = in distribution)
  double query_noise = 1.0;   // std of the query's random logit over keys
  double recency = 2.0;       // logit bonus of the newest keys over far ones (needs key_offset > 0)
  int n_sinks = 4;            // sink keys: positions 0 .. n_sinks-1
  double sink_norm = 3.0;     // extra norm of a sink key / sqrt(d)
  double sink_frac = 0.8;     // share of query heads that attend to the sinks
  double sink_mass = 0.3;     // about the attention share the sinks then get (together)
  double retrieval_frac = 0.3;  // share of query heads that retrieve far keys
  int retrieval_targets = 4;    // far keys each retrieving query focuses on
  double retrieval_mass = 0.5;  // about the attention share they then get (together)

  void validate() const;  // throws Error naming the bad field
  std::string describe() const;  // "n=100000 d=128 ..." one line, every field
};

// What was planted in one query (decode step j, query head g): lets tests and
// benchmarks check that the planted keys are found.
struct PlantedQuery {
  bool sink = false;             // aimed at the sinks
  std::vector<int64_t> targets;  // far keys it retrieves (empty: not a retrieval query)
};

struct SyntheticData {
  AttentionData data;                            // scale = 1/sqrt(head_dim)
  std::vector<std::vector<PlantedQuery>> planted;  // [kv_head][j * group + g]
};

// Generates cfg.kv_heads heads. n_threads 0 = all cores. `progress` draws a bar.
SyntheticData generate_synthetic(const SyntheticConfig& cfg, int n_threads = 0, bool progress = false);

// Keys (post-RoPE) and values of positions [t0, t0 + n) of KV head `head`
// (< cfg.kv_heads) of the data cfg describes, without queries: fp32
// token-major [n][head_dim] each, in keys / values. cfg.n_keys is the context
// length (sinks are its first n_sinks positions). The topic enters t0 from its
// stationary distribution, so rows from t0 > 0 are distributed like the same
// rows of a full generation (and t0 = 0 gives exactly generate_synthetic's);
// or from `topic` where it is given and not empty: the state a read ending at
// t0 left there. Reads that continue each other that way, each starting at a
// multiple of 65,536 (the generator's super-block), give the full
// generation's rows bit for bit. Used to fill a model's context without a
// prefill (bench/synthetic_fill.h).
void synthetic_key_values(const SyntheticConfig& cfg, int head, int64_t t0, int64_t n, float* keys, float* values,
                          int n_threads = 0, std::vector<float>* topic = nullptr);
inline constexpr int64_t kSyntheticSuperBlock = 65536;

// NeoX RoPE of one vector in place: pair (p, p + d/2) rotated by pos * base^(-2p/d).
// base <= 0 leaves x unchanged. inverse = true rotates by -pos.
void apply_rope(float* x, int dim, double pos, double base, bool inverse = false);

}  // namespace topkv
