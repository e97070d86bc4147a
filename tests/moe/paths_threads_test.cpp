// Every execution path against the single-rank reference (docs/design.md, "Tests"), on the threads backend:
// layouts (ranks 1..4, M_E dividing the rank count, EP groups as subgroups of the world) x {dropless,
// capacity with drops} x {softmax, sigmoid} x payload precisions {f32, bf16, mxfp8, a mix with a different
// format on each leg}, and gpt-oss's router and experts on four layouts (router bias with the softmax over
// the top K, gate/up/down expert biases, the clamped SwiGLU; the bias gradients compared too). Reduced
// precisions run the paths that encode rows (block, rowwise, aggregated; local and agrs refuse them) against
// a reference that applies the same codec round trips where the rows travel. Every rank builds every rank's
// inputs from the same seed; the checks run on the test thread over what each rank recorded.
//
// The reference is the local path on one rank over the concatenated tokens of one EP group, with exactly the
// routes the EP run dropped marked invalid (a capacity policy decides per source rank, so a single-source
// run would drop different routes; the drops themselves are compared across paths).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "common/close.hpp"
#include "expar/comm/comm.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/convert.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/memory.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/lease_pool.hpp"
#include "expar/moe/moe_layer.hpp"
#include "expar/topo/training_layout.hpp"
#include "moe/solo_comm.hpp"

