// libFuzzer: the request bodies of `topkv serve` (src/server/openai_api.h),
// as completions and as chat. parse_request's contract is that bad input is
// an ApiError with a 4xx status and nothing else: any other exception, or an
// accepted request whose fields break the documented ranges, aborts.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "src/server/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {false, true}) {
    try {
      const topkv::server::ParsedRequest r = topkv::server::parse_request(body, chat);
      if (r.chat != chat) std::abort();
      if (chat && r.messages.empty()) std::abort();  // a chat request has turns
      if (r.max_tokens && *r.max_tokens < 0) std::abort();
      if (r.temperature && !std::isfinite(*r.temperature)) std::abort();
      if (r.top_p && !std::isfinite(*r.top_p)) std::abort();
    } catch (const topkv::server::ApiError& e) {
      if (e.status < 400 || e.status >= 500) std::abort();
      (void)topkv::server::json_text(e.body());  // the error body as the server sends it
    } catch (const std::exception& e) {
      std::fprintf(stderr, "parse_request threw something else than ApiError: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
