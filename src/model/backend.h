// The ops a transformer forward pass calls, behind one interface so that a
// CUDA backend can slot in beside the CPU one (src/model/cpu_backend.cpp).
// Ops are coarse (a whole norm over T rows, a whole attention over a chunk)
// so that a device backend launches few kernels per layer.
//
// Memory: every float* an op takes lives in the backend's memory (host memory
// for the CPU backend, device memory for a CUDA one) and comes from
// Backend::alloc; token ids and positions are host values. Weights are
// prepared once by Backend::prepare_weight and stay where the backend put
// them. Layouts are row-major and spelled out on each op:
//   activations  x[T][dim]               one row per token of the chunk
//   heads        q[T][n_head][head_dim]  (the output of the q projection as is)
//   weights      W[rows][cols]           cols contiguous = GGUF ne[0]; a
//                                        projection is W[out][in]
//   KV cache     see KvLayerCache below
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "src/common/dtype.h"
#include "src/common/error.h"
#include "src/model/ggml_types.h"
#include "src/model/kv_past.h"
#include "src/model/op_kinds.h"

namespace topkv {

// A block of backend memory; shared ownership so views can be copied freely.
struct Buffer {
  std::shared_ptr<void> mem;
  size_t bytes = 0;
  template <typename T> T* as() const { return static_cast<T*>(mem.get()); }
  float* f32() const { return as<float>(); }
};

// A weight as the backend holds it: rows x cols of `type`, row r at
// data + r * row_bytes. For `--weights f32` the backend dequantises at
// prepare time and `type` is F32; otherwise it references the mapped file.
// The CUDA backend's quantised weights keep their GGML type but split the
// blocks into planes (gpu/quant_units.h): row() does not apply to them, while
// bytes() is still the file's size of the rows.
struct Weight {
  std::string name;
  GgmlType type = GgmlType::F32;
  int64_t rows = 0, cols = 0;
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;
  std::shared_ptr<void> owned;  // set when the backend made its own copy
  const uint8_t* row(int64_t r) const { return data + (size_t)r * row_bytes; }
  size_t bytes() const { return (size_t)rows * row_bytes; }
};

// How prepare_weight keeps a matrix: the file's quantised blocks (every
// backend's default), or dequantised once at load to fp32 (the CPU backend) or
// fp16/bf16 (a device backend). A backend refuses the mode it has no use for.
enum class WeightMode { Quant, F16, F32 };
WeightMode parse_weight_mode(const std::string& s);  // "quant" | "f16" | "f32"; throws Error
const char* weight_mode_name(WeightMode m);
// Throws Error when `m` is not a mode of that backend (CUDA: quant, f16; CPU:
// quant, f32), naming the ones it has.
void check_weight_mode(WeightMode m, bool cuda);

// What a matmul does with its product before it stores it, so that a device
// backend fuses it into the same kernel (llama.cpp's fused bias and residual
// adds): y = x W^T (+ bias) (+ y, when accumulate: the residual stream).
struct MatmulEpilogue {
  const Weight* bias = nullptr;  // F32, 1 x w.rows, from prepare_weight; added to every token's row
  bool accumulate = false;       // add the product to what y holds instead of overwriting it
};

// One product of a group of products of the same input (Backend::matmul_group).
struct MatmulJob {
  const Weight* w = nullptr;
  float* y = nullptr;  // [T][w->rows]
  MatmulEpilogue ep;
};

// How the input of a group of products is formed from what the model holds,
// so that a device backend forms it (and quantises it for its GEMV) in one
// kernel instead of an RMSNorm, a residual add and a GLU apart:
//   1. when `add` is set, the residual stream x is updated first:
//        x[t] += add_norm ? rms_norm(add[t]) * add_norm : add[t]
//      (a post-norm block's output joining the residual: gemma3);
//   2. the products' input is rms_norm(x[t]) * norm when `norm` is set (a
//      pre-norm), act(x[t]) * up[t] when `up` is set (the FFN's GLU), else
//      x[t] as it is.
// `formed` [T][cols] is where the input goes when a backend needs it in memory
// (the CPU backend always; a device backend on quantised weights never); it
// may alias `add`, and x when `up` is set (the GLU is elementwise), never up.
// Callers must not read it afterwards.
struct MatmulInput {
  float* x = nullptr;               // [T][cols]; updated in place when add is set
  const float* add = nullptr;       // [T][cols]
  const Weight* add_norm = nullptr; // F32, cols values
  const Weight* norm = nullptr;     // F32, cols values
  const float* up = nullptr;        // [T][cols] (GLU)
  GluKind glu = GluKind::SiLU;
  float eps = 0.f;                  // of both norms
  float* formed = nullptr;          // [T][cols] scratch; needed when add_norm, norm or up is set
};

// Throws Error for a group matmul_group cannot run (no jobs, cols that
// differ, a formed input without scratch).
void check_matmul_group(const MatmulInput& in, std::span<const MatmulJob> jobs);

// RoPE of one layer. theta_i = freq_scale * pos * base^(-2i/n_rot) / factor_i
// for pair i < n_rot/2 (factor_i from `rope_freqs`, 1 when absent); dims past
// n_rot are left as they are. RopeStyle (the pairing): src/model/op_kinds.h.
struct RopeParams {
  RopeStyle style = RopeStyle::Interleaved;
  int n_rot = 0;
  float base = 10000.f;
  float freq_scale = 1.f;              // 1/factor of "linear" RoPE scaling
  const float* freq_factors = nullptr; // host, n_rot/2 values, or null
};

// KV cache of one layer: k and v each [n_kv_heads][capacity][head_dim] of
// `dtype`. Token position p lives in slot p % capacity, so a layer that keeps
// the whole context has capacity = context, and a sliding-window layer keeps
// a ring of capacity >= window + chunk - 1 (the chunk's keys are written
// before its queries attend, and the oldest key its first query needs must
// not be overwritten by its last token).
//
// in_host: k and v are host memory a device backend reaches over the bus
// (Backend::alloc_kv_host: pinned and device-mapped on CUDA). kv_write goes
// through a device staging copy and prefill attention streams the cache up
// in blocks (gpu/cuda_streamed_attention.cpp): a retrieval layer's prefill
// whose KV does not fit the GPU budget.
//
// A prefill ring (ModelOptions::host_kv_past): a retrieval layer's cache that
// keeps only the chunk being prefilled (capacity = max_chunk; in_host on a
// device backend). Positions before the chunk are read from `past`, the
// offload runtime's host stores that take each chunk as it is done
// (Model::set_kv_past), so the prefill holds no second copy of the context.
struct KvLayerCache {
  DType dtype = DType::F32;
  int n_kv_heads = 0, head_dim = 0;
  int64_t capacity = 0;
  Buffer k, v;
  bool in_host = false;
  bool ring = false;                   // a prefill ring: positions before the chunk are in `past`
  const KvPastSource* past = nullptr;  // set while a prefill can read them
  int layer = -1;                      // the model layer, for `past`
  size_t head_stride() const { return (size_t)capacity * head_dim; }  // elements
  size_t bytes() const { return 2 * (size_t)n_kv_heads * head_stride() * dtype_size(dtype); }
};
// A cache's shape without its memory (what every alloc_kv fills in); Error
// on a non-positive size.
inline KvLayerCache kv_cache_shape(int n_kv_heads, int head_dim, int64_t capacity, DType dtype) {
  TOPKV_CHECK(n_kv_heads > 0 && head_dim > 0 && capacity > 0,
              "a KV cache needs positive heads, head_dim and capacity, got {}, {}, {}", n_kv_heads, head_dim,
              capacity);
  KvLayerCache c;
  c.dtype = dtype, c.n_kv_heads = n_kv_heads, c.head_dim = head_dim, c.capacity = capacity;
  return c;
}

// Throws Error unless a chunk at pos0 can attend a ring's past: a source is
// set and holds every position before the chunk.
void check_ring_past(const KvLayerCache& c, int64_t pos0);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Whether alloc() and prepared weights are host memory the CPU may read.
  virtual bool host_memory() const { return true; }

