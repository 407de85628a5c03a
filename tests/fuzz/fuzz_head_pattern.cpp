// libFuzzer: the DuoAttention head-pattern TSV. The first 3 bytes pick the
// layer count, KV heads and threshold/sparsity the text is parsed against.
#include "offload/head_pattern.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const int layers = 1 + data[0] % 40, heads = 1 + data[1] % 16;
  const double threshold = data[2] / 255.0, sparsity = data[2] & 1 ? -1.0 : data[2] / 255.0;
  const std::string text(reinterpret_cast<const char*>(data + 3), size - 3);
  TOPKV_FUZZ_BODY({
    topkv::HeadPattern p = topkv::parse_head_pattern(text, "fuzz.tsv", layers, heads, threshold, sparsity);
    (void)p;
  });
  return 0;
}
