// libFuzzer target for expar serve's request bodies (parse_completion_request), completions and chat, with
// the byte codec. Built and run by `scripts/fuzz SECONDS openai_request` with ASan and UBSan. An input either
// fails with ApiError (a 4xx the client sees; anything else escaping is a bug, and libFuzzer reports the
// uncaught exception), or it is accepted, and then what the scheduler gets must be in range.
//
// With EXPAR_FUZZ_WRITE_SEEDS=<dir> set, the binary instead writes a seed corpus of valid bodies and exits.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "expar/serve/api_error.hpp"
#include "expar/serve/openai_request.hpp"

namespace {

using namespace expar::serve;

[[noreturn]] void invariant_broken(const char* what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
  std::abort();
}

void write_seeds(const char* dir) {
  const char* bodies[] = {
      R"({"prompt": "hello", "max_tokens": 5, "temperature": 0})",
      R"({"model": "m", "prompt": [1, 2, 3], "max_tokens": 3, "top_p": 0.9, "top_k": 5, "seed": 7, "stop": ["a", "bc"]})",
      R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": true}, "n": 1, "logprobs": false})",
      R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4})",
      R"({"messages": [{"role": "system", "content": [{"type": "text", "text": "be brief"}]}]})",
  };
  int i = 0;
  for (const char* b : bodies) std::ofstream(std::string(dir) + "/seed" + std::to_string(i++)) << b;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("EXPAR_FUZZ_WRITE_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const expar::infer::ByteCodec codec;
  const ModelLimits limits{"m", 256, 64};
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {false, true}) {
    try {
      const CompletionParams p = parse_completion_request(body, chat, chat ? nullptr : &codec, limits);
      if (p.prompt.empty()) invariant_broken("accepted an empty prompt");
      for (int32_t t : p.prompt)
        if (t < 0 || t >= limits.vocab) invariant_broken("accepted a token outside the vocabulary");
      if (p.max_tokens < 1) invariant_broken("accepted max_tokens < 1");
      if (!std::isfinite(p.sampling.temperature) || p.sampling.temperature < 0)
        invariant_broken("temperature");
      if (!(p.sampling.top_p > 0 && p.sampling.top_p <= 1)) invariant_broken("top_p");
      if (p.sampling.top_k < 0) invariant_broken("top_k");
      for (const std::string& s : p.stop)
        if (s.empty()) invariant_broken("accepted an empty stop string");
    } catch (const ApiError& e) {
      if (e.status() < 400 || e.status() >= 500) invariant_broken("a malformed body must be a 4xx");
    }
  }
  return 0;
}
