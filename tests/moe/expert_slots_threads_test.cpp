// Redundant experts (issue #36 item 1): every path with a placement of S = E + R physical slots against the
// single-rank reference of the E logical experts, on the threads backend with poisoned buffers, at EP 1, 2
// and 4 with E not divisible by the EP degree (the slots are). Forward outputs and input gradients, the
// router gradient summed over the ranks, and the expert gradients summed per logical expert over its
// replicas (sum_replica_grads) against the reference's; one case runs the overlapped wave schedule (waves of
// local slots) on the paths that have one. The layer's decode form (agrs-decode) must refuse replicas.
//
// Bits: a row's expert result depends on how many rows share its expert's product (oneDNN picks kernels by
// m), and a replica computes fewer rows than the reference's one expert. With batch invariance on
// (set_matmul_min_rows, every rank and the reference) the outputs and input gradients of the paths that
// merge in k order (local, block, rowwise, aggregated) are the reference's bits, whatever the placement;
// without it they agree to 1e-5 relative. agrs sums per owning rank and is always held to 1e-5, as are the
// gradients that sum over rows (router, experts: a replica sums a part of its expert's rows).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/close.hpp"
#include "expar/comm/comm.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/memory.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/expert_slots.hpp"
#include "expar/moe/moe_layer.hpp"
#include "expar/topo/expert_balance.hpp"
#include "moe/solo_comm.hpp"

