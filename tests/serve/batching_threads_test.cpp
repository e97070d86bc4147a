// Continuous batching on the serving runtime: a request's tokens (greedy, and sampled with a seed) are the
// same bits whether it runs alone or among other requests that join and leave while it runs, on every
// layout (TP, cross-DP EP, partial cross-DP EP, EP inside each DP replica, no EP, variable EP), with f32
// weights and with BF16, block-scaled FP8 and MXFP4
// weights held as stored;
// chunked prefill mixes with decode under the token budget; every request gets exactly max_tokens tokens.
// With redundant experts and rebalancing every few steps (issue #36), the experts move between the ranks
// while the requests run, and every request's tokens are those of the server without replicas.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <thread>

#include "expar/serve/runtime.hpp"
#include "serve/serve_test_model.hpp"

namespace expar::serve {
namespace {

struct LayoutCase {
  int tp, dp;
  bool ep;
  int ep_degree;                // 0: TP*DP
  std::string weights = "f32";  // our f32 checkpoint, or a Hugging Face one in bf16, fp8 or mxfp4
  int redundant = 0;            // --redundant-experts
  int64_t eplb_interval = 0;    // --eplb-interval (--eplb-window the same)
};

RuntimeOptions options_for(const LayoutCase& l) {
  RuntimeOptions o;
  o.path = (l.weights == "bf16"    ? testing::serve_bf16_test_model()
            : l.weights == "fp8"   ? testing::serve_fp8_test_model()
            : l.weights == "mxfp4" ? testing::serve_mxfp4_test_model()
                                   : testing::serve_test_model())
               .string();
  o.model.tp = l.tp;
  o.model.dp = l.dp;
  o.model.enable_expert_parallel = l.ep;
  if (l.ep_degree > 0) o.model.ep_degree = l.ep_degree;
  o.model.redundant_experts = l.redundant;
  if (l.eplb_interval > 0) o.eplb = {l.eplb_interval, l.eplb_interval};
  o.kv_cache_mb = 4;
  o.scheduler.prefill_chunk = 8;      // prompts longer than 8 run in several steps
  o.scheduler.max_batch_tokens = 20;  // so prompt chunks wait behind decodes now and then
  o.scheduler.max_running = 6;        // and requests wait for a running slot
  return o;
}

// 12 tokens after a random prompt of `prompt_tokens`, with the hashes of the logits behind them.
GenerationRequest traced_request(uint64_t prompt_seed, int64_t prompt_tokens) {
  GenerationRequest r;
  r.prompt = infer::testing::random_tokens(prompt_seed, prompt_tokens);
  r.max_tokens = 12;
  r.trace_logits = true;
  return r;
}

GenerationRequest greedy_request() {
  GenerationRequest r = traced_request(101, 19);
  r.sampling.temperature = 0.0;
  return r;
}

GenerationRequest sampled_request() {
  GenerationRequest r = traced_request(102, 11);
  r.sampling.temperature = 0.9;
  r.sampling.top_p = 0.9;
  r.sampling.top_k = 20;
  r.seed = 1234;
  return r;
}

std::vector<int32_t> run_to_end(const std::shared_ptr<RequestState>& s) {
  std::vector<int32_t> out;
  while (true) {
    std::vector<int32_t> more = s->wait_tokens(out.size());
    out.insert(out.end(), more.begin(), more.end());
    if (more.empty() && s->finished()) return out;
  }
}

// The greedy and the sampled request alone, then among 14 others: some before them, some after, some joining
// mid-generation; every request runs to its end.
struct TwoRequests {
  std::vector<int32_t> greedy, sampled;
  std::vector<uint64_t> greedy_hashes, sampled_hashes;  // of the logits behind each token
};
struct BatchRun {
  TwoRequests alone, batched;
};

// The greedy and the sampled request's tokens in `got` are those in `want`.
void expect_same_tokens(const TwoRequests& got, const TwoRequests& want, const std::string& what) {
  EXPECT_EQ(got.greedy, want.greedy) << what;
  EXPECT_EQ(got.sampled, want.sampled) << what;
}

BatchRun run_batch(Runtime& runtime) {
  BatchRun out;
  Scheduler& sched = runtime.scheduler();
  auto greedy_solo = sched.submit(greedy_request());
  out.alone.greedy = run_to_end(greedy_solo);
  auto sampled_solo = sched.submit(sampled_request());
  out.alone.sampled = run_to_end(sampled_solo);
  EXPECT_EQ(out.alone.greedy.size(), 12u);
  EXPECT_EQ(out.alone.sampled.size(), 12u);
  std::vector<std::shared_ptr<RequestState>> others;
  std::vector<int64_t> other_max;
  auto add_other = [&](int i) {
    GenerationRequest r;
    r.prompt = infer::testing::random_tokens(200 + static_cast<uint64_t>(i), 1 + (i * 7) % 23);
    r.max_tokens = 1 + (i * 5) % 17;
    r.sampling.temperature = i % 3 == 0 ? 0.0 : 0.7;
    r.seed = static_cast<uint64_t>(i);
    other_max.push_back(r.max_tokens);
    others.push_back(sched.submit(std::move(r)));
  };
  for (int i = 0; i < 5; ++i) add_other(i);
  auto greedy = sched.submit(greedy_request());
  for (int i = 5; i < 9; ++i) add_other(i);
  auto sampled = sched.submit(sampled_request());
  greedy->wait_tokens(2);  // let the batch run, then more requests join
  for (int i = 9; i < 14; ++i) add_other(i);
  out.batched.greedy = run_to_end(greedy);
  out.batched.sampled = run_to_end(sampled);
  out.alone.greedy_hashes = greedy_solo->logits_hashes();
  out.alone.sampled_hashes = sampled_solo->logits_hashes();
  out.batched.greedy_hashes = greedy->logits_hashes();
  out.batched.sampled_hashes = sampled->logits_hashes();
  for (size_t i = 0; i < others.size(); ++i) {
    EXPECT_EQ(run_to_end(others[i]).size(), static_cast<size_t>(other_max[i])) << "request " << i;
    EXPECT_EQ(others[i]->finish_reason(), FinishReason::Length);
  }
  EXPECT_TRUE(runtime.failure().empty()) << runtime.failure();
  return out;
}

class Batching : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(Batching, TokensDoNotDependOnOtherRequests) {
  Runtime runtime(options_for(GetParam()));
  const BatchRun r = run_batch(runtime);
  expect_same_tokens(r.batched, r.alone, "batched against alone");
  // Not only the tokens: the logits behind every token are the same bits.
  EXPECT_EQ(r.batched.greedy_hashes, r.alone.greedy_hashes);
  EXPECT_EQ(r.batched.sampled_hashes, r.alone.sampled_hashes);
  EXPECT_EQ(r.batched.greedy_hashes.size(), 12u);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Batching,
    ::testing::Values(LayoutCase{1, 1, true, 0}, LayoutCase{2, 1, true, 0}, LayoutCase{2, 2, true, 0},
                      LayoutCase{2, 1, false, 0}, LayoutCase{4, 1, true, 2},
                      LayoutCase{1, 1, true, 0, "bf16"}, LayoutCase{2, 2, true, 0, "bf16"},
                      LayoutCase{4, 1, true, 2, "bf16"}, LayoutCase{1, 1, true, 0, "fp8"},
                      LayoutCase{2, 2, true, 0, "fp8"}, LayoutCase{4, 1, true, 2, "fp8"},
                      LayoutCase{2, 1, false, 0, "fp8"}, LayoutCase{1, 1, true, 0, "mxfp4"},
                      LayoutCase{2, 2, true, 0, "mxfp4"}, LayoutCase{2, 1, false, 0, "mxfp4"},
                      LayoutCase{1, 4, true, 2}, LayoutCase{2, 2, true, 2}),
    [](const auto& info) {
      const LayoutCase& l = info.param;
      return "tp" + std::to_string(l.tp) + "_dp" + std::to_string(l.dp) +
             (l.ep ? "_ep" + std::to_string(l.ep_degree ? l.ep_degree : l.tp * l.dp) : std::string("_noep")) +
             (l.weights == "f32" ? std::string() : "_" + l.weights);
    });

// Redundant experts rebalanced every 2 engine steps from the last 2 steps' loads (issue #36): the experts
// move between the ranks while the requests run (through Comm, as held: f32, BF16, FP8 with its scales,
// MXFP4 blocks), and every request's tokens, alone and batched, are those of the same layout without
// replicas. The logits are the same within the engine's reduction order, not bit for bit: the all-gather /
// reduce-scatter sums a token's expert outputs per rank, so where a replica sits changes that sum's order
// (docs/serving.md).
class Rebalancing : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(Rebalancing, EveryRequestKeepsItsTokensWhileTheExpertsMove) {
  LayoutCase plain = GetParam();
  plain.redundant = 0;
  plain.eplb_interval = 0;
  BatchRun want;
  {
    Runtime runtime(options_for(plain));
    want = run_batch(runtime);
  }
  Runtime runtime(options_for(GetParam()));
  const BatchRun got = run_batch(runtime);
  expect_same_tokens(got.alone, want.alone, "alone");
  expect_same_tokens(got.batched, want.batched, "batched");
  const std::string metrics = runtime.metrics().render();
  auto value = [&](const std::string& name) {
    const size_t at = metrics.find("\n" + name + " ");
    EXPECT_NE(at, std::string::npos) << name << " missing:\n" << metrics;
    return at == std::string::npos ? 0.0 : std::stod(metrics.substr(at + name.size() + 2));
  };
  EXPECT_GE(value("expar_eplb_rebalances_total"), 2) << metrics;
  // Each MoE layer has its own placement: a rebalance moves one or more of them.
  EXPECT_GE(value("expar_eplb_moved_layers_total"), value("expar_eplb_rebalances_total")) << metrics;
  EXPECT_GT(value("expar_eplb_moved_bytes_total"), 0) << metrics;
  EXPECT_EQ(value("expar_eplb_move_seconds_count"), value("expar_eplb_rebalances_total")) << metrics;
  EXPECT_NE(metrics.find("expar_expert_imbalance{layer=\"0\"}"), std::string::npos) << metrics;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Rebalancing,
    ::testing::Values(LayoutCase{2, 1, true, 0, "f32", 2, 2}, LayoutCase{2, 2, true, 0, "f32", 4, 2},
                      LayoutCase{4, 1, true, 2, "f32", 2, 2}, LayoutCase{2, 1, true, 0, "f32", 0, 2},
                      LayoutCase{2, 2, true, 0, "bf16", 4, 2}, LayoutCase{2, 2, true, 0, "fp8", 4, 2},
                      LayoutCase{2, 2, true, 0, "mxfp4", 4, 2}, LayoutCase{1, 4, true, 2, "f32", 2, 2}),
    [](const auto& info) {
      const LayoutCase& l = info.param;
      return "tp" + std::to_string(l.tp) + "_dp" + std::to_string(l.dp) + "_ep" +
             std::to_string(l.ep_degree ? l.ep_degree : l.tp * l.dp) + "_" + l.weights + "_R" +
             std::to_string(l.redundant);
    });

// /metrics' tokens per expert per rank add up: every forwarded token (prompt, and each generated token but
// the last) is routed to K experts in each of L layers, and each route's rows are computed once by every
// rank that holds a shard of its expert (1 with whole experts, TP / ep_degree with variable EP, TP without
// EP), in the request's own copy of the experts only.
TEST_P(Batching, ExpertTokensPerRankAddUp) {
  const LayoutCase& l = GetParam();
  Runtime runtime(options_for(l));
  GenerationRequest r = greedy_request();
  const auto forwarded = static_cast<int64_t>(r.prompt.size()) + r.max_tokens - 1;
  run_to_end(runtime.scheduler().submit(r));
  const std::string metrics = runtime.metrics().render();
  int64_t total = 0;
  std::map<std::string, int> ranks_per_expert;
  std::istringstream in(metrics);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("expar_expert_tokens_total{", 0) == 0) {
      total += std::stoll(line.substr(line.rfind(' ') + 1));
      ++ranks_per_expert[line.substr(line.find("expert="), line.find('}') - line.find("expert="))];
    }
  const ModelConfig c = runtime.spec().config;
  const int shards = !l.ep ? l.tp : l.ep_degree > 0 && l.ep_degree < l.tp ? l.tp / l.ep_degree : 1;
  EXPECT_EQ(total, forwarded * c.moe.router.top_k * c.layers * shards) << metrics;
  for (const auto& [expert, ranks] : ranks_per_expert) EXPECT_LE(ranks, shards) << expert;
}

// Partial cross-DP EP (EP groups of 2 of the 4 replicas, each its own copy of the experts) answers a request,
// greedy and sampled, with the tokens of one rank alone; so does EP inside each replica.
TEST(Batching, PartialCrossDpEpAnswersAsOneRank) {
  std::vector<int32_t> greedy, sampled;
  {
    Runtime runtime(options_for({1, 1, true, 0}));
    greedy = run_to_end(runtime.scheduler().submit(greedy_request()));
    sampled = run_to_end(runtime.scheduler().submit(sampled_request()));
  }
  for (const LayoutCase& l : {LayoutCase{1, 4, true, 2}, LayoutCase{2, 2, true, 2}}) {
    Runtime runtime(options_for(l));
    EXPECT_EQ(run_to_end(runtime.scheduler().submit(greedy_request())), greedy) << l.tp << "x" << l.dp;
    EXPECT_EQ(run_to_end(runtime.scheduler().submit(sampled_request())), sampled) << l.tp << "x" << l.dp;
  }
  EXPECT_EQ(greedy.size(), 12u);
}

// A sampled request with a seed gives the same tokens on a fresh server (the stream is the seed's).
TEST(Batching, SeededSamplingRepeatsAcrossServers) {
  std::vector<int32_t> first, second;
  {
    Runtime runtime(options_for({1, 1, true, 0}));
    first = run_to_end(runtime.scheduler().submit(sampled_request()));
  }
  {
    Runtime runtime(options_for({1, 1, true, 0}));
    second = run_to_end(runtime.scheduler().submit(sampled_request()));
  }
  EXPECT_EQ(first, second);
  GenerationRequest other_seed = sampled_request();
  other_seed.seed = 99;
  Runtime runtime(options_for({1, 1, true, 0}));
  EXPECT_NE(run_to_end(runtime.scheduler().submit(other_seed)), first)
      << "a different seed should draw a different stream (12 tokens at temperature 0.9)";
}

// A client that goes away: its request ends as cancelled at the next step, and the server goes on.
TEST(Batching, CancelledRequestEndsAndOthersContinue) {
  Runtime runtime(options_for({2, 1, true, 0}));
  GenerationRequest r = greedy_request();
  r.max_tokens = 40;
  auto s = runtime.scheduler().submit(r);
  s->wait_tokens(1);
  s->cancel();
  run_to_end(s);
  EXPECT_EQ(s->finish_reason(), FinishReason::Cancelled);
  EXPECT_LT(s->generated(), 40u);
  EXPECT_EQ(run_to_end(runtime.scheduler().submit(greedy_request())).size(), 12u);
}

}  // namespace
}  // namespace expar::serve
