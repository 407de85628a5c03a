// Recorded decode steps of the CUDA backend (Backend::begin_recording ...):
// stream capture into a CUDA graph, replayed with one cudaGraphLaunch.
//
// What makes a captured step valid for later tokens:
//   - per-step values come from the step state in device memory (position,
//     token id), uploaded by set_step before each replay; the kernels that use
//     them (embed, rope, kv_write, decode attention) read them there;
//   - decode attention's plan depends on the cache geometry only (gpu/
//     kernels_attention_decode.cu), never on the position;
//   - work space handed out while recording belongs to the recording (the
//     backend's own scratch regions may be regrown and freed by later eager
//     ops; a graph must never point into them).
// Capture runs in relaxed mode, because that work space is allocated
// (cudaMalloc) while the capture is open.
#ifdef TOPKV_HAVE_CUDA
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_check.h"

namespace topkv::cuda {

namespace {

class CudaRecording final : public Backend::Recording {
 public:
  CudaRecording(cudaGraphExec_t exec, cudaStream_t stream, std::vector<std::shared_ptr<void>> owned,
                size_t kernel_nodes)
      : exec_(exec), stream_(stream), owned_(std::move(owned)), kernel_nodes_(kernel_nodes) {}
  ~CudaRecording() override {
    // A replay still in flight may use the work space freed below.
    cudaStreamSynchronize(stream_);
    cudaGraphExecDestroy(exec_);
  }
  cudaGraphExec_t exec() const { return exec_; }
  cudaStream_t stream() const { return stream_; }
  size_t kernel_nodes() const { return kernel_nodes_; }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  std::vector<std::shared_ptr<void>> owned_;
  size_t kernel_nodes_;
};

// Kernel nodes of a captured graph (cuBLAS's and ours alike).
size_t count_kernel_nodes(cudaGraph_t graph) {
  size_t n = 0;
  TOPKV_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) TOPKV_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  size_t kernels = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    TOPKV_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    kernels += type == cudaGraphNodeTypeKernel;
  }
  return kernels;
}

}  // namespace

void CudaBackend::init_step_state() {
  const char* env = std::getenv("TOPKV_CUDA_GRAPHS");
  graphs_enabled_ = !(env && std::strcmp(env, "0") == 0);
  step_dev_mem_ = mem_.alloc(sizeof(StepState), MemKind::Scratch, "decode step state");
  step_dev_ = static_cast<StepState*>(step_dev_mem_.get());
  void* host = nullptr;
  TOPKV_CUDA_CHECK(cudaMallocHost(&host, sizeof(StepState)));
  step_host_mem_ = std::shared_ptr<void>(host, [](void* p) { cudaFreeHost(p); });
  step_host_ = static_cast<StepState*>(host);
  *step_host_ = StepState{0, 0, 0};
  TOPKV_CUDA_CHECK(cudaEventCreateWithFlags(&step_uploaded_, cudaEventDisableTiming));
  TOPKV_CUDA_CHECK(cudaMemsetAsync(step_dev_, 0, sizeof(StepState), stream_));
}

const int64_t* CudaBackend::step_pos(const char* op, int T, int64_t pos) {
  if (!rec_) return nullptr;
  TOPKV_CHECK(T == 1 && pos == rec_->pos, "{} while recording a decode step must run 1 token at position {}, got {} "
              "at {}", op, rec_->pos, T, pos);
  return reinterpret_cast<const int64_t*>(reinterpret_cast<const char*>(step_dev_) + offsetof(StepState, pos));
}

const int32_t* CudaBackend::step_token_dev() const {
  return reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(step_dev_) + offsetof(StepState, token));
}

void CudaBackend::begin_recording(int64_t pos, int32_t token) {
  TOPKV_CHECK(graphs_enabled_, "decode-step recording is turned off (TOPKV_CUDA_GRAPHS=0); run the ops directly");
  TOPKV_CHECK(!rec_, "begin_recording: a recording is already open; end or cancel it first");
  TOPKV_CHECK(pos >= 0, "begin_recording at negative position {}", pos);
  auto st = std::make_unique<RecordingState>();
  st->pos = pos, st->token = token;
  TOPKV_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  rec_ = std::move(st);
}

std::unique_ptr<Backend::Recording> CudaBackend::end_recording() {
  TOPKV_CHECK(rec_, "end_recording without begin_recording");
  std::unique_ptr<RecordingState> st = std::move(rec_);
  cudaGraph_t graph = nullptr;
  TOPKV_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  size_t kernels = 0;
  try {
    kernels = count_kernel_nodes(graph);
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  TOPKV_CUDA_CHECK(e);
  auto r = std::make_unique<CudaRecording>(exec, stream_, std::move(st->owned), kernels);
  TOPKV_CUDA_CHECK(cudaGraphUpload(exec, stream_));  // the first replay then costs what the others do
  return r;
}

void CudaBackend::cancel_recording() noexcept {
  if (!rec_) return;
  rec_.reset();
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // an invalidated capture leaves its error behind; it was reported already
}

void CudaBackend::set_step(int64_t pos, int32_t token) {
  TOPKV_CHECK(!rec_, "set_step while recording: the step state is written between replays");
  TOPKV_CHECK(pos >= 0, "set_step at negative position {}", pos);
  // The previous upload must have read the pinned source before it changes.
  TOPKV_CUDA_CHECK(cudaEventSynchronize(step_uploaded_));
  step_host_->pos = pos, step_host_->token = token;
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(step_dev_, step_host_, sizeof(StepState), cudaMemcpyHostToDevice, stream_));
  TOPKV_CUDA_CHECK(cudaEventRecord(step_uploaded_, stream_));
}

void CudaBackend::replay(const Recording& r) {
  const auto* cr = dynamic_cast<const CudaRecording*>(&r);
  TOPKV_CHECK(cr && cr->stream() == stream_, "replay: the recording was not made by this CUDA backend");
  TOPKV_CHECK(!rec_, "replay while recording");
  TOPKV_CUDA_CHECK(cudaGraphLaunch(cr->exec(), stream_));
  launch_counter().fetch_add(cr->kernel_nodes(), std::memory_order_relaxed);
}

}  // namespace topkv::cuda
#endif  // TOPKV_HAVE_CUDA