  // ---- memory ---------------------------------------------------------------
  virtual Buffer alloc(size_t bytes) = 0;  // uninitialised
  virtual void to_host(const Buffer& src, size_t offset_bytes, void* dst, size_t bytes) = 0;
  virtual void from_host(const void* src, const Buffer& dst, size_t offset_bytes, size_t bytes) = 0;
  // A weight for the ops below from `src` (which references the mapped file
  // and must outlive the returned weight when it is kept quantised).
  virtual Weight prepare_weight(const Weight& src, WeightMode mode) = 0;
  // Bytes prepare_weight(src, mode) would take (the model's memory report),
  // and the mode this backend offers beside `mode` ("--weights X would take
  // Y"). Defaults, the CPU's: quant = the file's bytes (mapped), f32 = 4 bytes
  // a value; quant <-> f32.
  virtual size_t prepared_weight_bytes(const Weight& src, WeightMode mode) const;
  virtual WeightMode other_weight_mode(WeightMode mode) const;
  virtual KvLayerCache alloc_kv(int n_kv_heads, int head_dim, int64_t capacity, DType dtype) = 0;
  // A cache in host memory (KvLayerCache::in_host) for a device backend whose
  // memory cannot hold it; the CPU backend's caches are host memory already.
  virtual KvLayerCache alloc_kv_host(int n_kv_heads, int head_dim, int64_t capacity, DType dtype) {
    return alloc_kv(n_kv_heads, head_dim, capacity, dtype);
  }
  // Bytes alloc and alloc_kv may still take (a device backend: its budget
  // less what it holds, or the device's free memory); -1: no limit known.
  virtual int64_t memory_left() const { return -1; }