namespace expar {
namespace {

// Fresh float tensors and every symmetric buffer start as NaN, so a read of a row nobody wrote (a capacity
// tail, a dropped route) poisons the results. Set before main, before poison_enabled() caches it.
const bool kPoison = [] {
  setenv("EXPAR_POISON", "1", 1);
  return true;
}();

constexpr int kExperts = 12, kTopK = 3;
constexpr int64_t kD = 32, kH = 16;  // d: one MX block per row
constexpr uint64_t kSeed = 20240611;

int64_t tokens_of(int ranks, int rank) {
  if (ranks == 1) return 6;
  static const int64_t t[] = {5, 0, 7, 3};  // uneven, and world rank 1 has no tokens
  return t[rank];
}

Tensor input_of(int ranks, int rank, uint64_t stream) {
  Tensor x = Tensor::empty({tokens_of(ranks, rank), kD});
  fill_normal(x, kSeed, stream * 16 + static_cast<uint64_t>(rank), 1.0f);
  // Channel 0 is a constant, so the router can be made to avoid some experts entirely.
  for (int64_t t = 0; t < x.dim(0); ++t) x.data<float>()[t * kD] = 1.0f;
  return x;
}

struct Precision {
  const char* name;
  PayloadPrecision legs;
};

// Every leg distinct in "mixed", so that a path reading one leg's format for another is caught.
const Precision kPrecisions[] = {
    {"f32", {}},
    {"bf16", PayloadPrecision::uniform(PayloadFormat::BF16)},
    {"mxfp8", PayloadPrecision::uniform(PayloadFormat::MXFP8)},
    {"mixed", {PayloadFormat::MXFP8, PayloadFormat::BF16, PayloadFormat::F32, PayloadFormat::MXFP8Floor}},
};

struct Case {
  int ranks = 1;
  int ep = 1;
  bool capacity = false;
  ScoreFunction score = ScoreFunction::Softmax;
  Precision precision = kPrecisions[0];
  int ranks_per_node = 0;  // emulated nodes (0: one node): rows across nodes become put/get, not loads
  bool gpt_oss = false;    // router bias + softmax over the top K, biased clamped-SwiGLU experts
  // The experts' products in BF16 from BF16 copies of their f32 masters (moe/expert_mlp.hpp), the reference's
  // too: the paths that move the same rows stay bit-identical, the reference within BF16's resolution.
  bool bf16_products = false;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return fmt::format("W{}_EP{}_{}_{}_{}{}{}{}", c.ranks, c.ep, c.capacity ? "capacity" : "dropless",
                     score_function_name(c.score), c.precision.name,
                     c.ranks_per_node > 0 ? fmt::format("_nodes_of_{}", c.ranks_per_node) : "",
                     c.gpt_oss ? "_gpt_oss" : "", c.bf16_products ? "_bf16_products" : "");
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const Precision& p : kPrecisions)
    for (int w = 1; w <= 4; ++w)
      for (int ep = 1; ep <= w; ++ep)
        if (w % ep == 0)
          for (bool cap : {false, true})
            for (ScoreFunction s : {ScoreFunction::Softmax, ScoreFunction::Sigmoid})
              cases.push_back({w, ep, cap, s, p});
  // Emulated nodes (threads backend): EP groups that span nodes, with and without drops.
  for (const Precision& p : {kPrecisions[0], kPrecisions[3]})
    for (int ep : {2, 4})
      for (int per_node : {1, 2})
        for (bool cap : {false, true}) cases.push_back({4, ep, cap, ScoreFunction::Softmax, p, per_node});
  // gpt-oss (its router needs the softmax score): the single-rank paths; every f32 path with drops; the
  // reduced-precision paths over EP subgroups with drops; the decode form and cross-node rows over EP 4.
  const Precision& f32 = kPrecisions[0];
  const Precision& mixed = kPrecisions[3];
  for (const Case& c :
       {Case{1, 1, false, ScoreFunction::Softmax, f32}, Case{4, 4, true, ScoreFunction::Softmax, f32},
        Case{4, 2, true, ScoreFunction::Softmax, mixed}, Case{4, 4, false, ScoreFunction::Softmax, f32, 2}}) {
    cases.push_back(c);
    cases.back().gpt_oss = true;
  }
  // BF16 products: one rank; EP 2 and 4 with drops and f32 or BF16 rows; gpt-oss's biased experts over EP 2.
  const Precision& bf16 = kPrecisions[1];
  for (Case c :
       {Case{1, 1, false, ScoreFunction::Softmax, f32}, Case{2, 2, false, ScoreFunction::Softmax, f32},
        Case{4, 2, true, ScoreFunction::Sigmoid, bf16}, Case{4, 4, true, ScoreFunction::Softmax, f32},
        Case{4, 2, true, ScoreFunction::Softmax, f32, 0, true}}) {
    c.bf16_products = true;
    cases.push_back(c);
  }
  return cases;
}

MoeConfig config_of(const Case& c) {
  MoeConfig cfg;
  cfg.router.num_experts = kExperts;
  cfg.router.top_k = kTopK;
  cfg.model_dim = kD;
  cfg.hidden_dim = kH;
  cfg.router.score = c.score;
  cfg.router.renormalize = c.score == ScoreFunction::Sigmoid;
  if (c.gpt_oss) {
    cfg.router.softmax_over_topk = true;
    cfg.router_bias = true;
    cfg.expert_biases = true;
    cfg.activation = ExpertMlpActivation::GptOssClamped;
  }
  return cfg;
}

MoeExecution execution_of(const Case& c, const std::string& path) {
  MoeExecution e;
  e.path = path;
  e.precision = c.precision.legs;
  if (c.capacity) {
    // Cycle through the three rules so every one of them is seen by some layout.
    static const CapacityRule rules[] = {CapacityRule::Source, CapacityRule::Rank, CapacityRule::Expert};
    e.capacity = CapacityPolicy::with(rules[(c.ranks + c.ep) % 3], 0.5);
  }
  return e;
}

// init_params; with gpt-oss, biases that matter (init_params zeroes them; each global expert's from its own
// stream, so the same whatever the layout) and gate/up weights scaled so that both clamps bite. Then push
// the experts of the last EP rank of a group out of every top-K (a rank whose experts receive nothing): a
// large negative weight on the constant channel.
void init_layer(MoeLayer& layer, int ep, bool bf16_products = false) {
  layer.init_params(kSeed);
  if (layer.config().expert_biases) {
    MoeParams& p = layer.params();
    fill_normal(p.router_bias, kSeed, 50, 0.5f);
    for (int l = 0; l < layer.placement().local_count(); ++l) {
      const auto e = static_cast<uint64_t>(layer.placement().global_expert(layer.ep_rank(), l));
      const std::array<Tensor*, 3> biases{&p.experts.b1, &p.experts.b3, &p.experts.b2};
      for (size_t k = 0; k < biases.size(); ++k) {
        Tensor row = biases[k]->rows(l, l + 1);
        fill_normal(row, kSeed, 100 + e * biases.size() + k, 1.0f);
      }
    }
    for (Tensor* w : {&p.experts.w1, &p.experts.w3})
      for (float& v : w->span<float>()) v *= 4.0f;
  }
  if (bf16_products) refresh_bf16_copies(layer.params().experts);
  if (ep < 2) return;
  const ExpertPlacement placement(kExperts, ep);
  for (int e : placement.local_experts(ep - 1)) layer.params().w_router.data<float>()[e * kD] = -50.0f;
}

struct RankResult {
  Tensor y, grad_x, grad_router;
  Tensor grad_router_bias;                   // gpt-oss only
  ExpertWeights grad_experts;                // with gpt-oss, the bias gradients too
  Tensor dst_row;                            // the route map's rows (-1: dropped)
  Tensor topk_idx;                           // the router's choices [T, K]
  std::vector<int64_t> requested, accepted;  // the map's [M x E] matrices
  int64_t dropped = 0, recv_rows = 0;
  bool second_step_identical = false;
  CommStats stats;
  int64_t comm_scratch_peak = 0, symmetric_resident = 0;
};

// Two undefined tensors (a feature the case does not have) are the same.
bool same_bits(const Tensor& a, const Tensor& b) {
  if (!a.defined() && !b.defined()) return true;
  return a.defined() == b.defined() && a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Every gradient of the experts, the biases included (each must be the same bits).
bool same_expert_bits(const ExpertWeights& a, const ExpertWeights& b) {
  return same_bits(a.w1, b.w1) && same_bits(a.w3, b.w3) && same_bits(a.w2, b.w2) && same_bits(a.b1, b.b1) &&
         same_bits(a.b3, b.b3) && same_bits(a.b2, b.b2);
}

Tensor clone_if_defined(const Tensor& t) {
  return t.defined() ? t.clone() : Tensor{};
}

ExpertWeights cloned(const ExpertWeights& w) {
  ExpertWeights out{w.w1.clone(), w.w3.clone(), w.w2.clone()};
  out.b1 = clone_if_defined(w.b1);
  out.b3 = clone_if_defined(w.b3);
  out.b2 = clone_if_defined(w.b2);
  return out;
}

bool all_finite(const Tensor& t) {
  for (float v : t.span<float>())
    if (!std::isfinite(v)) return false;
  return true;
}

// got == want within f32 rounding (1e-5 of the element, absolute 1e-5 below 1). With reduced-precision
// payloads the reference applies the same round trips, so the elements still agree to f32 rounding, except
// where an f32 rounding difference (a GEMM over a different row count, the router over other tokens) moved a
// value across a rounding boundary of the format: those few elements must still agree to the format's
// resolution (`loose`, relative to the largest |want|, at least 1), and at least 90% of all elements must
// agree to f32 rounding.
void expect_close_up_to_format_flips(const Tensor& got, const Tensor& want, const std::string& what,
                                     double loose = 0.0) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const test::Tolerance f32 = test::Tolerance::relative(1e-5, 1.0);
  const test::Tolerance flip{loose, 1.0, 0.0, true};
  const float* g = got.data<float>();
  const float* w = want.data<float>();
  double largest = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i)
    largest = std::max(largest, std::fabs(static_cast<double>(w[i])));
  int64_t exact = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double diff = std::fabs(static_cast<double>(g[i]) - w[i]);
    if (diff <= f32.bound(w[i], largest)) {
      ++exact;
      continue;
    }
    ASSERT_LE(diff, flip.bound(w[i], largest)) << what << " element " << i << ": " << g[i] << " vs " << w[i];
  }
  EXPECT_GE(static_cast<double>(exact), 0.9 * static_cast<double>(got.numel())) << what;
}

