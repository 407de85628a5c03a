// libFuzzer: the GGUF reader, then what a run reads from a file that parsed:
// the model hyperparameters, the tensor table and the tokenizer. The input is
// parsed where libFuzzer holds it (GgufFile::from_memory: the parser open()
// runs over a file's mapping), with no file written, opened or mapped per
// input; a read one byte past the input is a heap overflow ASan reports (in a
// mapping it would not be). open()'s own file handling is input-independent
// and tested in tests/test_gguf.cpp.
#include "src/model/gguf.h"
#include "src/model/model_config.h"
#include "src/model/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  TOPKV_FUZZ_BODY({
    auto g = topkv::GgufFile::from_memory(data, size, "fuzz.gguf");
    for (const auto& kv : g->metadata()) (void)kv.value_string();
    uint64_t sum = 0;
    for (const auto& t : g->tensors()) sum += t.data[0] + t.data[t.nbytes - 1];  // every tensor in the file
    (void)sum;
    try {
      topkv::ModelConfig c = topkv::read_model_config(*g);
      topkv::find_model_tensors(*g, c);
    } catch (const topkv::Error&) {
    }
    topkv::Tokenizer tok = topkv::Tokenizer::from_gguf(*g);
    const auto ids = tok.encode("Hello world, \xe2\x96\x81 12345 <start_of_turn>", true, true);
    (void)tok.decode(ids, true);
  });
  return 0;
}
