// Model::decode: one token at a time. On a backend that cannot record (the
// CPU) a step is a one-token prefill, op by op. On one that can (CUDA), the
// step is recorded once and replayed: ~300 kernel launches become one graph
// launch per segment, and only the position and token id are uploaded per
// step (Backend::set_step).
//
// Segments: an attention override (the offloaded top-k runtime) does host
// work in the middle of its layers' attention, which a recording cannot
// hold. The step is therefore recorded as segments that end right before
// each overridden layer's attention:
//   replay seg 0 -> override attention (layer a) -> replay seg 1 -> ... -> replay seg n
// A recording stays valid for every position (the backend reads positions
// from its step state, and its decode attention plan depends on the cache
// geometry only); it is made again when the set of overridden layers changes
// or a cache is released. Before recording a configuration the model runs it
// op by op once, so that every kernel is loaded and every work space sized
// outside the capture.
#include <algorithm>

#include "src/common/error.h"
#include "src/model/model.h"

namespace topkv {

std::vector<float> Model::decode(int32_t token) {
  if (!(opt_.record_decode && be_.can_record())) {
    last_replayed_ = false;
    return prefill(std::span<const int32_t>(&token, 1), 1);  // exactly the op-by-op path
  }
  decode_step(token);
  std::vector<float> logits((size_t)cfg_.n_vocab);
  be_.to_host(logits_, 0, logits.data(), logits.size() * sizeof(float));
  return logits;
}

const float* Model::decode_on_backend(int32_t token) {
  decode_step(token);
  return logits_.f32();
}

std::vector<int> Model::overridden_layers() const {
  std::vector<int> ov;
  if (override_)
    for (int il = 0; il < cfg_.n_layer; ++il)
      if (override_->overrides(il)) ov.push_back(il);
  return ov;
}

void Model::decode_step(int32_t token) {
  TOPKV_CHECK(n_past_ + 1 <= opt_.n_ctx, "the context is full: {} tokens in the cache + 1 new exceed the context "
              "size {}; raise the context size (-c)", n_past_, opt_.n_ctx);
  TOPKV_CHECK(token >= 0 && token < cfg_.n_vocab, "token id {} is outside the vocabulary (0..{})",
              token, cfg_.n_vocab - 1);
  last_replayed_ = false;
  const bool record = opt_.record_decode && be_.can_record();
  const std::vector<int> ov = record ? overridden_layers() : std::vector<int>{};
  if (record && !(recorded_ && recorded_->overridden == ov && recorded_->kv_epoch == kv_epoch_)) {
    recorded_.reset();
    if (warm_ && warm_layers_ == ov && warm_epoch_ == kv_epoch_) {
      record_step(ov, token);
    } else {  // first step of this configuration: op by op (below), recorded from the next one
      warm_ = true, warm_layers_ = ov, warm_epoch_ = kv_epoch_;
    }
  }
  if (!record || !recorded_) {
    forward_chunk(&token, 1, false, nullptr);
    project_logits(0, 1);
    return;
  }
  be_.set_step(n_past_, token);
  const StepRecording& r = *recorded_;
  for (size_t s = 0; s < r.segments.size(); ++s) {
    be_.replay(*r.segments[s]);
    if (s < r.overridden.size()) overridden_attention(r.overridden[s], 1);
  }
  ++n_past_;
  last_replayed_ = true;
}

// Records the step of `token` at n_past_ (nothing runs); decode_step replays it.
void Model::record_step(const std::vector<int>& overridden, int32_t token) {
  auto rec = std::make_unique<StepRecording>();
  rec->overridden = overridden, rec->kv_epoch = kv_epoch_;
  // Ends an open recording if an op throws, so the backend is usable after
  // (declared after rec: the capture closes before finished segments go).
  struct Guard {
    Backend& be;
    bool open = false;
    ~Guard() {
      if (open) be.cancel_recording();
    }
  } guard{be_};
  const auto begin = [&] {
    be_.begin_recording(n_past_, token);
    guard.open = true;
  };
  const auto end = [&] {
    guard.open = false;
    rec->segments.push_back(be_.end_recording());
  };
  begin();
  be_.embed(token_embd_, &token, 1, cfg_.embed_scale, x_.f32());
  for (int il = 0; il < cfg_.n_layer; ++il) {
    const bool ov = std::binary_search(overridden.begin(), overridden.end(), il);
    attention_input(il, 1, /*write_cache=*/!ov);
    if (ov) {
      end();  // the override's attention runs here, between two replays
      begin();
    } else {
      dense_attention(il, 1);
    }
    attention_output_ffn(il, 1);
  }
  project_logits(0, 1);
  end();
  recorded_ = std::move(rec);
  ++steps_recorded_;
}

}  // namespace topkv