// The resolution of the coarsest leg of a precision, for expect_close_up_to_format_flips's `loose`.
double resolution_of(const PayloadPrecision& legs) {
  double r = 0.0;
  for (PayloadFormat f : {legs.dispatch, legs.combine, legs.combine_grad, legs.dispatch_grad})
    r = std::max(r, f == PayloadFormat::F32 ? 0.0 : f == PayloadFormat::BF16 ? 1.0 / 64 : 1.0 / 4);
  return r;
}

// expect_close_up_to_format_flips's `loose` for a case: its coarsest leg's resolution; with gpt-oss's experts
// at least f32 rounding relative to the largest element (their pre-activations reach the clamps at ±7, so a
// gradient element is a sum of terms of the tensor's magnitude that cancel, and its rounding error scales
// with those terms; across layouts it stays under a tenth of this).
double loose_of(const Case& c) {
  // BF16 products: an f32 rounding difference can move an activation across a BF16 rounding boundary.
  return std::max(
      {resolution_of(c.precision.legs), c.gpt_oss ? 1e-5 : 0.0, c.bf16_products ? 1.0 / 64 : 0.0});
}

RankResult run_step_twice(MoeLayer& layer, Comm& ep_group, const Tensor& x, const Tensor& grad_y) {
  RankResult r;
  auto step = [&](RankResult& out) {
    layer.zero_grads();
    MoeState state;
    out.y = layer.forward(x, state).clone();
    out.grad_x = layer.backward(grad_y, state).clone();
    out.grad_router = layer.grads().w_router.clone();
    out.grad_router_bias = clone_if_defined(layer.grads().router_bias);
    out.grad_experts = cloned(layer.grads().experts);
    out.dst_row = state.routes.dst_row.clone();
    out.topk_idx = state.router.topk_idx.clone();
    out.requested = state.routes.requested;
    out.accepted = state.routes.accepted;
    out.dropped = state.routes.dropped;
    out.recv_rows = state.routes.recv_rows;
    EXPECT_EQ(state.metrics.dropped, state.routes.dropped);
  };
  const int64_t symmetric_before = current_tracker().snapshot().current_of(MemCategory::SymmetricBuffers);
  current_tracker().reset_peaks();
  ep_group.reset_stats();
  step(r);
  r.stats = ep_group.stats();
  const MemorySnapshot snap = current_tracker().snapshot();
  r.comm_scratch_peak = snap.peak_of(MemCategory::CommScratch);
  r.symmetric_resident = snap.current_of(MemCategory::SymmetricBuffers) - symmetric_before;
  // A second step over buffers that hold the first step's rows (and fresh NaN poison) gives the same bits.
  RankResult again;
  step(again);
  r.second_step_identical = same_bits(r.y, again.y) && same_bits(r.grad_x, again.grad_x) &&
                            same_bits(r.grad_router, again.grad_router) &&
                            same_bits(r.grad_router_bias, again.grad_router_bias) &&
                            same_expert_bits(r.grad_experts, again.grad_experts);
  return r;
}

// Tensors are charged to the tracker of the thread that allocates them, and a rank's tracker dies with
// run_ranks: what a rank hands back to the test thread is cloned under the test thread's tracker.
RankResult exported(const RankResult& r, MemoryTracker& host) {
  TrackerBinding bind(host);
  RankResult out = r;
  out.y = r.y.clone();
  out.grad_x = r.grad_x.clone();
  out.grad_router = r.grad_router.clone();
  out.grad_router_bias = clone_if_defined(r.grad_router_bias);
  out.grad_experts = cloned(r.grad_experts);
  out.dst_row = r.dst_row.clone();
  out.topk_idx = r.topk_idx.clone();
  return out;
}

// The map's drops follow its capacity plan (seed 000 §5.4): source `source` requests expert e once per route
// of its router's top-K, and accepts the first accepted[source][e] of them in (token, k) order; every other
// route is dropped, and `dropped` counts them.
void expect_drops_follow_the_plan(const RankResult& r, int source) {
  const int64_t t = r.topk_idx.dim(0);
  const int32_t* idx = r.topk_idx.data<int32_t>();
  const int32_t* row = r.dst_row.data<int32_t>();
  std::vector<int64_t> seen(kExperts, 0);
  int64_t dropped = 0;
  for (int64_t i = 0; i < t * kTopK; ++i) {
    ASSERT_GE(idx[i], 0) << "the router of this test picks K valid experts for every token";
    const auto e = static_cast<size_t>(idx[i]);
    const bool accept = seen[e]++ < r.accepted[static_cast<size_t>(source) * kExperts + e];
    EXPECT_EQ(row[i] >= 0, accept) << "route " << i << " (token " << i / kTopK << ", expert " << e << ")";
    dropped += accept ? 0 : 1;
  }
  for (size_t e = 0; e < seen.size(); ++e)
    EXPECT_EQ(seen[e], r.requested[static_cast<size_t>(source) * kExperts + e]) << "requests of expert " << e;
  EXPECT_EQ(r.dropped, dropped);
}

