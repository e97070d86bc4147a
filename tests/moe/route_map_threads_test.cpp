// Multi-rank (threads backend): the collective route-map builder over 2-4 ranks equals the pure builder
// fed with every rank's routes, for every capacity rule and placement, with uneven and empty ranks; the
// score-bias update sums counts over the group; init is layout independent; `local` refuses EP > 1.
#include <gtest/gtest.h>

#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/moe_layer.hpp"
#include "expar/moe/route_map.hpp"
#include "expar/moe/score_bias.hpp"

namespace expar {
namespace {

// Routes of rank s (same seed on every rank, so any rank can build any rank's routes): T_s tokens, K
// distinct experts each; rank 1 has no tokens.
Tensor routes_of(int s, int e_count, int k) {
  const int64_t t_count = s == 1 ? 0 : 3 + 4 * s;
  Tensor idx = Tensor::empty({t_count, k}, DType::I32);
  for (int64_t t = 0; t < t_count; ++t) {
    std::vector<int> pool(static_cast<size_t>(e_count));
    for (int e = 0; e < e_count; ++e) pool[static_cast<size_t>(e)] = e;
    for (int j = 0; j < k; ++j) {
      const auto pick =
          static_cast<size_t>(j) + random_u32(7, static_cast<uint64_t>(s), static_cast<uint64_t>(t * k + j)) %
                                       static_cast<uint32_t>(e_count - j);
      std::swap(pool[static_cast<size_t>(j)], pool[pick]);
      idx.data<int32_t>()[t * k + j] = pool[static_cast<size_t>(j)];
    }
  }
  return idx;
}

// Everything of a map as plain integers, so that nothing allocated inside a rank outlives run_ranks.
std::vector<int64_t> flatten(const RouteMap& m) {
  std::vector<int64_t> v{m.tokens, m.capacity_rows, m.recv_rows, m.dropped};
  for (int64_t i = 0; i < m.dst_rank.numel(); ++i) v.push_back(m.dst_rank.data<int32_t>()[i]);
  for (int64_t i = 0; i < m.dst_row.numel(); ++i) v.push_back(m.dst_row.data<int32_t>()[i]);
  for (const auto* list : {&m.accepted, &m.expert_offsets, &m.send_counts, &m.recv_counts})
    v.insert(v.end(), list->begin(), list->end());
  return v;
}

TEST(RouteMapThreads, CollectiveBuilderEqualsPureBuilder) {
  const int e_count = 12, k = 3;
  for (int m = 2; m <= 4; ++m)
    for (PlacementKind kind : {PlacementKind::Contiguous, PlacementKind::RoundRobin})
      for (CapacityPolicy policy :
           {CapacityPolicy::dropless(), CapacityPolicy::with(CapacityRule::Source, 0.6),
            CapacityPolicy::with(CapacityRule::Rank, 0.6), CapacityPolicy::with(CapacityRule::Expert, 0.6)}) {
        ExpertPlacement placement(e_count, m, kind);
        std::vector<std::vector<int64_t>> got(static_cast<size_t>(m)), want(static_cast<size_t>(m));
        std::vector<std::vector<int64_t>> sends(static_cast<size_t>(m)), recvs(static_cast<size_t>(m));
        std::vector<int64_t> recv_rows(static_cast<size_t>(m));
        run_ranks(m, [&](Comm& world) {
          const int r = world.rank();
          RouteMap mine = build_route_map(routes_of(r, e_count, k), world, placement, policy);
          got[static_cast<size_t>(r)] = flatten(mine);
          sends[static_cast<size_t>(r)] = mine.send_counts;
          recvs[static_cast<size_t>(r)] = mine.recv_counts;
          recv_rows[static_cast<size_t>(r)] = mine.recv_rows;
          // The pure builder with every rank's routes, built locally.
          std::vector<int64_t> requests, tokens;
          for (int s = 0; s < m; ++s) {
            Tensor idx = routes_of(s, e_count, k);
            auto c = count_requests(idx, e_count);
            requests.insert(requests.end(), c.begin(), c.end());
            tokens.push_back(idx.dim(0));
          }
          want[static_cast<size_t>(r)] =
              flatten(build_route_map(routes_of(r, e_count, k), r, requests, tokens, placement, policy));
        });
        for (int r = 0; r < m; ++r)
          EXPECT_EQ(got[static_cast<size_t>(r)], want[static_cast<size_t>(r)])
              << m << " ranks, " << placement_name(kind) << ", " << capacity_rule_name(policy.rule)
              << ", rank " << r;
      }
}

TEST(RouteMapThreads, ScoreBiasUsesGroupCounts) {
  std::vector<std::vector<float>> biases(2);
  run_ranks(2, [&](Comm& world) {
    // Rank 0 counts {3, 0, 1, 0}, rank 1 {0, 1, 1, 2}: group {3, 1, 2, 2}, mean 2.
    std::vector<int64_t> counts =
        world.rank() == 0 ? std::vector<int64_t>{3, 0, 1, 0} : std::vector<int64_t>{0, 1, 1, 2};
    std::vector<float> bias(4, 0.0f);
    update_score_bias(bias, counts, 0.5f, world);
    biases[static_cast<size_t>(world.rank())] = bias;
  });
  for (const auto& b : biases) EXPECT_EQ(b, (std::vector<float>{-0.5f, 0.5f, 0.0f, 0.0f}));
}

TEST(MoeInit, GlobalExpertWeightsDoNotDependOnTheLayout) {
  MoeConfig c;
  c.router.num_experts = 8;
  c.router.top_k = 2;
  c.model_dim = 3;
  c.hidden_dim = 5;
  auto expert_values = [&](int m, PlacementKind kind) {
    // [e] -> concatenated w1, w3, w2 of global expert e.
    std::vector<std::vector<float>> out(8);
    ExpertPlacement placement(8, m, kind);
    for (int r = 0; r < m; ++r) {
      MoeParams p;
      p.w_router = Tensor::empty({8, 3});
      const int64_t el = placement.local_count();
      p.experts = {Tensor::empty({el, 5, 3}), Tensor::empty({el, 5, 3}), Tensor::empty({el, 3, 5})};
      init_moe_params(p, c, placement, r, "layers.1.moe", 99);
      for (int l = 0; l < el; ++l) {
        auto& v = out[static_cast<size_t>(placement.global_expert(r, l))];
        for (const Tensor* t : {&p.experts.w1, &p.experts.w3, &p.experts.w2}) {
          auto s = t->rows(l, l + 1).span<float>();
          v.insert(v.end(), s.begin(), s.end());
        }
      }
    }
    return out;
  };
  const auto reference = expert_values(1, PlacementKind::Contiguous);
  EXPECT_NE(reference[0], reference[1]);
  for (int m : {2, 4, 8})
    for (PlacementKind kind : {PlacementKind::Contiguous, PlacementKind::RoundRobin})
      EXPECT_EQ(expert_values(m, kind), reference) << m << " ranks " << placement_name(kind);
}

TEST(MoeLayerThreads, LocalPathRefusesAnEpGroup) {
  std::vector<std::string> messages(2);
  EXPECT_THROW(run_ranks(2,
                         [&](Comm& world) {
                           MoeConfig c;
                           c.router.num_experts = 4;
                           c.router.top_k = 2;
                           c.model_dim = 4;
                           c.hidden_dim = 4;
                           try {
                             MoeLayer layer(c, {}, world);
                           } catch (const Error& e) {
                             messages[static_cast<size_t>(world.rank())] = e.what();
                             throw;
                           }
                         }),
               Error);
  for (const auto& m : messages)
    EXPECT_NE(m.find("path 'local' needs an EP group of 1"), std::string::npos) << m;
}

}  // namespace
}  // namespace expar
