// libFuzzer: the policy JSON of --config files and pack manifests. A config
// that is accepted must be valid and survive to_json / apply_json unchanged.
#include <cstdlib>

#include "offload/policy.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  TOPKV_FUZZ_BODY({
    topkv::OffloadPolicy p;
    p.apply_json(text, "fuzz.json");
    p.validate();
    topkv::OffloadPolicy q;
    q.apply_json(p.to_json(), "round trip");
    if (q.to_json() != p.to_json()) std::abort();
  });
  return 0;
}