struct Reference {
  Tensor y, grad_x, grad_router;
  Tensor grad_router_bias;     // gpt-oss only
  ExpertWeights grad_experts;  // all E experts (with gpt-oss, their bias gradients too)
};

Tensor concat_rows(const std::vector<Tensor>& parts, int64_t width) {
  int64_t n = 0;
  for (const auto& p : parts) n += p.dim(0);
  Tensor all = Tensor::empty({n, width});
  int64_t at = 0;
  for (const auto& p : parts) {
    if (p.numel() > 0) std::memcpy(all.data<float>() + at * width, p.data<float>(), p.nbytes());
    at += p.dim(0);
  }
  return all;
}

// Rows [0, rows) of t encoded in `format` and decoded again (what a row moved in that format arrives as).
void round_trip_in_place(Tensor& t, int64_t rows, PayloadFormat format) {
  if (format == PayloadFormat::F32 || rows == 0) return;
  std::vector<std::byte> bytes(payload_row_bytes(format, kD) * static_cast<size_t>(rows));
  encode_payload_rows(format, t.data<float>(), rows, kD, bytes.data());
  decode_payload_rows(format, bytes.data(), rows, kD, t.data<float>());
}

Tensor round_trip(const Tensor& t, int64_t rows, PayloadFormat format) {
  Tensor out = t.clone();
  round_trip_in_place(out, rows, format);
  return out;
}

// The local path on one rank over x [N, d], with the routes in `dropped` [N*K] made invalid, and the
// payload round trips of c's precision applied where each leg's rows travel.
Reference reference(const Case& c, const Tensor& x, const Tensor& grad_y,
                    const std::vector<uint8_t>& dropped) {
  testing::SoloComm solo;
  const MoeConfig cfg = config_of(c);
  const PayloadPrecision legs = c.precision.legs;
  MoeExecution local;  // dropless, f32 rows
  MoeLayer layer(cfg, local, solo, "moe");
  init_layer(layer, c.ep, c.bf16_products);
  RouterState rs;
  const bool router_bias = layer.params().router_bias.defined();
  RouterOutput routed = router_forward(cfg.router, x, layer.params().w_router, nullptr, rs,
                                       router_bias ? &layer.params().router_bias : nullptr);
  Tensor idx = routed.topk_idx.clone();
  for (size_t i = 0; i < dropped.size(); ++i)
    if (dropped[i]) idx.data<int32_t>()[i] = -1;
  const ExpertPlacement placement(kExperts, 1);
  const std::vector<int64_t> requests = count_requests(idx, kExperts);
  const std::vector<int64_t> tokens{x.dim(0)};
  RouteMap map = build_route_map(idx, 0, requests, tokens, placement, CapacityPolicy::dropless());
  PathOptions options;
  options.model_dim = kD;
  options.top_k = kTopK;
  options.placement = &placement;
  auto path = make_path("local", solo, options);
  PathState ps;
  ExpertMlpState es;
  // Each leg's rows as they arrive: encoded where they leave and decoded where they are consumed.
  const Tensor x_arrived = round_trip(x, x.dim(0), legs.dispatch);
  Tensor in = path->dispatch_forward(x_arrived, map, ps);
  Tensor out = path->expert_output_buffer(map, kD, ps);
  expert_mlp_forward(in, PayloadFormat::F32, map.expert_offsets, layer.params().experts, out, &es);
  if (c.gpt_oss) {
    // Both clamps bite on some pre-activations and leave others free (the gradients flow through both).
    // The saved rows have a padded stride (ExpertMlpState): their first kH columns, f32 or (BF16 products)
    // BF16.
    const auto count = [&](const Tensor& pre, auto clamped) {
      const auto value = [&](int64_t i) {
        return pre.dtype() == DType::BF16 ? bf16_to_f32(static_cast<const uint16_t*>(pre.raw())[i])
                                          : pre.data<float>()[i];
      };
      int64_t n = 0;
      for (int64_t r = 0; r < map.recv_rows; ++r)
        for (int64_t c = 0; c < kH; ++c) n += clamped(value(r * pre.dim(1) + c));
      return n;
    };
    const int64_t all = map.recv_rows * kH;
    const int64_t gate = count(es.gate_pre, [](float v) { return v > kGptOssLimit; });
    const int64_t up = count(es.up_pre, [](float v) { return std::abs(v) > kGptOssLimit; });
    EXPECT_TRUE(gate > 0 && gate < all) << gate << " of " << all << " gate pre-activations clamped";
    EXPECT_TRUE(up > 0 && up < all) << up << " of " << all << " up pre-activations clamped";
  }
  round_trip_in_place(out, map.recv_rows, legs.combine);
  Reference ref;
  ref.y = path->combine_forward(out, routed.topk_weight, map, ps);
  layer.zero_grads();
  Tensor grad_w;
  Tensor grad_out = path->combine_backward(grad_y, routed.topk_weight, map, ps, grad_w);
  round_trip_in_place(grad_out, map.recv_rows, legs.combine_grad);
  Tensor grad_in = path->expert_grad_input_buffer(map, kD, ps);
  expert_mlp_backward(grad_out, es, layer.params().experts, grad_in, layer.grads().experts);
  round_trip_in_place(grad_in, map.recv_rows, legs.dispatch_grad);
  ref.grad_x = path->dispatch_backward(grad_in, map, ps);
  router_backward(cfg.router, rs, layer.params().w_router, grad_w, ref.grad_x, layer.grads().w_router,
                  router_bias ? &layer.grads().router_bias : nullptr);
  ref.grad_router = layer.grads().w_router.clone();
  ref.grad_router_bias = clone_if_defined(layer.grads().router_bias);
  ref.grad_experts = cloned(layer.grads().experts);
  if (legs.all_f32() && std::none_of(dropped.begin(), dropped.end(), [](uint8_t v) { return v != 0; })) {
    // Without drops this reference is exactly MoeLayer with path "local" (a check on the test itself).
    MoeState st;
    layer.zero_grads();
    EXPECT_TRUE(same_bits(layer.forward(x, st), ref.y));
    EXPECT_TRUE(same_bits(layer.backward(grad_y, st), ref.grad_x));
    EXPECT_TRUE(same_bits(layer.grads().w_router, ref.grad_router));
    EXPECT_TRUE(same_bits(layer.grads().router_bias, ref.grad_router_bias));
    EXPECT_TRUE(same_expert_bits(layer.grads().experts, ref.grad_experts));
  }
  return ref;
}

