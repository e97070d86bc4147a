// The wave schedules of the MoE layer (seed 000 §5.9, moe/waves.hpp) on the threads backend: for every
// path whose traits say `waves`, wave-sequential and wave-overlapped steps (forward and backward) give the
// same BITS as the no-wave step: outputs, input gradients, router and expert weight gradients (memcmp), on
// EP groups of 2, 3 and 4 ranks with uneven token counts (one rank without tokens, one whose experts get no
// rows), dropless and with a capacity that drops, f32 and a mixed payload precision, with and without
// activation recomputation, and with gpt-oss's router (bias, softmax over the top k) and biased
// clamped-SwiGLU experts (their bias gradients compared too), on one node and on emulated nodes of 1 and 2
// ranks (the aggregated path's blocks and proxies, and puts and gets for the other paths), also with the
// experts' BF16 products (ExpertWeights' copies: `expar train --precision bf16`); and the paths that move
// block's rows (block, rowwise, aggregated) give each other's bits.
// Also the wave split itself and the refusals (flags named).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/moe_layer.hpp"
#include "expar/moe/waves.hpp"

namespace expar {
namespace {

// Unwritten rows read by mistake poison the results (symmetric buffers and fresh tensors start as NaN).
const bool kPoison = [] {
  setenv("EXPAR_POISON", "1", 1);
  return true;
}();

constexpr int kExperts = 12, kTopK = 3;
constexpr int64_t kD = 32, kH = 16;
constexpr uint64_t kSeed = 777;

int64_t tokens_of(int rank) {
  static const int64_t t[] = {9, 0, 13, 6};
  return t[rank];
}

Tensor input_of(int rank, uint64_t stream) {
  Tensor x = Tensor::empty({tokens_of(rank), kD});
  fill_normal(x, kSeed, stream * 16 + static_cast<uint64_t>(rank), 1.0f);
  for (int64_t t = 0; t < x.dim(0); ++t) x.data<float>()[t * kD] = 1.0f;  // the constant channel
  return x;
}

struct Step {
  Tensor y, grad_x, grad_router, w1, w3, w2;
  Tensor router_bias, b1, b3, b2;  // gpt-oss only (undefined otherwise)
};

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

struct Case {
  int ep = 2;
  bool capacity = false;
  bool mixed_precision = false;
  bool recompute = false;
  bool gpt_oss = false;        // router bias + softmax over the top k, biased clamped-SwiGLU experts
  int ranks_per_node = 0;      // emulated nodes of this many ranks (0: one node)
  bool bf16_products = false;  // the experts multiply BF16 copies of their weights (issue #35)
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return fmt::format("EP{}_{}_{}{}{}{}{}", c.ep, c.capacity ? "capacity" : "dropless",
                     c.mixed_precision ? "mixed" : "f32", c.recompute ? "_recompute" : "",
                     c.gpt_oss ? "_gpt_oss" : "",
                     c.ranks_per_node > 0 ? fmt::format("_nodes_of_{}", c.ranks_per_node) : "",
                     c.bf16_products ? "_bf16_products" : "");
}

MoeConfig config_of(const Case& c) {
  MoeConfig cfg;
  cfg.router.num_experts = kExperts;
  cfg.router.top_k = kTopK;
  cfg.model_dim = kD;
  cfg.hidden_dim = kH;
  if (c.gpt_oss) {
    cfg.router.softmax_over_topk = true;
    cfg.router_bias = true;
    cfg.expert_biases = true;
    cfg.activation = ExpertMlpActivation::GptOssClamped;
  }
  return cfg;
}

MoeExecution execution_of(const Case& c, const std::string& path, WaveConfig waves) {
  MoeExecution e;
  e.path = path;
  e.waves = waves;
  if (c.mixed_precision)
    e.precision = {PayloadFormat::MXFP8, PayloadFormat::BF16, PayloadFormat::F32, PayloadFormat::MXFP8Floor};
  if (c.capacity) e.capacity = CapacityPolicy::with(CapacityRule::Source, 0.5);
  return e;
}

// Two steps (the second over buffers holding the first one's rows); the second one's results.
Step run(const Case& c, const std::string& path, WaveConfig waves, Comm& group) {
  MoeLayer layer(config_of(c), execution_of(c, path, waves), group);
  layer.init_params(kSeed);
  // The last rank's experts get no routes: its waves are all empty.
  for (int e : layer.placement().local_experts(c.ep - 1))
    layer.params().w_router.data<float>()[e * kD] = -50.0f;
  if (c.gpt_oss) {  // biases that matter (init_params zeroes them), and gate/up weights that reach the clamps
    MoeParams& p = layer.params();
    fill_normal(p.router_bias, kSeed, 50, 0.5f);
    const auto r = static_cast<uint64_t>(group.rank());
    fill_normal(p.experts.b1, kSeed, 60 + r, 1.0f);
    fill_normal(p.experts.b3, kSeed, 70 + r, 1.0f);
    fill_normal(p.experts.b2, kSeed, 80 + r, 1.0f);
    for (Tensor* w : {&p.experts.w1, &p.experts.w3})
      for (float& v : w->span<float>()) v *= 8.0f;
  }
  if (c.bf16_products) refresh_bf16_copies(layer.params().experts);
  layer.set_recompute(c.recompute);
  const Tensor x = input_of(group.rank(), 1), grad_y = input_of(group.rank(), 2);
  Step s;
  for (int i = 0; i < 2; ++i) {
    layer.zero_grads();
    MoeState state;
    s.y = layer.forward(x, state).clone();
    s.grad_x = layer.backward(grad_y, state).clone();
  }
  s.grad_router = layer.grads().w_router.clone();
  s.w1 = layer.grads().experts.w1.clone();
  s.w3 = layer.grads().experts.w3.clone();
  s.w2 = layer.grads().experts.w2.clone();
  if (c.gpt_oss) {
    s.router_bias = layer.grads().router_bias.clone();
    s.b1 = layer.grads().experts.b1.clone();
    s.b3 = layer.grads().experts.b3.clone();
    s.b2 = layer.grads().experts.b2.clone();
  }
  return s;
}

class WavesTest : public ::testing::TestWithParam<Case> {};

TEST_P(WavesTest, EveryScheduleGivesTheNoWaveBits) {
  const Case c = GetParam();
  if (c.bf16_products && dnnl_isa_name().rfind("avx512_core", 0) != 0)
    GTEST_SKIP() << "oneDNN has no BF16 matmul on " << dnnl_isa_name();
  const int local = kExperts / c.ep;
  std::vector<WaveConfig> schedules = {{2, false}, {local, false}, {2, true}, {local, true}};
  std::vector<std::string> paths;
  for (const PathTraits& t : path_registry())
    if (t.waves) paths.push_back(t.name);
  ASSERT_GE(paths.size(), 3u) << "block, rowwise and aggregated run waves";
  std::mutex mutex;
  std::vector<std::string> failures;
  int compared = 0;
  LaunchOptions launch;
  launch.ranks = c.ep;
  launch.ranks_per_node = c.ranks_per_node;
  launch.timeout_seconds = 120;
  run_ranks(launch, [&](Comm& world) {
    std::optional<Step> first_path;
    auto compare = [&](const Step& got, const Step& ref, const std::string& where) {
      std::lock_guard lock(mutex);
      auto check = [&](const Tensor& a, const Tensor& b, const char* what) {
        if (!same_bits(a, b)) failures.push_back(where + ": " + what);
      };
      check(got.y, ref.y, "y");
      check(got.grad_x, ref.grad_x, "grad_x");
      check(got.grad_router, ref.grad_router, "grad router");
      check(got.w1, ref.w1, "grad w1");
      check(got.w3, ref.w3, "grad w3");
      check(got.w2, ref.w2, "grad w2");
      if (c.gpt_oss) {
        check(got.router_bias, ref.router_bias, "grad router bias");
        check(got.b1, ref.b1, "grad b1");
        check(got.b3, ref.b3, "grad b3");
        check(got.b2, ref.b2, "grad b2");
      }
    };
    for (const std::string& path : paths) {
      const Step ref = run(c, path, {}, world);
      // The paths whose traits say `waves` move the same rows into the same places: the same bits.
      if (first_path && path_traits(path).same_rows_as_block && path_traits(paths[0]).same_rows_as_block)
        compare(ref, *first_path, fmt::format("{} against {} rank {}", path, paths[0], world.rank()));
      if (!first_path) first_path = ref;
      for (const WaveConfig& w : schedules) {
        const Step got = run(c, path, w, world);
        compare(got, ref,
                fmt::format("{} rank {} {} waves {}", path, world.rank(), wave_schedule_name(w.schedule()),
                            w.waves));
        std::lock_guard lock(mutex);
        ++compared;
      }
    }
  });
  EXPECT_EQ(compared, c.ep * static_cast<int>(paths.size() * schedules.size()));
  for (const auto& f : failures) ADD_FAILURE() << f;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int ep : {2, 3, 4})
    for (bool cap : {false, true})
      for (bool mixed : {false, true}) cases.push_back({ep, cap, mixed, false});
  cases.push_back({4, true, true, true});
  cases.push_back({2, false, false, true});
  cases.push_back({2, false, false, false, true});
  cases.push_back({3, true, false, false, true});
  cases.push_back({4, true, true, true, true});
  // Emulated nodes: rows to another node travel through its proxy (aggregated) or by put and get.
  cases.push_back({4, true, true, false, false, 2});
  cases.push_back({3, false, false, false, false, 1});
  cases.push_back({4, false, false, true, false, 1});
  cases.push_back({4, true, false, false, true, 2});
  // BF16 products (issue #35): f32 payloads, the mixed payloads with recomputation, emulated nodes, gpt-oss.
  for (Case b : {Case{2, false, false, false}, Case{4, true, true, true},
                 Case{4, true, false, false, false, 2}, Case{3, false, false, false, true}}) {
    b.bf16_products = true;
    cases.push_back(b);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, WavesTest, ::testing::ValuesIn(all_cases()), case_name);

TEST(Waves, SplitCoversTheLocalExpertsInOrder) {
  const auto w = split_expert_waves(7, 3);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0].begin, 0);
  EXPECT_EQ(w[0].end, 3);
  EXPECT_EQ(w[1].begin, 3);
  EXPECT_EQ(w[1].end, 5);
  EXPECT_EQ(w[2].begin, 5);
  EXPECT_EQ(w[2].end, 7);
  EXPECT_THROW(split_expert_waves(3, 4), Error);
  EXPECT_THROW(split_expert_waves(3, 0), Error);
}

