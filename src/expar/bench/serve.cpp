#include "expar/bench/serve.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "expar/core/error.hpp"
#include "expar/core/rng.hpp"

namespace expar::bench {
namespace {

using serve::Clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

struct Sample {
  double ttft = 0.0, tpot = 0.0;
  int64_t tokens = 0;
};

// Runs one request to its end; its time to first token and mean time per output token.
Sample run_request(serve::Scheduler& scheduler, const ServeBenchOptions& o, int64_t vocab, uint64_t stream) {
  serve::GenerationRequest r;
  r.prompt.resize(static_cast<size_t>(o.prompt_tokens));
  for (size_t i = 0; i < r.prompt.size(); ++i)
    r.prompt[i] = static_cast<int32_t>(random_u32(o.seed, stream, i) % static_cast<uint32_t>(vocab));
  r.max_tokens = o.generated_tokens;
  r.sampling.temperature = 0.0;
  std::shared_ptr<serve::RequestState> s = scheduler.submit(std::move(r));
  size_t seen = 0;
  while (!s->finished() || s->generated() > seen) seen += s->wait_tokens(seen).size();
  EXPAR_CHECK(s->finish_reason() == serve::FinishReason::Length, "bench request ended early ({}): {}",
              serve::finish_reason_name(s->finish_reason()), s->error());
  Sample out;
  out.tokens = static_cast<int64_t>(s->generated());
  out.ttft = seconds_between(s->arrived, *s->first_token_at);
  if (out.tokens > 1)
    out.tpot = seconds_between(*s->first_token_at, s->last_token_at) / static_cast<double>(out.tokens - 1);
  return out;
}

}  // namespace

ServeBenchResult run_serve_bench(const ServeBenchOptions& o) {
  EXPAR_CHECK(o.prompt_tokens >= 1 && o.generated_tokens >= 2,
              "--prompt-tokens {} must be >= 1 and --tokens {} >= 2", o.prompt_tokens, o.generated_tokens);
  EXPAR_CHECK(!o.concurrency.empty(), "--concurrency needs at least one level");
  for (int c : o.concurrency) EXPAR_CHECK(c >= 1 && c <= 4096, "--concurrency {} must be in [1, 4096]", c);
  EXPAR_CHECK(o.requests_per_client >= 1, "--requests-per-client {} must be at least 1",
              o.requests_per_client);
  serve::Runtime runtime(o.runtime);
  serve::Scheduler& scheduler = runtime.scheduler();
  const int64_t vocab = runtime.spec().config.vocab;
  uint64_t stream = 0;
  ServeBenchResult result;
  // The reference: one request alone (after one warm-up request), median over 3.
  run_request(scheduler, o, vocab, stream++);
  std::vector<double> alone;
  for (int i = 0; i < 3; ++i) alone.push_back(run_request(scheduler, o, vocab, stream++).tpot);
  result.single_request_decode_tokens_per_s = 1.0 / percentile(alone, 0.5);

  for (int c : o.concurrency) {
    const int total = std::max(8, c * o.requests_per_client);
    std::atomic<int> next{0};
    std::vector<std::vector<Sample>> samples(static_cast<size_t>(c));
    const uint64_t base = stream;
    stream += static_cast<uint64_t>(total);
    const Clock::time_point start = Clock::now();
    std::vector<std::thread> clients;
    for (int t = 0; t < c; ++t)
      clients.emplace_back([&, t] {
        for (int i; (i = next.fetch_add(1)) < total;)
          samples[static_cast<size_t>(t)].push_back(
              run_request(scheduler, o, vocab, base + static_cast<uint64_t>(i)));
      });
    for (std::thread& t : clients) t.join();
    ServeLevel level;
    level.concurrency = c;
    level.seconds = seconds_between(start, Clock::now());
    std::vector<double> ttft, tpot;
    for (const auto& per : samples)
      for (const Sample& s : per) {
        ++level.requests;
        level.output_tokens += s.tokens;
        ttft.push_back(s.ttft);
        tpot.push_back(s.tpot);
      }
    level.requests_per_s = static_cast<double>(level.requests) / level.seconds;
    level.output_tokens_per_s = static_cast<double>(level.output_tokens) / level.seconds;
    level.ttft_p50 = percentile(ttft, 0.5);
    level.ttft_p99 = percentile(ttft, 0.99);
    level.tpot_p50 = percentile(tpot, 0.5);
    level.tpot_p99 = percentile(tpot, 0.99);
    level.speedup = level.output_tokens_per_s / result.single_request_decode_tokens_per_s;
    result.levels.push_back(level);
  }
  runtime.shutdown(false);
  return result;
}

}  // namespace expar::bench