Tensor expert_slice(const Tensor& all, int64_t e) {
  return all.rows(e, e + 1);
}

// Every registered path a case can run (the registry is the single list): reduced precisions only on the
// paths that encode their rows (the others refuse, see below), single-rank paths at EP 1. block first: the
// others are compared with it. The decode form runs apart (every rank holds its group's tokens), and only
// without drops, where it agrees with the reference.
struct PathsUnderTest {
  std::vector<std::string> paths;
  std::string decode_path;
  bool decode = false;
};

PathsUnderTest paths_under_test(const Case& c) {
  const bool f32 = c.precision.legs.all_f32();
  PathsUnderTest u;
  for (const PathTraits& t : path_registry()) {
    if (!f32 && !t.reduced_precision) continue;
    if (t.single_rank && c.ep != 1) continue;
    if (t.decode_form) {
      u.decode_path = t.name;
      continue;
    }
    u.paths.push_back(t.name);
  }
  std::stable_partition(u.paths.begin(), u.paths.end(), [](const std::string& p) { return p == "block"; });
  u.decode = !c.capacity && !u.decode_path.empty();
  return u;
}

// results[path][world rank]
using PathResults = std::map<std::string, std::vector<RankResult>>;

// Every path of `u` on every rank, two steps each, on the same inputs and weights.
PathResults run_every_path(const Case& c, const TrainingLayout& layout, const PathsUnderTest& u) {
  const auto groups = layout.groups(TrainingGroup::EpMp);
  PathResults results;
  for (const auto& p : u.paths) results[p].resize(static_cast<size_t>(c.ranks));
  if (u.decode) results[u.decode_path].resize(static_cast<size_t>(c.ranks));
  std::mutex mutex;
  MemoryTracker& host = current_tracker();
  LaunchOptions launch;
  launch.ranks = c.ranks;
  launch.ranks_per_node = c.ranks_per_node;
  launch.timeout_seconds = 120;
  run_ranks(launch, [&](Comm& world) {
    const int rank = world.rank();
    auto ep_group = world.subgroup(groups, "ep_mp");
    const Tensor x = input_of(c.ranks, rank, 1);
    const Tensor grad_y = input_of(c.ranks, rank, 2);
    for (const auto& p : u.paths) {
      MoeLayer layer(config_of(c), execution_of(c, p), *ep_group);
      init_layer(layer, c.ep, c.bf16_products);
      RankResult r = run_step_twice(layer, *ep_group, x, grad_y);
      std::lock_guard lock(mutex);
      results[p][static_cast<size_t>(rank)] = exported(r, host);
    }
    if (u.decode) {
      // Decode form: every rank of the group holds the group's tokens.
      std::vector<Tensor> xs, gys;
      for (int member : layout.group_of(rank, TrainingGroup::EpMp)) {
        xs.push_back(input_of(c.ranks, member, 1));
        gys.push_back(input_of(c.ranks, member, 2));
      }
      MoeLayer layer(config_of(c), execution_of(c, u.decode_path), *ep_group);
      init_layer(layer, c.ep, c.bf16_products);
      RankResult r = run_step_twice(layer, *ep_group, concat_rows(xs, kD), concat_rows(gys, kD));
      std::lock_guard lock(mutex);
      results[u.decode_path][static_cast<size_t>(rank)] = exported(r, host);
    }
  });
  return results;
}

// The reference of one EP group: its members' tokens concatenated, with the routes block dropped (each
// member's drops counted into `world_dropped`).
Reference group_reference(const Case& c, const std::vector<int>& group, const PathResults& results,
                          int64_t& world_dropped) {
  std::vector<Tensor> xs, gys;
  std::vector<uint8_t> dropped;
  for (int member : group) {
    xs.push_back(input_of(c.ranks, member, 1));
    gys.push_back(input_of(c.ranks, member, 2));
    const RankResult& b = results.at("block")[static_cast<size_t>(member)];
    for (int32_t row : b.dst_row.span<int32_t>()) dropped.push_back(row < 0 ? 1 : 0);
    world_dropped += b.dropped;
  }
  return reference(c, concat_rows(xs, kD), concat_rows(gys, kD), dropped);
}