TEST(Waves, EveryRouteLiesInItsWavesRows) {
  // Rank 0 of 2 with 4 experts (2 local per rank), routes chosen so that some waves are empty.
  const ExpertPlacement placement(4, 2);
  Tensor idx = Tensor::empty({3, 2}, DType::I32);
  const int32_t routes[] = {0, 3, 1, 3, 3, -1};
  std::memcpy(idx.raw(), routes, sizeof(routes));
  const std::vector<int64_t> requests = {1, 1, 0, 3, /* rank 1 */ 0, 2, 0, 1};
  const std::vector<int64_t> tokens = {3, 2};
  const RouteMap map = build_route_map(idx, 0, requests, tokens, placement, CapacityPolicy::dropless());
  const auto waves = split_expert_waves(2, 2);
  const WaveRoutes wr = make_wave_routes(map, placement, waves);
  ASSERT_EQ(wr.waves, 2);
  // Rank 0 holds experts 0 (1 row) and 1 (1 + 2 rows); rank 1 holds 2 (no rows) and 3 (3 + 1 rows).
  EXPECT_EQ(wr.row_begin(0, 0), 0);
  EXPECT_EQ(wr.row_begin(0, 1), 1);
  EXPECT_EQ(wr.row_end(0, 1), 4);
  EXPECT_EQ(wr.row_begin(1, 1), 0);
  EXPECT_EQ(wr.row_end(1, 1), 4);
  for (int64_t t = 0; t < map.tokens; ++t)
    for (int k = 0; k < map.top_k; ++k) {
      const int32_t w = wr.wave_of[static_cast<size_t>(t * map.top_k + k)];
      if (!map.valid(t, k)) {
        EXPECT_EQ(w, -1);
        continue;
      }
      const int expert = routes[t * 2 + k];
      EXPECT_EQ(w, placement.local_index(expert)) << "route " << t << "," << k;
      EXPECT_GE(map.row_of(t, k), wr.row_begin(map.rank_of(t, k), w));
      EXPECT_LT(map.row_of(t, k), wr.row_end(map.rank_of(t, k), w));
    }
}

TEST(Waves, RefusalsNameTheFlags) {
  Case c;
  auto message = [&c](const MoeExecution& e, int ep) {
    try {
      e.validate(config_of(c), ep);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(execution_of(c, "block", {7, false}), 2).find("--waves 7 must be in [1, 6]"),
            std::string::npos);
  EXPECT_NE(message(execution_of(c, "block", {1, true}), 2).find("--wave-overlap needs --waves 2"),
            std::string::npos);
  EXPECT_NE(message(execution_of(c, "agrs", {2, false}), 2).find("path 'agrs' has no wave schedule"),
            std::string::npos);
  EXPECT_EQ(message(execution_of(c, "rowwise", {6, true}), 2), "");
}

}  // namespace
}  // namespace expar
