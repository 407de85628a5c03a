// libFuzzer: the context-pack container (safetensors header, topkv metadata,
// checksum table), the manifest's policy and every tensor read back. Built
// with TOPKV_FUZZ_SKIP_CHECKSUMS so mutants get past the checksums.
#include "offload/pack_file.h"
#include "offload/policy.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static topkv::fuzz::MemFile file;
  const std::string& path = file.write(data, size);
  TOPKV_FUZZ_BODY({
    topkv::PackReader r(path);
    if (r.meta().contains("policy")) {
      topkv::OffloadPolicy p;
      p.apply_json(r.meta().at("policy").dump(), path);
    }
    r.verify_all(false);
    for (const topkv::TensorInfo& t : r.tensors()) {
      if (t.dtype == topkv::StDType::U8 && t.shape.size() == 1) r.blob(t.name);
      if (t.nbytes() == 0) continue;
      auto view = r.tensor_copy_on_write(t.name, t.dtype, t.shape);
      view.data[0] ^= 1;  // private: never reaches the file
      (void)r.tensor(t.name, t.dtype, t.shape)[t.nbytes() - 1];
    }
  });
  return 0;
}