// What each path promises beyond matching the reference: contracts 3 and 4 (block and rowwise move the same
// rows into the same places and sum in the same order, so their outputs and gradients are bit-identical),
// and each path's own communication and memory.
void expect_path_contract(const std::string& p, const RankResult& r, const RankResult& block) {
  if (path_traits(p).same_rows_as_block) {
    EXPECT_TRUE(same_bits(r.y, block.y));
    EXPECT_TRUE(same_bits(r.grad_x, block.grad_x));
    EXPECT_TRUE(same_bits(r.grad_router, block.grad_router));
    EXPECT_TRUE(same_bits(r.grad_router_bias, block.grad_router_bias));
    EXPECT_TRUE(same_expert_bits(r.grad_experts, block.grad_experts));
  }
  if (p == "rowwise") {
    // No host split list: not one all_to_all_v on the EP group.
    EXPECT_EQ(r.stats.all_to_all_v, 0);
    EXPECT_EQ(r.comm_scratch_peak, 0) << "rowwise packs no peer buffers";
    EXPECT_GT(r.symmetric_resident, 0) << "rowwise buffers must show under symmetric buffers";
  }
  if (p == "block") {
    EXPECT_EQ(r.stats.all_to_all_v, 4) << "two exchanges forward, two backward";
    EXPECT_EQ(r.symmetric_resident, 0);
    const bool moves_rows =
        std::accumulate(r.dst_row.span<int32_t>().begin(), r.dst_row.span<int32_t>().end(), 0,
                        [](int n, int32_t v) { return n + (v >= 0); }) > 0 ||
        r.recv_rows > 0;
    if (moves_rows) {
      EXPECT_GT(r.comm_scratch_peak, 0) << "block's packed peer buffers are comm scratch";
    }
  }
  if (p == "agrs") {
    EXPECT_EQ(r.stats.all_to_all_v, 0);
  }
}

// The gradients of the local experts of EP rank `pos` (weights, and the biases a gpt-oss case has) against
// those of the same global experts in the reference.
void expect_local_experts_match(const Case& c, size_t pos, const ExpertWeights& got,
                                const ExpertWeights& want, const std::string& what, double loose) {
  const std::vector<int> experts = ExpertPlacement(kExperts, c.ep).local_experts(static_cast<int>(pos));
  ASSERT_EQ(got.b1.defined(), c.gpt_oss);
  ASSERT_EQ(want.b1.defined(), c.gpt_oss);
  const std::array<std::pair<const char*, const Tensor*>, 6> got_all{
      {{"w1", &got.w1}, {"w3", &got.w3}, {"w2", &got.w2}, {"b1", &got.b1}, {"b3", &got.b3}, {"b2", &got.b2}}};
  const std::array<const Tensor*, 6> want_all{&want.w1, &want.w3, &want.w2, &want.b1, &want.b3, &want.b2};
  for (size_t k = 0; k < got_all.size(); ++k) {
    const auto& [name, g] = got_all[k];
    if (!g->defined()) continue;
    for (size_t l = 0; l < experts.size(); ++l)
      expect_close_up_to_format_flips(expert_slice(*g, static_cast<int64_t>(l)),
                                      expert_slice(*want_all[k], experts[l]),
                                      what + name + " of expert " + std::to_string(experts[l]), loose);
  }
}

// One EP rank (position `pos` in its group, tokens from `offset` of the group's) of path `p` against the
// group's reference: outputs, its local experts' gradients, its drops.
void expect_rank_matches_reference(const Case& c, const RankResult& r, size_t pos, int64_t offset, int64_t t,
                                   const Reference& ref, double loose) {
  ASSERT_TRUE(all_finite(r.y) && all_finite(r.grad_x) && all_finite(r.grad_router));
  EXPECT_TRUE(r.second_step_identical) << "a second step over reused buffers changed the results";
  // The routes this path dropped are the ones its capacity plan refuses (the reference drops them too).
  expect_drops_follow_the_plan(r, static_cast<int>(pos));
  expect_close_up_to_format_flips(r.y, ref.y.rows(offset, offset + t), "y", loose);
  expect_close_up_to_format_flips(r.grad_x, ref.grad_x.rows(offset, offset + t), "grad_x", loose);
  expect_local_experts_match(c, pos, r.grad_experts, ref.grad_experts, "", loose);
}

// Path `p` on every rank of one EP group: each rank against the reference and the path's contract, and the
// router gradient summed over the group against the reference's.
void expect_path_matches_reference(const Case& c, const std::string& p, const std::vector<int>& group,
                                   const PathResults& results, const Reference& ref, double loose) {
  SCOPED_TRACE("path " + p);
  Tensor router_sum = Tensor::zeros({kExperts, kD}), router_bias_sum = Tensor::zeros({kExperts});
  int64_t offset = 0;
  for (size_t pos = 0; pos < group.size(); ++pos) {
    const int member = group[pos];
    SCOPED_TRACE("world rank " + std::to_string(member));
    const RankResult& r = results.at(p)[static_cast<size_t>(member)];
    const int64_t t = tokens_of(c.ranks, member);
    expect_rank_matches_reference(c, r, pos, offset, t, ref, loose);
    if (::testing::Test::HasFatalFailure()) return;
    for (int64_t i = 0; i < router_sum.numel(); ++i)
      router_sum.data<float>()[i] += r.grad_router.data<float>()[i];
    if (c.gpt_oss)
      for (int64_t i = 0; i < kExperts; ++i)
        router_bias_sum.data<float>()[i] += r.grad_router_bias.data<float>()[i];
    expect_path_contract(p, r, results.at("block")[static_cast<size_t>(member)]);
    // The last EP rank's experts are pushed out of every top-K: it receives nothing.
    if (c.ep >= 2 && pos + 1 == group.size()) {
      EXPECT_EQ(r.recv_rows, 0);
    }
    offset += t;
  }
  expect_close_up_to_format_flips(router_sum, ref.grad_router,
                                  "router weight gradient (summed over the EP group)", loose);
  if (c.gpt_oss) {
    expect_close_up_to_format_flips(router_bias_sum, ref.grad_router_bias,
                                    "router bias gradient (summed over the EP group)", loose);
  }
}

