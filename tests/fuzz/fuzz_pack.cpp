// libFuzzer: the context-pack container (safetensors header, topkv metadata,
// checksum table), the manifest's policy and every tensor read back. Built
// with TOPKV_FUZZ_SKIP_CHECKSUMS so mutants get past the checksums. The input
// is read where libFuzzer holds it (the readers over memory: the same parsers
// the file readers run over their mappings), with no file written, opened or
// mapped per input; a read past the input is a heap overflow ASan reports, and
// copy-on-write views are heap copies it bounds too. The file readers' own
// open / mmap / copy-on-write mapping is input-independent and tested in
// tests/test_safetensors.cpp and tests/test_context_pack.cpp.
#include "offload/pack_file.h"
#include "offload/policy.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = "fuzz.tkv";
  TOPKV_FUZZ_BODY({
    topkv::PackReader r(data, size, path);
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