namespace expar {
namespace {

const bool kPoison = [] {
  setenv("EXPAR_POISON", "1", 1);
  return true;
}();

constexpr int kTopK = 2;
constexpr int64_t kD = 32, kH = 16;
constexpr uint64_t kSeed = 20250301;

struct SlotCase {
  int ranks = 1;
  int experts = 5;
  int redundant = 0;
  bool batch_invariant = false;
  int waves = 1;  // the overlapped wave schedule on the paths that have one (waves of local slots)
};

std::string case_name(const ::testing::TestParamInfo<SlotCase>& info) {
  const SlotCase& c = info.param;
  return fmt::format("EP{}_E{}_R{}{}{}", c.ranks, c.experts, c.redundant,
                     c.batch_invariant ? "_invariant" : "",
                     c.waves > 1 ? fmt::format("_waves{}", c.waves) : "");
}

int64_t tokens_of(int rank) {
  static const int64_t t[] = {9, 0, 13, 6};  // uneven, and rank 1 has none
  return t[rank];
}

Tensor input_of(int rank, uint64_t stream) {
  Tensor x = Tensor::empty({tokens_of(rank), kD});
  fill_normal(x, kSeed, stream * 16 + static_cast<uint64_t>(rank), 1.0f);
  for (int64_t t = 0; t < x.dim(0); ++t) x.data<float>()[t * kD] = 1.0f;  // the hot-expert channel
  return x;
}

Tensor concat_rows(const std::vector<Tensor>& parts) {
  int64_t n = 0;
  for (const auto& p : parts) n += p.dim(0);
  Tensor all = Tensor::empty({n, kD});
  int64_t at = 0;
  for (const auto& p : parts) {
    if (p.numel() > 0) std::memcpy(all.data<float>() + at * kD, p.data<float>(), p.nbytes());
    at += p.dim(0);
  }
  return all;
}

MoeConfig config_of(const SlotCase& c) {
  MoeConfig cfg;
  cfg.router.num_experts = c.experts;
  cfg.router.top_k = kTopK;
  cfg.model_dim = kD;
  cfg.hidden_dim = kH;
  return cfg;
}

// The slots EPLB chooses for a Zipf-like load (expert e: 1/(e+1)): the hot experts get the replicas.
std::vector<int> slots_of(const SlotCase& c) {
  ExpertBalanceInput in;
  for (int e = 0; e < c.experts; ++e) in.loads.push_back(1.0 / (e + 1));
  in.redundant = c.redundant;
  in.ep_size = c.ranks;
  const ExpertBalance b = balance_experts(in);
  std::vector<int> slots;
  for (const PhysicalSlot& s : b.slots) slots.push_back(s.expert);
  return slots;
}

// Expert 0 is made hot (a large weight on the constant channel), so its replicas all receive rows.
void init_layer(MoeLayer& layer) {
  layer.init_params(kSeed);
  layer.params().w_router.data<float>()[0] = 4.0f;
}

struct RankResult {
  Tensor y, grad_x, grad_router;
  ExpertWeights grad_experts, experts;  // this rank's slots
  std::vector<int64_t> requested;       // [M x S]
};

Tensor clone_if(const Tensor& t) {
  return t.defined() ? t.clone() : Tensor{};
}

ExpertWeights cloned(const ExpertWeights& w) {
  ExpertWeights out{clone_if(w.w1), clone_if(w.w3), clone_if(w.w2)};
  out.b1 = clone_if(w.b1);
  out.b3 = clone_if(w.b3);
  out.b2 = clone_if(w.b2);
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

struct Reference {
  Tensor y, grad_x, grad_router;
  ExpertWeights grad_experts, experts;  // all E logical experts
};

Reference reference(const SlotCase& c, const Tensor& x, const Tensor& grad_y) {
  testing::SoloComm solo;
  set_matmul_min_rows(c.batch_invariant ? batch_invariant_rows() : 0);
  MoeLayer layer(config_of(c), MoeExecution{}, solo, "moe");
  init_layer(layer);
  layer.zero_grads();
  MoeState state;
  Reference r;
  r.y = layer.forward(x, state).clone();
  r.grad_x = layer.backward(grad_y, state).clone();
  r.grad_router = layer.grads().w_router.clone();
  r.grad_experts = cloned(layer.grads().experts);
  r.experts = cloned(layer.params().experts);
  set_matmul_min_rows(0);
  return r;
}

// The paths a group of c.ranks runs (the registry is the single list), the decode form apart.
std::vector<std::string> paths_of(const SlotCase& c) {
  std::vector<std::string> out;
  for (const PathTraits& t : path_registry())
    if (!t.decode_form && t.single_rank == (c.ranks == 1)) out.push_back(t.name);
  return out;
}

// results[path][rank]
std::map<std::string, std::vector<RankResult>> run_paths(const SlotCase& c,
                                                         const std::vector<std::string>& ps, bool decode) {
  std::map<std::string, std::vector<RankResult>> results;
  std::mutex mutex;
  MemoryTracker& host = current_tracker();
  run_ranks(c.ranks, [&](Comm& world) {
    set_matmul_min_rows(c.batch_invariant ? batch_invariant_rows() : 0);
    const int rank = world.rank();
    Tensor x = input_of(rank, 1), grad_y = input_of(rank, 2);
    std::vector<std::string> runs = ps;
    if (decode) runs.push_back("agrs-decode");
    for (const std::string& p : runs) {
      if (p == "agrs-decode") {
        // Every rank holds the group's tokens, each rank a source: the replica rule would serve a route on
        // several replicas or none, so the layer's decode form refuses slots (the engine's decode map,
        // with its replicated ranks as one source, is the form that takes them).
        std::vector<Tensor> xs;
        for (int r = 0; r < c.ranks; ++r) xs.push_back(input_of(r, 1));
        MoeExecution e;
        e.path = p;
        e.slots = slots_of(c);
        MoeLayer layer(config_of(c), e, world, "moe");
        init_layer(layer);
        MoeState state;
        try {
          layer.forward(concat_rows(xs), state);
          ADD_FAILURE() << "agrs-decode with replicas must be refused";
        } catch (const Error& err) {
          EXPECT_NE(std::string(err.what()).find("use 'agrs'"), std::string::npos) << err.what();
        }
        continue;
      }
      MoeExecution e;
      e.path = p;
      e.slots = slots_of(c);
      if (path_traits(p).waves) e.waves = WaveConfig{c.waves, c.waves > 1};
      MoeLayer layer(config_of(c), e, world, "moe");
      init_layer(layer);
      layer.zero_grads();
      MoeState state;
      RankResult r;
      r.y = layer.forward(x, state);
      r.grad_x = layer.backward(grad_y, state);
      r.grad_router = layer.grads().w_router;
      r.grad_experts = layer.grads().experts;
      r.experts = layer.params().experts;
      r.requested = state.routes.requested;
      TrackerBinding bind(host);
      RankResult out{r.y.clone(),       r.grad_x.clone(), r.grad_router.clone(), cloned(r.grad_experts),
                     cloned(r.experts), r.requested};
      std::lock_guard lock(mutex);
      results[p].resize(static_cast<size_t>(c.ranks));
      results[p][static_cast<size_t>(rank)] = std::move(out);
    }
    set_matmul_min_rows(0);
  });
  return results;
}

class ExpertSlotsTest : public ::testing::TestWithParam<SlotCase> {};

TEST_P(ExpertSlotsTest, EveryPathWithReplicasMatchesTheLogicalReference) {
  const SlotCase c = GetParam();
  const ExpertPlacement placement = ExpertPlacement::from_slots(c.experts, c.ranks, slots_of(c));
  ASSERT_EQ(placement.num_slots(), c.experts + c.redundant);
  ASSERT_GT(placement.replica_count(0), 1) << "the hot expert must be replicated";
  std::vector<Tensor> xs, gys;
  for (int r = 0; r < c.ranks; ++r) {
    xs.push_back(input_of(r, 1));
    gys.push_back(input_of(r, 2));
  }
  const Reference ref = reference(c, concat_rows(xs), concat_rows(gys));
  const std::vector<std::string> ps = paths_of(c);
  const bool decode = c.ranks > 1;
  const auto results = run_paths(c, ps, decode);
  const test::Tolerance tol = test::Tolerance::relative(1e-5, 1.0);
  for (const std::string& p : ps) {
    SCOPED_TRACE("path " + p);
    const bool bits = c.batch_invariant && p != "agrs";
    const auto& rs = results.at(p);
    Tensor router_sum = Tensor::zeros({c.experts, kD});
    std::vector<ExpertWeights> grads;
    int64_t offset = 0;
    for (int rank = 0; rank < c.ranks; ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      const RankResult& r = rs[static_cast<size_t>(rank)];
      const int64_t t = tokens_of(rank);
      const Tensor want_y = ref.y.rows(offset, offset + t);
      const Tensor want_gx = ref.grad_x.rows(offset, offset + t);
      if (bits) {
        EXPECT_TRUE(same_bits(r.y, want_y)) << "y: " << test::close(r.y, want_y, tol);
        EXPECT_TRUE(same_bits(r.grad_x, want_gx)) << "grad_x: " << test::close(r.grad_x, want_gx, tol);
      } else {
        EXPECT_TRUE(test::close(r.y, want_y, tol)) << "y";
        EXPECT_TRUE(test::close(r.grad_x, want_gx, tol)) << "grad_x";
      }
      // A rank's slot weights are its slots' logical experts' (replicas identical).
      const ExpertWeights slots = slot_expert_weights(placement, rank, ref.experts);
      EXPECT_TRUE(same_bits(r.experts.w1, slots.w1) && same_bits(r.experts.w3, slots.w3) &&
                  same_bits(r.experts.w2, slots.w2));
      for (int64_t i = 0; i < router_sum.numel(); ++i)
        router_sum.data<float>()[i] += r.grad_router.data<float>()[i];
      grads.push_back(r.grad_experts);
      offset += t;
    }
    EXPECT_TRUE(test::close(router_sum, ref.grad_router, tol)) << "router gradient summed over the ranks";
    const ExpertWeights summed = sum_replica_grads(placement, grads);
    EXPECT_TRUE(test::close(summed.w1, ref.grad_experts.w1, tol)) << "w1 gradient summed over replicas";
    EXPECT_TRUE(test::close(summed.w3, ref.grad_experts.w3, tol)) << "w3 gradient summed over replicas";
    EXPECT_TRUE(test::close(summed.w2, ref.grad_experts.w2, tol)) << "w2 gradient summed over replicas";
    // Each replica of the hot expert computed a share of its rows.
    const std::vector<int64_t>& req = rs[0].requested;
    for (int s : placement.expert_slots(0)) {
      int64_t rows = 0;
      for (int src = 0; src < c.ranks; ++src)
        rows += req[static_cast<size_t>(src * placement.num_slots() + s)];
      EXPECT_GT(rows, 0) << "replica slot " << s << " of the hot expert";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Placements, ExpertSlotsTest,
                         ::testing::Values(SlotCase{1, 5, 2, false}, SlotCase{2, 5, 1, false},
                                           SlotCase{2, 5, 3, true}, SlotCase{4, 6, 2, false},
                                           SlotCase{4, 6, 2, true}, SlotCase{4, 5, 7, true},
                                           SlotCase{4, 6, 2, true, 2}),
                         case_name);

// The layer refuses a slot table it cannot place, naming the fix.
TEST(ExpertSlots, LayerRefusesBadSlotTables) {
  run_ranks(2, [&](Comm& world) {
    MoeConfig cfg = config_of({2, 5, 0, false});
    auto message = [&](std::vector<int> slots) {
      MoeExecution e;
      e.path = "block";
      e.slots = std::move(slots);
      try {
        MoeLayer layer(cfg, e, world, "moe");
      } catch (const Error& err) {
        return std::string(err.what());
      }
      return std::string();
    };
    EXPECT_NE(message({0, 1, 2, 3, 4}).find("R = 1 is the next"), std::string::npos);
    EXPECT_NE(message({0, 1, 2, 3, 3, 0}).find("expert 4 has no slot"), std::string::npos);
    EXPECT_NE(message({0, 1, 2, 3, 4, 5}).find("names expert 5, which does not exist"), std::string::npos);
    // Without a slot table, E = 5 on 2 ranks is refused with the same hint.
    MoeExecution plain;
    plain.path = "block";
    try {
      MoeLayer layer(cfg, plain, world, "moe");
      ADD_FAILURE() << "E = 5 over 2 ranks without slots must be refused";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("redundant expert slots"), std::string::npos) << err.what();
    }
  });
}

}  // namespace
}  // namespace expar