// The decode form on one EP group: every rank holds every token of the group, so its outputs and router
// gradient are the reference's whole.
void expect_decode_matches_reference(const Case& c, const std::string& decode_path,
                                     const std::vector<int>& group, const PathResults& results,
                                     const Reference& ref) {
  SCOPED_TRACE("path " + decode_path);
  for (size_t pos = 0; pos < group.size(); ++pos) {
    const RankResult& r = results.at(decode_path)[static_cast<size_t>(group[pos])];
    EXPECT_TRUE(r.second_step_identical);
    const double loose = loose_of(c);
    expect_close_up_to_format_flips(r.y, ref.y, "decode y", loose);
    expect_close_up_to_format_flips(r.grad_x, ref.grad_x, "decode grad_x", loose);
    expect_close_up_to_format_flips(r.grad_router, ref.grad_router, "decode router weight gradient", loose);
    if (c.gpt_oss) {
      expect_close_up_to_format_flips(r.grad_router_bias, ref.grad_router_bias, "decode router bias gradient",
                                      loose);
    }
    expect_local_experts_match(c, pos, r.grad_experts, ref.grad_experts, "decode ", loose);
  }
}

class PathsTest : public ::testing::TestWithParam<Case> {};

TEST_P(PathsTest, EveryPathMatchesTheLocalReference) {
  const Case c = GetParam();
  if (c.bf16_products && dnnl_isa_name().rfind("avx512_core", 0) != 0)
    GTEST_SKIP() << "oneDNN has no BF16 matmul on " << dnnl_isa_name();
  const TrainingLayout layout(c.ranks, c.ep);
  const PathsUnderTest u = paths_under_test(c);
  ASSERT_EQ(u.paths.front(), "block");
  const PathResults results = run_every_path(c, layout, u);
  int64_t world_dropped = 0;
  for (const auto& group : layout.groups(TrainingGroup::EpMp)) {
    const Reference ref = group_reference(c, group, results, world_dropped);
    ASSERT_TRUE(all_finite(ref.y) && all_finite(ref.grad_x));
    for (const auto& p : u.paths) {
      expect_path_matches_reference(c, p, group, results, ref, loose_of(c));
      if (HasFatalFailure()) return;
    }
    if (u.decode) expect_decode_matches_reference(c, u.decode_path, group, results, ref);
  }
  if (c.capacity) {
    EXPECT_GT(world_dropped, 0) << "the capacity case must actually drop routes";
  }
  if (!c.capacity) {
    EXPECT_EQ(world_dropped, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, PathsTest, ::testing::ValuesIn(all_cases()), case_name);

TEST(Paths, RegistryNamesEveryPathAndRejectsUnknownOnes) {
  const auto names = path_names();
  for (const char* p : {"local", "block", "rowwise", "agrs", "agrs-decode", "aggregated"})
    EXPECT_NE(std::find(names.begin(), names.end(), p), names.end()) << p;
  // The traits the suite and the benchmarks select by.
  EXPECT_TRUE(path_traits("local").single_rank);
  for (const char* p : {"block", "rowwise"}) {
    EXPECT_TRUE(path_traits(p).same_rows_as_block) << p;
    EXPECT_TRUE(path_traits(p).reduced_precision) << p;
  }
  EXPECT_FALSE(path_traits("agrs").same_rows_as_block);
  EXPECT_TRUE(path_traits("agrs-decode").decode_form);
  EXPECT_THROW(path_traits("a2a"), Error);
  run_ranks(1, [&](Comm& world) {
    const ExpertPlacement placement(kExperts, 1);
    PathOptions options;
    options.model_dim = kD;
    options.top_k = kTopK;
    options.placement = &placement;
    try {
      make_path("a2a", world, options);
      ADD_FAILURE() << "an unknown path must throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rowwise"), std::string::npos) << e.what();
    }
  });
}

// Only block and rowwise encode their rows: the other paths refuse a reduced precision, naming it and the
// paths that take it; an MX format on a width that is not a multiple of 32 names the leg's flag.
TEST(Paths, PathsThatMoveF32OnlyRefuseReducedPrecision) {
  run_ranks(1, [&](Comm& world) {
    int refusing = 0;
    for (const PathTraits& t : path_registry()) {
      if (t.reduced_precision) continue;
      ++refusing;
      const std::string& path = t.name;
      Case c;
      c.precision = kPrecisions[3];
      try {
        MoeLayer layer(config_of(c), execution_of(c, path), world);
        ADD_FAILURE() << path << " must refuse a reduced-precision payload";
      } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(path), std::string::npos) << m;
        EXPECT_NE(m.find("dispatch mxfp8"), std::string::npos) << m;
        EXPECT_NE(m.find("rowwise"), std::string::npos) << m;
      }
    }
    EXPECT_EQ(refusing, 3) << "local, agrs and agrs-decode move f32 only";
    Case c;
    MoeConfig cfg = config_of(c);
    cfg.model_dim = 48;
    MoeExecution e = execution_of(c, "rowwise");
    e.precision.combine_grad = PayloadFormat::MXFP8;
    try {
      MoeLayer layer(cfg, e, world);
      ADD_FAILURE() << "mxfp8 with d=48 must be refused";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("--combine-grad-precision mxfp8"), std::string::npos) << m;
      EXPECT_NE(m.find("d=48"), std::string::npos) << m;
    }
  });
}

