// The CUDA backend class (internal: gpu/cuda_backend.h is the public
// surface). Host code: checks every op's arguments as the CPU backend does,
// then queues the kernels of gpu/cuda_kernels.h on its stream.
// CUDA builds only.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <mutex>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "gpu/cuda_backend.h"
#include "gpu/cuda_kernels.h"
#include "gpu/cuda_memory.h"
#include "gpu/cuda_quant.h"

namespace topkv::cuda {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& opt);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  bool host_memory() const override { return false; }
  Buffer alloc(size_t bytes) override;
  Buffer alloc(size_t bytes, MemKind kind, std::string_view what);  // counted as `kind`, named in errors
  void to_host(const Buffer& src, size_t offset_bytes, void* dst, size_t bytes) override;
  void from_host(const void* src, const Buffer& dst, size_t offset_bytes, size_t bytes) override;
  Weight prepare_weight(const Weight& src, WeightMode mode) override;  // gpu/cuda_weights.cpp
  size_t prepared_weight_bytes(const Weight& src, WeightMode mode) const override;
  WeightMode other_weight_mode(WeightMode mode) const override;
  KvLayerCache alloc_kv(int n_kv_heads, int head_dim, int64_t capacity, DType dtype) override;
  // Pinned, device-mapped host memory (gpu/cuda_streamed_attention.cpp).
  KvLayerCache alloc_kv_host(int n_kv_heads, int head_dim, int64_t capacity, DType dtype) override;
  int64_t memory_left() const override;

  void embed(const Weight& table, const int32_t* ids, int T, float scale, float* out) override;
  void rms_norm(const float* x, const Weight& w, int64_t rows, int dim, float eps, float* out) override;
  void rope(float* x, int T, int n_heads, int head_dim, int64_t pos0, const RopeParams& p) override;
  using Backend::matmul;
  void matmul(const float* x, const Weight& w, int T, float* y, const MatmulEpilogue& ep) override;
  // gpu/cuda_quant_matmul.cpp: one quantisation of x and one GEMV launch per
  // kQuantGroupMaxJobs jobs when every weight is quantised and T <= 8.
  using Backend::matmul_group;
  void matmul_group(const MatmulInput& in, int T, std::span<const MatmulJob> jobs) override;
  void glu(GluKind kind, const float* gate, const float* up, int64_t n, float* out) override;
  void add(const float* x, int64_t n, float* y) override;
  void kv_write(KvLayerCache& cache, const float* k, const float* v, int T, int64_t pos0) override;
  void attention_prologue(float* q, float* k, const float* v, int T, int n_head, int n_kv, int head_dim,
                          const Weight* q_norm, const Weight* k_norm, float eps, int64_t pos0, const RopeParams& rope,
                          KvLayerCache* cache) override;
  void attention(const float* q, int T, int n_head, int64_t pos0, const KvLayerCache& cache, int64_t window,
                 float scale, float* out) override;

  // ---- recorded decode steps: CUDA graphs (gpu/cuda_graphs.cpp) -------------
  // Capture on the backend's stream (relaxed mode: the work space a recording
  // owns is allocated while it captures); replay = one cudaGraphLaunch.
  // TOPKV_CUDA_GRAPHS=0 in the environment makes can_record() false, so the
  // model runs decode eagerly (for comparisons).
  bool can_record() const override { return graphs_enabled_; }
  void begin_recording(int64_t pos, int32_t token) override;
  std::unique_ptr<Recording> end_recording() override;
  void cancel_recording() noexcept override;
  void set_step(int64_t pos, int32_t token) override;
  void replay(const Recording& r) override;
  bool recording() const { return rec_ != nullptr; }

  // ---- for the sampler, benchmarks and tests --------------------------------
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  float* cublas_scalars() const { return scalars_; }  // see cuda::gemm
  int sm_count() const { return sm_count_; }
  int q8_terms() const { return q8_terms_; }  // the decode products' activation terms (quant_units.h)
  // The T = 1 attention kernel (TOPKV_DECODE_ATTN at construction, v3 by
  // default); tests and benchmarks switch it to run both over one sweep.
  DecodeKernel decode_kernel() const { return decode_kernel_; }
  void set_decode_kernel(DecodeKernel k) { decode_kernel_ = k; }
  const std::string& device_name() const { return device_name_; }
  CudaMemoryUse memory_use() const { return mem_.use(); }
  void synchronize();  // waits for every queued op; reports a fault of any
  // Backend-owned device work space, one region per purpose, grown as needed
  // (growing waits for queued work first). Valid until the next call for the
  // same purpose.
  // Dequant holds a quantised weight dequantised for the prefill GEMM: grown
  // by prepare_weight to the largest quantised matrix, at most
  // dequant_tile_bytes (kDequantScratchMax unless a test asks for small
  // tiles; larger matrices are multiplied in row tiles).
  enum class Scratch : int { Ids, Cast, Attention, Sampling, KvStage, Stream, QuantX, Dequant, Count };
  static constexpr size_t kDequantScratchMax = size_t{256} << 20;
  void set_dequant_tile_bytes(size_t bytes) { dequant_tile_bytes_ = bytes; }
  // Keys per block a streamed attention copies up for this cache (a
  // multiple of kKeyRangeAlign; ~stream_stage_bytes of K and V per block,
  // 64 MiB unless a test asks for small blocks to cross many block edges).
  int64_t stream_block_keys(const KvLayerCache& c) const;
  void set_stream_stage_bytes(size_t bytes) { stream_stage_bytes_ = bytes; }
  void* scratch(Scratch which, size_t bytes);

 private:
  // The cache an op was given: this backend's device memory, or (in_host)
  // pinned host memory from alloc_kv_host.
  void check_cache(const KvLayerCache& c, const char* op) const;
  // kv_write and prefill attention over an in_host cache
  // (gpu/cuda_streamed_attention.cpp): k, v through a device staging copy;
  // the keys go up in blocks of stream_block_keys on a copy stream, two
  // stages in flight, each block a key-range call merged into one running
  // partial per row (AttentionArgs::key_begin, acc_m).
  void kv_write_host(KvLayerCache& c, const float* k, const float* v, int T, int64_t pos0);
  void streamed_attention(const float* q, int T, int n_head, int64_t pos0, const KvLayerCache& c, int64_t window,
                          float scale, float* out);
  // RoPE's angle per position of each pair, in double, as the CPU backend has it.
  static void rope_inv_freq(const RopeParams& p, int head_dim, double* inv_freq);
  // The device weight a matrix op may use: uploaded by prepare_weight.
  void check_device_weight(const Weight& w, const char* op) const;
  // The epilogue's bias as a device pointer (null when none), checked.
  const float* epilogue_bias(const Weight& w, const MatmulEpilogue& ep, const char* op) const;
  // Quantised weights (gpu/cuda_quant_matmul.cpp): the GEMV of a group
  // (T <= kQuantGemvMaxTokens), and the prefill (dequantised row tiles to
  // fp16, bf16 for weights in wide_weights_, times cuBLAS).
  // x quantised (or formed and quantised) into the QuantX scratch, then the
  // jobs' GEMV launches over it.
  void quant_gemv_group(const MatmulInput& in, int T, std::span<const MatmulJob> jobs);
  MmvqKernel mmvq_kernel_ = MmvqKernel::Auto;  // TOPKV_MMVQ=old|new|auto, read at construction
  int q8_terms_ = 2;  // activation terms of the GEMV (quant_units.h): CudaBackendOptions::q8_terms
  void quant_prefill(const float* x, const Weight& w, int T, float* y, const MatmulEpilogue& ep);
  Weight upload_quant(const Weight& src);  // gpu/cuda_weights.cpp
  // While recording: the op must be a T = 1 op at the recorded position, and
  // gets the device position to read (null when not recording).
  const int64_t* step_pos(const char* op, int T, int64_t pos);
  const int32_t* step_token_dev() const;  // the step state's token id (device)
  void init_step_state();  // gpu/cuda_graphs.cpp

  int device_ = 0, sm_count_ = 0;
  DecodeKernel decode_kernel_ = DecodeKernel::V3;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceMemory mem_;
  struct ScratchRegion {
    std::shared_ptr<void> mem;
    size_t bytes = 0;
  };
  ScratchRegion scratch_[(int)Scratch::Count];
  std::shared_ptr<void> scalars_mem_;  // 4 floats for cuBLAS: absmax, alpha, beta = 0, spare
  float* scalars_ = nullptr;
  std::vector<int32_t> ids_staging_;  // pageable copy of embed's ids (see embed)
  // Quantised weights whose values may pass fp16's range (a bound from the
  // block scales): their prefill dequantises to bf16. Keys leave the set
  // when the weight's memory is freed (shared with those deleters).
  struct WideWeights {
    std::mutex mu;
    std::unordered_set<const void*> set;
  };
  std::shared_ptr<WideWeights> wide_weights_ = std::make_shared<WideWeights>();
  std::shared_ptr<void> bounce_;      // pinned staging of mid-sized to_host copies (logits)

  // Step state of recorded decode steps: the device copy the recorded kernels
  // read, its pinned host source, and an event that says the last upload has
  // read the source (set_step waits for it before rewriting).
  struct StepState {
    int64_t pos;
    int32_t token;
    int32_t pad;
  };
  bool graphs_enabled_ = true;
  std::shared_ptr<void> step_dev_mem_, step_host_mem_;
  StepState *step_dev_ = nullptr, *step_host_ = nullptr;
  cudaEvent_t step_uploaded_ = nullptr;
  // The capture in progress: the step it was begun for, and the work space
  // its ops were given (owned by the recording, never regrown under it).
  struct RecordingState {
    int64_t pos = 0;
    int32_t token = 0;
    ScratchRegion regions[(int)Scratch::Count];
    std::vector<std::shared_ptr<void>> owned;
  };
  std::unique_ptr<RecordingState> rec_;
  // Streamed attention: its copy stream and events (made on first use):
  // ready (the host cache is written), copied[stage], consumed[stage].
  cudaStream_t copy_stream_ = nullptr;
  size_t stream_stage_bytes_ = size_t{64} << 20;
  size_t dequant_tile_bytes_ = kDequantScratchMax;
  cudaEvent_t stream_ev_[5] = {};
};

// `be` as the CUDA backend; Error naming `who` (what needs it) otherwise.
CudaBackend& as_cuda_backend(Backend& be, const char* who);

}  // namespace topkv::cuda