  // ---- ops (out may alias x where noted) ------------------------------------
  // out[t][:] = scale * dequant(table.row(ids[t])), t < T. ids are host values.
  virtual void embed(const Weight& table, const int32_t* ids, int T, float scale, float* out) = 0;
  // RMSNorm of `rows` rows of `dim`: out = x / sqrt(mean(x^2) + eps) * w
  // (w an F32 weight of 1 x dim). QK-norm is the same op with rows = T*heads,
  // dim = head_dim. out may alias x.
  virtual void rms_norm(const float* x, const Weight& w, int64_t rows, int dim, float eps, float* out) = 0;
  // In place on x[T][n_heads][head_dim]; token t is at position pos0 + t.
  virtual void rope(float* x, int T, int n_heads, int head_dim, int64_t pos0, const RopeParams& p) = 0;
  // y[T][w.rows] = x[T][w.cols] * W^T, then the epilogue. y must not alias x.
  virtual void matmul(const float* x, const Weight& w, int T, float* y, const MatmulEpilogue& ep) = 0;
  void matmul(const float* x, const Weight& w, int T, float* y) { matmul(x, w, T, y, MatmulEpilogue{}); }
  // The products of one input x[T][cols] by several weights of the same cols
  // (q, k, v; gate, up): what `matmul` does for each job, in order. A device
  // backend may run them as one launch over one quantisation of x (the CUDA
  // backend on quantised weights). No y may alias x or another job's y.
  // Throws Error when the weights' cols differ. The input is formed as
  // MatmulInput says (a plain x: MatmulInput{x}). Default: the input formed
  // by rms_norm / add / glu into `formed`, then matmul per job.
  virtual void matmul_group(const MatmulInput& in, int T, std::span<const MatmulJob> jobs);
  void matmul_group(const float* x, int T, std::span<const MatmulJob> jobs) {
    matmul_group(MatmulInput{const_cast<float*>(x)}, T, jobs);
  }
  // out[i] = act(gate[i]) * up[i], i < n. out may alias gate or up.
  virtual void glu(GluKind kind, const float* gate, const float* up, int64_t n, float* out) = 0;
  // y[i] += x[i], i < n.
  virtual void add(const float* x, int64_t n, float* y) = 0;
  // Writes k, v [T][n_kv_heads][head_dim] of positions pos0.. into the cache.
  virtual void kv_write(KvLayerCache& cache, const float* k, const float* v, int T, int64_t pos0) = 0;
  // The end of a layer's attention input, in place on q[T][n_head][head_dim]
  // and k[T][n_kv][head_dim]: QK-norm (an RMSNorm over each head with q_norm /
  // k_norm, when given), then RoPE at positions pos0..; when `cache` is given,
  // the rotated k and v [T][n_kv][head_dim] are written into it (kv_write).
  // This default calls rms_norm, rope and kv_write; a device backend runs it
  // as one kernel (gpu/kernels_attention_prologue.cu).
  virtual void attention_prologue(float* q, float* k, const float* v, int T, int n_head, int n_kv, int head_dim,
                                  const Weight* q_norm, const Weight* k_norm, float eps, int64_t pos0,
                                  const RopeParams& rope, KvLayerCache* cache);
  // Causal attention of q[T][n_head][head_dim] (positions pos0..pos0+T-1,
  // already in the cache) over the cache: query at p sees keys at
  // max(0, p - window + 1) .. p (window 0 = no limit). GQA: query head h reads
  // KV head h / (n_head / n_kv_heads). Scores are scale * q.k, softmax in fp32.
  // out[T][n_head][head_dim]; must not alias q.
  virtual void attention(const float* q, int T, int n_head, int64_t pos0, const KvLayerCache& cache,
                         int64_t window, float scale, float* out) = 0;

  // ---- recorded decode steps (optional) -------------------------------------
  // A device backend may record the ops of one decode token and replay them
  // for every later token: one CUDA graph launch instead of ~300 kernel
  // launches. Between begin_recording and end_recording ops are recorded, not
  // run; embed, rope, kv_write and attention must then be called for T = 1 at
  // position `pos` (embed with the id `token`), and what they record reads the
  // position and the id from the backend's step state, which set_step writes
  // before each replay. Every pointer an op was given must stay valid while
  // the recording lives. The CPU backend records nothing: can_record() is
  // false and the others throw.
  class Recording {
   public:
    virtual ~Recording() = default;
  };
  virtual bool can_record() const { return false; }
  virtual void begin_recording(int64_t pos, int32_t token);
  virtual std::unique_ptr<Recording> end_recording();
  virtual void cancel_recording() noexcept {}  // drops a recording begun (after an error); no-op otherwise
  virtual void set_step(int64_t pos, int32_t token);
  virtual void replay(const Recording& r);
};

struct CpuBackendOptions {
  int threads = 0;  // OpenMP threads; 0 keeps the OpenMP default
};
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& opt = {});

}  // namespace topkv