// Rowwise with a heap and lease pool shared by two MoE blocks (PathOptions::heap / lease_pool), run in the
// training order F0 F1 B1 B0: each block's dispatch payload keeps its own leased slot until its backward,
// every lease is returned, and a pool with slots too small for the capacity is refused with the size needed.
// The experts are the identity, so y[t] = Σ_k w[t,k]·x[t] and grad_x[t] = Σ_k w[t,k]·grad_y[t].
TEST(Paths, RowwiseSharesOneHeapAndLeasePoolAcrossBlocks) {
  LaunchOptions launch;
  launch.ranks = 2;
  launch.timeout_seconds = 60;
  run_ranks(launch, [&](Comm& world) {
    const ExpertPlacement placement(4, 2);
    auto heap = world.make_heap();
    const int64_t t_count = 3 + world.rank(), d = 4;
    Tensor idx = Tensor::empty({t_count, 2}, DType::I32);
    for (int64_t t = 0; t < t_count; ++t) {
      idx.data<int32_t>()[t * 2] = static_cast<int32_t>(t % 4);
      idx.data<int32_t>()[t * 2 + 1] = static_cast<int32_t>((t + 1 + world.rank()) % 4);
    }
    const RouteMap map = build_route_map(idx, world, placement, CapacityPolicy::dropless());
    const size_t slot_bytes = static_cast<size_t>(map.capacity_rows * d) * sizeof(float);
    {
      LeasePool small(*heap, "small", slot_bytes - 1);
      PathOptions options;
      options.model_dim = d;
      options.top_k = 2;
      options.placement = &placement;
      options.heap = heap.get();
      options.lease_pool = &small;
      auto path = make_path("rowwise", world, options);
      PathState state;
      Tensor x = Tensor::zeros({t_count, d});
      try {
        path->dispatch_forward(x, map, state);
        ADD_FAILURE() << "a pool with slots too small must be refused";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(std::to_string(slot_bytes)), std::string::npos) << e.what();
      }
    }
    LeasePool pool(*heap, "shared", slot_bytes);
    std::vector<std::unique_ptr<ExpertPath>> blocks;
    for (int b = 0; b < 2; ++b) {
      PathOptions options;
      options.model_dim = d;
      options.top_k = 2;
      options.placement = &placement;
      options.heap = heap.get();
      options.lease_pool = &pool;
      options.block_index = b;
      blocks.push_back(make_path("rowwise", world, options));
    }
    Tensor w = Tensor::empty({t_count, 2});
    fill_uniform(w, kSeed, 77 + static_cast<uint64_t>(world.rank()), 0.1f, 1.0f);
    std::vector<Tensor> xs, ys;
    std::vector<PathState> states(2);
    for (int b = 0; b < 2; ++b) {
      Tensor x = Tensor::empty({t_count, d});
      fill_normal(x, kSeed, 100 + static_cast<uint64_t>(b * 4 + world.rank()), 1.0f);
      Tensor in = blocks[static_cast<size_t>(b)]->dispatch_forward(x, map, states[static_cast<size_t>(b)]);
      Tensor out =
          blocks[static_cast<size_t>(b)]->expert_output_buffer(map, d, states[static_cast<size_t>(b)]);
      std::memcpy(out.raw(), in.raw(), static_cast<size_t>(map.recv_rows * d) * sizeof(float));
      ys.push_back(
          blocks[static_cast<size_t>(b)]->combine_forward(out, w, map, states[static_cast<size_t>(b)]));
      xs.push_back(x);
    }
    EXPECT_EQ(pool.leased_count(), 2) << "each block's dispatch payload holds its own slot until backward";
    for (int b = 1; b >= 0; --b) {
      ExpertPath& path = *blocks[static_cast<size_t>(b)];
      PathState& state = states[static_cast<size_t>(b)];
      Tensor grad_w;
      Tensor grad_out = path.combine_backward(xs[static_cast<size_t>(b)], w, map, state, grad_w);
      Tensor grad_in = path.expert_grad_input_buffer(map, d, state);
      std::memcpy(grad_in.raw(), grad_out.raw(), static_cast<size_t>(map.recv_rows * d) * sizeof(float));
      Tensor grad_x = path.dispatch_backward(grad_in, map, state);
      const Tensor& x = xs[static_cast<size_t>(b)];
      for (int64_t t = 0; t < t_count; ++t) {
        double norm2 = 0;
        for (int64_t i = 0; i < d; ++i)
          norm2 += static_cast<double>(x.data<float>()[t * d + i]) * x.data<float>()[t * d + i];
        EXPECT_NEAR(grad_w.data<float>()[t * 2], norm2, 1e-4);
        EXPECT_NEAR(grad_w.data<float>()[t * 2 + 1], norm2, 1e-4);
        const float wsum = w.data<float>()[t * 2] + w.data<float>()[t * 2 + 1];
        for (int64_t i = 0; i < d; ++i) {
          const float xv = x.data<float>()[t * d + i];
          EXPECT_NEAR(ys[static_cast<size_t>(b)].data<float>()[t * d + i], wsum * xv, 1e-5f);
          // grad_y = x here, so grad_x = Σ_k w·x and the weight gradient is |x_t|².
          EXPECT_NEAR(grad_x.data<float>()[t * d + i], wsum * xv, 1e-5f);
        }
      }
    }
    EXPECT_EQ(pool.leased_count(), 0) << "every lease is released by its dispatch backward";
    EXPECT_EQ(pool.high_water(), 3) << "two saved payloads plus one gradient slot";
  });
}

TEST(Paths, DecodeFormRejectsDifferentTokenCounts) {
  LaunchOptions launch;
  launch.ranks = 2;
  launch.timeout_seconds = 60;
  EXPECT_THROW(run_ranks(launch,
                         [&](Comm& world) {
                           Case c{2, 2, false, ScoreFunction::Softmax};
                           MoeLayer layer(config_of(c), execution_of(c, "agrs-decode"), world);
                           init_layer(layer, 2);
                           MoeState state;
                           layer.forward(input_of(2, world.rank(), 1), state);  // 5 and 0 tokens
                         }),
               Error);
}

}  // namespace
}  // namespace expar
