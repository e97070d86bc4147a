// Route map and capacity policy: seed 000 Figures 15/16 (two ranks, top-2, E = 4, T = 5 per rank, cf = 1.2),
// reproduced exactly under the `source` rule, and the same example under the `rank`, `expert` and dropless
// rules with their drops worked out by hand.
#include "expar/moe/route_map.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <numeric>
#include <span>
#include <vector>

#include "core/expect_error.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/replica_deal.hpp"

namespace expar {
namespace {

using testing::expect_error;
using Routes = std::vector<std::vector<int>>;  // [T][K] expert ids

Tensor make_idx(const Routes& routes, int k) {
  Tensor t = Tensor::empty({static_cast<int64_t>(routes.size()), k}, DType::I32);
  for (size_t i = 0; i < routes.size(); ++i)
    for (int j = 0; j < k; ++j) t.data<int32_t>()[i * k + j] = routes[i][static_cast<size_t>(j)];
  return t;
}

// Builds every rank's map with the pure builder, gathering the requests as the collective would, every rank
// passing the same replica deal starts.
std::vector<RouteMap> build_all(const std::vector<Routes>& per_rank, int k, const ExpertPlacement& placement,
                                const CapacityPolicy& policy, std::span<const int64_t> replica_starts = {}) {
  std::vector<int64_t> requests, tokens;
  std::vector<Tensor> idx;
  for (const Routes& r : per_rank) {
    idx.push_back(make_idx(r, k));
    auto c = count_requests(idx.back(), placement.num_experts());
    requests.insert(requests.end(), c.begin(), c.end());
    tokens.push_back(static_cast<int64_t>(r.size()));
  }
  std::vector<RouteMap> maps;
  for (int s = 0; s < static_cast<int>(per_rank.size()); ++s)
    maps.push_back(build_route_map(idx[static_cast<size_t>(s)], s, requests, tokens, placement, policy, -1,
                                   replica_starts));
  return maps;
}

// Figure 15/16: tokens A-E on rank 0, F-J on rank 1; experts 0,1 on rank 0 and 2,3 on rank 1.
const std::vector<Routes> kFigure = {
    {{1, 2}, {0, 1}, {3, 1}, {0, 1}, {1, 2}},  // A B C D E
    {{2, 0}, {0, 1}, {3, 0}, {1, 3}, {1, 2}},  // F G H I J
};

struct Expected {
  std::vector<std::vector<int>> rank, row;  // [T][K]
};

void expect_map(const RouteMap& map, const Expected& want, const char* what) {
  ASSERT_EQ(map.tokens, static_cast<int64_t>(want.rank.size()));
  for (int64_t t = 0; t < map.tokens; ++t)
    for (int k = 0; k < map.top_k; ++k) {
      EXPECT_EQ(map.rank_of(t, k), want.rank[static_cast<size_t>(t)][static_cast<size_t>(k)])
          << what << " rank " << map.ep_rank << " token " << static_cast<char>('A' + 5 * map.ep_rank + t)
          << " k " << k;
      EXPECT_EQ(map.row_of(t, k), want.row[static_cast<size_t>(t)][static_cast<size_t>(k)])
          << what << " rank " << map.ep_rank << " token " << static_cast<char>('A' + 5 * map.ep_rank + t)
          << " k " << k;
    }
}

TEST(RouteMapTwoRankExample, SourceRuleReproducesEveryRankAndRow) {
  ExpertPlacement placement(4, 2);
  // B = ceil(1.2·5·2/2) = 6 rows per (source, destination); capacity 2·6 = 12. Rank 0 sends 7 routes to
  // rank 0 (B→0, D→0, then A→1, B→1, C→1, D→1, E→1 in local-expert-major order): E→1 is the 7th and drops.
  auto maps = build_all(kFigure, 2, placement, CapacityPolicy::with(CapacityRule::Source, 1.2));
  expect_map(maps[0], {{{0, 1}, {0, 0}, {1, 0}, {0, 0}, {-1, 1}}, {{5, 0}, {0, 6}, {4, 7}, {1, 8}, {-1, 1}}},
             "source");
  expect_map(maps[1], {{{1, 0}, {0, 0}, {1, 0}, {0, 1}, {0, 1}}, {{2, 2}, {3, 9}, {5, 4}, {10, 6}, {11, 3}}},
             "source");
  for (const RouteMap& m : maps) {
    EXPECT_EQ(m.capacity_rows, 12);
    EXPECT_EQ(m.accepted, maps[0].accepted);
  }
  EXPECT_EQ(maps[0].dropped, 1);
  EXPECT_EQ(maps[1].dropped, 0);
  EXPECT_EQ(maps[0].recv_rows, 12);
  EXPECT_EQ(maps[1].recv_rows, 7);
  EXPECT_EQ(maps[0].expert_offsets, (std::vector<int64_t>{0, 5, 12}));
  EXPECT_EQ(maps[1].expert_offsets, (std::vector<int64_t>{0, 4, 7}));
  EXPECT_EQ(maps[0].send_counts, (std::vector<int64_t>{6, 3}));
  EXPECT_EQ(maps[1].send_counts, (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(maps[0].recv_counts, (std::vector<int64_t>{6, 6}));
  EXPECT_EQ(maps[1].recv_counts, (std::vector<int64_t>{3, 4}));
  // Drop rate: rank 0 1/10, rank 1 0 -> mean 0.05. Utilisation: rank 0 12/12, rank 1 7/12 -> max 1.
  EXPECT_DOUBLE_EQ(maps[1].group_drop_rate(), 0.05);
  EXPECT_DOUBLE_EQ(maps[0].utilisation_of(1), 7.0 / 12.0);
  EXPECT_DOUBLE_EQ(maps[1].max_utilisation(), 1.0);
}

TEST(RouteMapTwoRankExample, RankRuleDropsTheLastSourceRanksRoute) {
  ExpertPlacement placement(4, 2);
  // C = max(1, ceil(1.2·5·2)) = 12 rows per destination, granted expert-major then source rank. Rank 0's
  // requests: expert 0: 2 (B, D) + 3 (F, G, H) = 5; expert 1: 5 (A..E from rank 0), then rank 1's G, I fill
  // rows 10, 11 and J→1 (13th) drops. Rank 1 receives 7 <= 12.
  auto maps = build_all(kFigure, 2, placement, CapacityPolicy::with(CapacityRule::Rank, 1.2));
  expect_map(maps[0], {{{0, 1}, {0, 0}, {1, 0}, {0, 0}, {0, 1}}, {{5, 0}, {0, 6}, {4, 7}, {1, 8}, {9, 1}}},
             "rank");
  expect_map(maps[1],
             {{{1, 0}, {0, 0}, {1, 0}, {0, 1}, {-1, 1}}, {{2, 2}, {3, 10}, {5, 4}, {11, 6}, {-1, 3}}},
             "rank");
  EXPECT_EQ(maps[0].dropped, 0);
  EXPECT_EQ(maps[1].dropped, 1);
  EXPECT_EQ(maps[0].capacity_rows, 12);
  EXPECT_EQ(maps[0].recv_rows, 12);
}

TEST(RouteMapTwoRankExample, ExpertRuleCapsEachSourceExpertPair) {
  ExpertPlacement placement(4, 2);
  // c = ceil(1.2·5·2/4) = 3 rows per (source, expert). Rank 0 has 5 routes to expert 1 (A, B, C, D, E): D→1
  // and E→1 drop. Every other (source, expert) pair has at most 3 routes. Capacity 2 ranks·2 experts·3 = 12.
  auto maps = build_all(kFigure, 2, placement, CapacityPolicy::with(CapacityRule::Expert, 1.2));
  expect_map(maps[0],
             {{{0, 1}, {0, 0}, {1, 0}, {0, -1}, {-1, 1}}, {{5, 0}, {0, 6}, {4, 7}, {1, -1}, {-1, 1}}},
             "expert");
  expect_map(maps[1], {{{1, 0}, {0, 0}, {1, 0}, {0, 1}, {0, 1}}, {{2, 2}, {3, 8}, {5, 4}, {9, 6}, {10, 3}}},
             "expert");
  EXPECT_EQ(maps[0].dropped, 2);
  EXPECT_EQ(maps[1].dropped, 0);
  EXPECT_EQ(maps[0].capacity_rows, 12);
  EXPECT_EQ(maps[0].recv_rows, 11);
  EXPECT_DOUBLE_EQ(maps[0].group_drop_rate(), 0.1);
}

TEST(RouteMapTwoRankExample, DroplessAcceptsEverything) {
  ExpertPlacement placement(4, 2);
  auto maps = build_all(kFigure, 2, placement, CapacityPolicy::dropless());
  // Rank 0: expert 0 rows B D F G H (0-4); expert 1 rows A B C D E (5-9), then G I J (10-12).
  expect_map(maps[0], {{{0, 1}, {0, 0}, {1, 0}, {0, 0}, {0, 1}}, {{5, 0}, {0, 6}, {4, 7}, {1, 8}, {9, 1}}},
             "dropless");
  expect_map(maps[1], {{{1, 0}, {0, 0}, {1, 0}, {0, 1}, {0, 1}}, {{2, 2}, {3, 10}, {5, 4}, {11, 6}, {12, 3}}},
             "dropless");
  // Dropless bound: Σ_s T_s·min(K, E_L) = 10·2 = 20 rows on every rank.
  EXPECT_EQ(maps[0].capacity_rows, 20);
  EXPECT_EQ(maps[1].capacity_rows, 20);
  EXPECT_EQ(maps[0].recv_rows, 13);
  EXPECT_EQ(maps[0].dropped + maps[1].dropped, 0);
  EXPECT_DOUBLE_EQ(maps[0].group_drop_rate(), 0.0);
}

// Every accepted route has a distinct (rank, row), rows are packed from 0 on each rank, and the layout is
// expert-major, then source rank, then (token, k): checked on random routes for every rule and placement.
// Sources other than the partitions (inference's agrs path, route_map.hpp). One partition holding all four
// experts, worked out by hand: expert-major, then source, then token, then k; every destination is 0.
TEST(RouteMapPartitions, OnePartitionForTwoSourcesByHand) {
  ExpertPlacement one(4, 1);
  std::vector<int64_t> requests, tokens;
  std::vector<Tensor> idx;
  for (const Routes& r : kFigure) {
    idx.push_back(make_idx(r, 2));
    auto c = count_requests(idx.back(), 4);
    requests.insert(requests.end(), c.begin(), c.end());
    tokens.push_back(5);
  }
  for (int s = 0; s < 2; ++s) {
    RouteMap m =
        build_route_map(idx[static_cast<size_t>(s)], s, requests, tokens, one, CapacityPolicy::dropless(),
                        /*partition=*/0);
    EXPECT_EQ(m.ep_size, 2);
    EXPECT_EQ(m.partitions, 1);
    EXPECT_FALSE(m.sources_are_partitions());
    EXPECT_EQ(m.expert_offsets, (std::vector<int64_t>{0, 5, 13, 17, 20}));
    EXPECT_EQ(m.recv_rows, 20);
    EXPECT_EQ(m.send_counts, (std::vector<int64_t>{10}));
    EXPECT_EQ(m.recv_counts, (std::vector<int64_t>{10, 10}));
    const Expected want = s == 0 ? Expected{{{0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}},
                                            {{5, 13}, {0, 6}, {17, 7}, {1, 8}, {9, 14}}}
                                 : Expected{{{0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}},
                                            {{15, 2}, {3, 10}, {18, 4}, {11, 19}, {12, 16}}};
    expect_map(m, want, "one partition");
  }
}

// Splitting each source in two (four sources, two partitions, as variable EP's TP ranks are) moves no row:
// the same tokens in the same order land where the two-source map puts them, and each source's partition
// sees its partition's offsets.
TEST(RouteMapPartitions, SplitSourcesKeepEveryRow) {
  ExpertPlacement two(4, 2);
  const auto whole = build_all(kFigure, 2, two, CapacityPolicy::dropless());
  std::vector<Routes> split;
  for (const Routes& r : kFigure) {
    split.emplace_back(r.begin(), r.begin() + 2);
    split.emplace_back(r.begin() + 2, r.end());
  }
  std::vector<int64_t> requests, tokens;
  std::vector<Tensor> idx;
  for (const Routes& r : split) {
    idx.push_back(make_idx(r, 2));
    auto c = count_requests(idx.back(), 4);
    requests.insert(requests.end(), c.begin(), c.end());
    tokens.push_back(static_cast<int64_t>(r.size()));
  }
  for (int s = 0; s < 4; ++s) {
    const int partition = s / 2;
    RouteMap m = build_route_map(idx[static_cast<size_t>(s)], s, requests, tokens, two,
                                 CapacityPolicy::dropless(), partition);
    const RouteMap& w = whole[static_cast<size_t>(s / 2)];
    const int64_t first = s % 2 == 0 ? 0 : 2;
    for (int64_t t = 0; t < m.tokens; ++t)
      for (int k = 0; k < 2; ++k) {
        EXPECT_EQ(m.rank_of(t, k), w.rank_of(first + t, k)) << "source " << s << " token " << t;
        EXPECT_EQ(m.row_of(t, k), w.row_of(first + t, k)) << "source " << s << " token " << t;
      }
    EXPECT_EQ(m.expert_offsets, whole[static_cast<size_t>(partition)].expert_offsets);
    EXPECT_EQ(m.capacity_rows, w.capacity_rows);
    EXPECT_EQ(m.send_counts.size(), 2u);
    EXPECT_EQ(m.recv_counts.size(), 4u);
  }
  // Only the dropless policy is defined when sources and partitions differ; a partition must exist; and
  // without one the sources must be the placement's ranks.
  EXPECT_THROW(
      build_route_map(idx[0], 0, requests, tokens, two, CapacityPolicy::with(CapacityRule::Source, 1.2), 0),
      Error);
  EXPECT_THROW(build_route_map(idx[0], 0, requests, tokens, two, CapacityPolicy::dropless(), 2), Error);
  EXPECT_THROW(build_route_map(idx[0], 0, requests, tokens, two, CapacityPolicy::dropless()), Error);
}

TEST(RouteMap, LayoutInvariantsOnRandomRoutes) {
  for (PlacementKind kind : {PlacementKind::Contiguous, PlacementKind::RoundRobin}) {
    for (CapacityRule rule :
         {CapacityRule::Dropless, CapacityRule::Source, CapacityRule::Rank, CapacityRule::Expert}) {
      const int m = 3, e_count = 6, k = 2;
      ExpertPlacement placement(e_count, m, kind);
      std::vector<Routes> per_rank;
      uint32_t state = 12345;
      auto next = [&] { return (state = state * 1103515245u + 12345u) >> 16; };
      for (int s = 0; s < m; ++s) {
        Routes r;
        for (int t = 0; t < 4 + 3 * s; ++t) {  // uneven T: 4, 7, 10
          int a = static_cast<int>(next() % (e_count - 1)), b = static_cast<int>(next() % e_count);
          if (b == a) b = e_count - 1;
          r.push_back({a, b});
        }
        per_rank.push_back(r);
      }
      CapacityPolicy policy =
          rule == CapacityRule::Dropless ? CapacityPolicy::dropless() : CapacityPolicy::with(rule, 0.7);
      auto maps = build_all(per_rank, k, placement, policy);
      // key (dst rank, row) -> (expert local index, source, token, k)
      std::vector<std::vector<std::array<int, 4>>> seen(m);
      int64_t dropped = 0, requested = 0;
      for (int s = 0; s < m; ++s) {
        dropped += maps[static_cast<size_t>(s)].dropped;
        for (int t = 0; t < static_cast<int>(per_rank[static_cast<size_t>(s)].size()); ++t)
          for (int j = 0; j < k; ++j) {
            ++requested;
            const RouteMap& map = maps[static_cast<size_t>(s)];
            if (!map.valid(t, j)) {
              EXPECT_EQ(map.rank_of(t, j), -1);
              continue;
            }
            const int e = per_rank[static_cast<size_t>(s)][static_cast<size_t>(t)][static_cast<size_t>(j)];
            const int r = map.rank_of(t, j);
            EXPECT_EQ(r, placement.owner(e));
            auto& rows = seen[static_cast<size_t>(r)];
            const auto row = static_cast<size_t>(map.row_of(t, j));
            ASSERT_LT(static_cast<int64_t>(row), map.capacity_rows);
            if (rows.size() <= row) rows.resize(row + 1, {-1, -1, -1, -1});
            EXPECT_EQ(rows[row][0], -1) << "two routes share rank " << r << " row " << row;
            rows[row] = {placement.local_index(e), s, t, j};
          }
      }
      EXPECT_EQ(
          dropped, requested - [&] {
            int64_t n = 0;
            for (int64_t a : maps[0].accepted) n += a;
            return n;
          }());
      for (int r = 0; r < m; ++r) {
        const auto& rows = seen[static_cast<size_t>(r)];
        EXPECT_EQ(static_cast<int64_t>(rows.size()), maps[static_cast<size_t>(r)].recv_rows);
        for (size_t i = 0; i < rows.size(); ++i) {
          EXPECT_NE(rows[i][0], -1) << "hole at rank " << r << " row " << i;
          if (i > 0) {
            EXPECT_LT(rows[i - 1], rows[i]) << "order broken at rank " << r << " row " << i;
          }
        }
        // Offsets agree with the rows' experts.
        const auto& off = maps[static_cast<size_t>(r)].expert_offsets;
        for (size_t i = 0; i < rows.size(); ++i) {
          const auto l = static_cast<size_t>(rows[i][0]);
          EXPECT_GE(static_cast<int64_t>(i), off[l]);
          EXPECT_LT(static_cast<int64_t>(i), off[l + 1]);
        }
        EXPECT_LE(maps[static_cast<size_t>(r)].recv_rows, maps[0].capacity_rows);
      }
    }
  }
}

TEST(RouteMap, InvalidRoutesAndZeroTokens) {
  ExpertPlacement placement(4, 2);
  auto maps =
      build_all({{{1, -1}, {-1, -1}}, {}}, 2, placement, CapacityPolicy::with(CapacityRule::Source, 1.0));
  EXPECT_EQ(maps[0].invalid, 3);
  EXPECT_EQ(maps[0].dropped, 0);
  EXPECT_EQ(maps[0].rank_of(0, 0), 0);
  EXPECT_EQ(maps[0].row_of(0, 0), 0);
  EXPECT_EQ(maps[0].row_of(0, 1), -1);
  EXPECT_EQ(maps[1].tokens, 0);
  EXPECT_EQ(maps[1].recv_rows, 0);
  EXPECT_DOUBLE_EQ(maps[1].drop_rate_of(1), 0.0);
}

TEST(RouteMap, RejectsBadInput) {
  ExpertPlacement placement(4, 1);
  EXPECT_THROW(count_requests(make_idx({{1, 1}}, 2), 4), Error);  // same expert twice
  EXPECT_THROW(count_requests(make_idx({{1, 4}}, 2), 4), Error);  // out of range
  for (double cf : {0.0, -1.0}) {
    try {
      build_all({{{0, 1}}}, 2, placement, CapacityPolicy::with(CapacityRule::Source, cf));
      ADD_FAILURE() << "cf=" << cf << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("capacity factor"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(capacity_rule_from_name("bogus"), Error);
  EXPECT_EQ(capacity_rule_from_name("expert"), CapacityRule::Expert);
}

TEST(Capacity, CeilForgivesDecimalRounding) {
  EXPECT_EQ(ceil_rows(1.2 * 5 * 2 / 2), 6);
  EXPECT_EQ(ceil_rows(6.000001), 7);
  EXPECT_EQ(ceil_rows(0.0), 0);
  EXPECT_EQ(ceil_rows(0.3), 1);
}

// Redundant experts: E = 3 on 2 ranks in S = 4 slots {0, 1, 2, 0} (expert 0 also in slot 3, on rank 1).
// Expert 0's five routes, in (source, token, k) order, are dealt over its slots 0, 3, 0, 3, 0: rank 0's
// three from replica 0, rank 1's two from replica 3 mod 2 = 1 (slot 3) on. Worked by hand:
//   slot requests  source 0: slot0 2, slot1 2, slot2 1, slot3 1;  source 1: slot0 1, slot1 0, slot2 2, slot3
//   1 rank 0 rows: slot 0 [0, 3) (source 0: 0, 1; source 1: 2), slot 1 [3, 5) rank 1 rows: slot 2 [0, 3)
//   (source 0: 0; source 1: 1, 2), slot 3 [3, 5) (source 0: 3; source 1: 4)
TEST(RouteMap, ReplicasTakeTheRoutesOfTheirExpertInTurn) {
  const ExpertPlacement placement = ExpertPlacement::from_slots(3, 2, {0, 1, 2, 0});
  const std::vector<Routes> routes = {{{0, 1}, {0, 2}, {1, 0}}, {{0, 2}, {2, 0}}};
  const auto maps = build_all(routes, 2, placement, CapacityPolicy::dropless());
  EXPECT_EQ(maps[0].num_experts, 3);
  EXPECT_EQ(maps[0].num_slots, 4);
  EXPECT_EQ(maps[0].requested, (std::vector<int64_t>{2, 2, 1, 1, 1, 0, 2, 1}));
  EXPECT_EQ(maps[0].accepted, maps[0].requested);
  expect_map(maps[0], {{{0, 0}, {1, 1}, {0, 0}}, {{0, 3}, {3, 0}, {4, 1}}}, "replicas");
  expect_map(maps[1], {{{1, 1}, {1, 0}}, {{4, 1}, {2, 2}}}, "replicas");
  EXPECT_EQ(maps[0].expert_offsets, (std::vector<int64_t>{0, 3, 5}));
  EXPECT_EQ(maps[1].expert_offsets, (std::vector<int64_t>{0, 3, 5}));
  EXPECT_EQ(maps[0].send_counts, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(maps[1].recv_counts, (std::vector<int64_t>{2, 3}));
}

// The deal continued from a start (ReplicaDeal::starts()): E = 2 on 2 ranks in S = 4 slots {0, 0, 1, 0}
// (expert 0 in slots 0, 1 on rank 0 and 3 on rank 1), top-1, expert 0's deal starting at its replica 1.
// Source 0 routes tokens 0, 0; source 1 routes 0, 1, 0. Expert 0's four routes, in (source, token) order, go
// to replicas (1 + j) mod 3 = 1, 2, 0, 1: slots 1, 3, 0, 1. Worked by hand: slot requests of source 0 {0, 1,
// 0, 1}, of source 1 {1, 1, 1, 0}. Rank 0's rows: slot 0 [0, 1) (source 1: 0), slot 1 [1, 3) (source 0: 1;
// source 1: 2). Rank 1's rows: slot 2 [0, 1) (source 1: 0), slot 3 [1, 2) (source 0: 1). The deal then moves
// on by the four routes: expert 0 to (1 + 4) mod 3 = 2, expert 1 stays at 0.
TEST(RouteMap, ReplicaDealContinuesFromItsStart) {
  const ExpertPlacement placement = ExpertPlacement::from_slots(2, 2, {0, 0, 1, 0});
  const std::vector<Routes> routes = {{{0}, {0}}, {{0}, {1}, {0}}};
  const std::vector<int64_t> starts{1, 0};
  const auto maps = build_all(routes, 1, placement, CapacityPolicy::dropless(), starts);
  EXPECT_EQ(maps[0].requested, (std::vector<int64_t>{0, 1, 0, 1, 1, 1, 1, 0}));
  for (const RouteMap& m : maps) {
    EXPECT_EQ(m.requested, maps[0].requested);
    EXPECT_EQ(m.accepted, m.requested);
  }
  expect_map(maps[0], {{{0}, {1}}, {{1}, {1}}}, "deal from 1");
  expect_map(maps[1], {{{0}, {1}, {0}}, {{0}, {0}, {2}}}, "deal from 1");
  EXPECT_EQ(maps[0].expert_offsets, (std::vector<int64_t>{0, 1, 3}));
  EXPECT_EQ(maps[1].expert_offsets, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(maps[0].send_counts, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(maps[1].send_counts, (std::vector<int64_t>{2, 1}));
  // Every rank moves its deal on alike from its own map.
  for (const RouteMap& m : maps) {
    ReplicaDeal deal;
    deal.advance(build_all(routes, 1, placement, CapacityPolicy::dropless())[0], placement);
    EXPECT_EQ(std::vector<int64_t>(deal.starts().begin(), deal.starts().end()), (std::vector<int64_t>{1, 0}))
        << "from 0, by 4 routes over 3 replicas";
    deal.advance(m, placement);
    EXPECT_EQ(std::vector<int64_t>(deal.starts().begin(), deal.starts().end()), (std::vector<int64_t>{2, 0}))
        << "from 1, by 4 routes over 3 replicas";
  }
}

// A start moves routes between replicas before the capacity policy, which then caps the slots. The example of
// ReplicasTakeTheRoutesOfTheirExpertInTurn with expert 0's deal from replica 1 (routes to slots 3, 0, 3 from
// source 0, then (1 + 3) mod 2 = 0: slots 0, 3 from source 1) under the expert rule at cf 1, c_s =
// ceil(T_s·K/S): 2 rows for source 0 (T 3), 1 for source 1 (T 2). Worked by hand: slot requests of source 0
// {1, 2, 1, 2}, of source 1 {1, 0, 2, 1}; accepted the same but source 1's second route to slot 2, which
// drops. Rank 0's rows: slot 0 [0, 2) (source 0: 0; source 1: 1), slot 1 [2, 4) (source 0: 2, 3). Rank 1's
// rows: slot 2 [0, 2) (source 0: 0; source 1: 1), slot 3 [2, 5) (source 0: 2, 3; source 1: 4). Capacity: 2
// ranks · 2 slots · ceil(3·2/4) = 8 rows.
TEST(RouteMap, ReplicaDealStartComesBeforeTheCapacityPolicy) {
  const ExpertPlacement placement = ExpertPlacement::from_slots(3, 2, {0, 1, 2, 0});
  const std::vector<Routes> routes = {{{0, 1}, {0, 2}, {1, 0}}, {{0, 2}, {2, 0}}};
  const std::vector<int64_t> starts{1, 0, 0};
  const auto maps = build_all(routes, 2, placement, CapacityPolicy::with(CapacityRule::Expert, 1.0), starts);
  for (const RouteMap& m : maps) {
    EXPECT_EQ(m.requested, (std::vector<int64_t>{1, 2, 1, 2, 1, 0, 2, 1}));
    EXPECT_EQ(m.accepted, (std::vector<int64_t>{1, 2, 1, 2, 1, 0, 1, 1}));
    EXPECT_EQ(m.capacity_rows, 8);
  }
  expect_map(maps[0], {{{1, 0}, {0, 1}, {0, 1}}, {{2, 2}, {0, 0}, {3, 3}}}, "expert rule, deal from 1");
  expect_map(maps[1], {{{0, 1}, {-1, 1}}, {{1, 1}, {-1, 4}}}, "expert rule, deal from 1");
  EXPECT_EQ(maps[0].dropped, 0);
  EXPECT_EQ(maps[1].dropped, 1);
  EXPECT_EQ(maps[0].expert_offsets, (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(maps[1].expert_offsets, (std::vector<int64_t>{0, 2, 5}));
  EXPECT_EQ(maps[0].recv_counts, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(maps[1].recv_counts, (std::vector<int64_t>{3, 2}));
}

// Starts that do not fit the placement are refused naming the value and the fix.
TEST(RouteMap, ReplicaDealStartsMustFitThePlacement) {
  const ExpertPlacement placement = ExpertPlacement::from_slots(3, 2, {0, 1, 2, 0});
  const std::vector<Routes> routes = {{{0, 1}}, {{2, 0}}};
  const std::vector<int64_t> short_starts{0, 0};
  expect_error([&] { build_all(routes, 2, placement, CapacityPolicy::dropless(), short_starts); },
               {"2 replica deal starts for 3 experts", "one per logical expert"});
  const std::vector<int64_t> stale{0, 1, 0};  // expert 1 has one replica
  expect_error([&] { build_all(routes, 2, placement, CapacityPolicy::dropless(), stale); },
               {"expert 1 starts at replica 1", "has 1 replica(s)", "[0, 1)", "reset the deal"});
  const std::vector<int64_t> negative{-1, 0, 0};
  expect_error(
      [&] {
        slot_requests(std::vector<int64_t>{1, 1, 0, 1, 0, 1}, 2, placement, negative);
      },
      {"expert 0 starts at replica -1"});
}

// Batch-1 decode over many steps: each step, each of 4 sources has zero or one token (top-2 of 6 experts,
// skewed to the replicated ones). Every rank builds its maps from the same gathered matrix and its own deal:
// the four deals stay equal, every route lands on the slot an independent simulation of one deal over the
// whole run picks (a counter per expert over (step, source, token, k)), and each replicated expert's rows
// split within 1 over its replicas after every step. Maps that start every deal at replica 0 pile those
// rows on the first replicas (the run would not see a deal that is ignored).
TEST(RouteMap, ReplicaDealSpreadsBatchOneDecodeOverStepsOnEveryRank) {
  constexpr int kSources = 4, kExperts = 6, kSteps = 40;
  // Expert 0 and 1 in three slots, 2 and 3 in two, 4 and 5 in one; 3 slots per rank.
  const ExpertPlacement placement =
      ExpertPlacement::from_slots(kExperts, kSources, {0, 1, 2, 0, 1, 3, 0, 2, 4, 1, 3, 5});
  std::vector<ReplicaDeal> deals(kSources);
  std::vector<int64_t> counter(kExperts, 0);                // the simulation's deal
  std::vector<int64_t> rows(12, 0), rows_from_zero(12, 0);  // per slot, over the steps
  uint32_t lcg = 12345;
  auto draw = [&](uint32_t n) {
    lcg = lcg * 1664525u + 1013904223u;
    return (lcg >> 8) % n;
  };
  for (int step = 0; step < kSteps; ++step) {
    std::vector<Routes> routes(kSources);
    for (Routes& r : routes) {
      if (draw(4) == 0) continue;  // a source without a token this step
      const int first = static_cast<int>(draw(3) == 0 ? 2 + draw(4) : draw(2));
      int second = static_cast<int>(draw(kExperts));
      if (second == first) second = (first + 1) % kExperts;
      r.push_back({first, second});
    }
    std::vector<RouteMap> maps;
    for (int s = 0; s < kSources; ++s) {
      const std::vector<int64_t> starts(deals[static_cast<size_t>(s)].starts().begin(),
                                        deals[static_cast<size_t>(s)].starts().end());
      maps.push_back(
          build_all(routes, 2, placement, CapacityPolicy::dropless(), starts)[static_cast<size_t>(s)]);
    }
    for (int s = 0; s < kSources; ++s) {
      const RouteMap& m = maps[static_cast<size_t>(s)];
      EXPECT_EQ(m.requested, maps[0].requested) << "step " << step << " rank " << s;
      for (int64_t t = 0; t < m.tokens; ++t)
        for (int k = 0; k < 2; ++k) {
          const int e = routes[static_cast<size_t>(s)][static_cast<size_t>(t)][static_cast<size_t>(k)];
          const std::vector<int>& replicas = placement.expert_slots(e);
          int64_t& c = counter[static_cast<size_t>(e)];
          const int want = replicas[static_cast<size_t>(c % static_cast<int64_t>(replicas.size()))];
          ++c;
          // The slot the map chose: its partition's local slot whose rows hold the route's row.
          const RouteMap& holder = maps[static_cast<size_t>(m.rank_of(t, k))];
          int l = 0;
          while (holder.expert_offsets[static_cast<size_t>(l + 1)] <= m.row_of(t, k)) ++l;
          EXPECT_EQ(placement.slot(m.rank_of(t, k), l), want) << "step " << step << " source " << s;
          ++rows[static_cast<size_t>(want)];
        }
    }
    for (int s = 0; s < kSources; ++s)
      deals[static_cast<size_t>(s)].advance(maps[static_cast<size_t>(s)], placement);
    for (const ReplicaDeal& d : deals)
      EXPECT_TRUE(std::equal(d.starts().begin(), d.starts().end(), deals[0].starts().begin(),
                             deals[0].starts().end()))
          << "step " << step;
    const std::vector<RouteMap> from_zero = build_all(routes, 2, placement, CapacityPolicy::dropless());
    for (int s = 0; s < kSources; ++s)
      for (int slot = 0; slot < 12; ++slot)
        rows_from_zero[static_cast<size_t>(slot)] += from_zero[0].requested_of(s, slot);
    for (int e = 0; e < kExperts; ++e) {
      std::vector<int64_t> per_replica;
      for (int slot : placement.expert_slots(e)) per_replica.push_back(rows[static_cast<size_t>(slot)]);
      const auto [lo, hi] = std::minmax_element(per_replica.begin(), per_replica.end());
      EXPECT_LE(*hi - *lo, 1) << "expert " << e << " after step " << step;
    }
  }
  int64_t replicated = 0, worst_from_zero = 0;
  for (int e = 0; e < 4; ++e) {
    std::vector<int64_t> per_replica;
    for (int slot : placement.expert_slots(e)) {
      per_replica.push_back(rows_from_zero[static_cast<size_t>(slot)]);
      replicated += rows[static_cast<size_t>(slot)];
    }
    const auto [lo, hi] = std::minmax_element(per_replica.begin(), per_replica.end());
    worst_from_zero = std::max(worst_from_zero, *hi - *lo);
  }
  EXPECT_GE(replicated, 2 * kSteps);
  EXPECT_GT(worst_from_zero, 10) << "without the deal the first replicas take more";
}

// The rule's balance: a hot expert's routes split within 1 over its replicas, for the whole group and for
// every source, whatever the sources' counts.
TEST(RouteMap, ReplicaRuleSplitsAHotExpertWithinOne) {
  // E = 2 on 4 ranks in 8 slots: expert 0 in slots 0, 2, 4 (three replicas), expert 1 in the other five.
  const ExpertPlacement placement = ExpertPlacement::from_slots(2, 4, {0, 1, 0, 1, 0, 1, 1, 1});
  for (const std::vector<int64_t>& hot :
       {std::vector<int64_t>{7, 5, 0, 4}, std::vector<int64_t>{1, 1, 1, 1}, std::vector<int64_t>{2, 2, 2, 2},
        std::vector<int64_t>{0, 0, 10, 1}}) {
    std::vector<int64_t> requests;
    for (int64_t h : hot) requests.insert(requests.end(), {h, 3});
    const std::vector<int64_t> slots = slot_requests(requests, 4, placement);
    for (int e = 0; e < 2; ++e) {
      std::vector<int64_t> total;
      for (int s : placement.expert_slots(e)) {
        int64_t sum = 0;
        for (int src = 0; src < 4; ++src) {
          sum += slots[static_cast<size_t>(src * 8 + s)];
          // Each source's routes to e split within 1 too.
          for (int other : placement.expert_slots(e))
            EXPECT_LE(std::abs(slots[static_cast<size_t>(src * 8 + s)] -
                               slots[static_cast<size_t>(src * 8 + other)]),
                      1);
        }
        total.push_back(sum);
      }
      const auto [lo, hi] = std::minmax_element(total.begin(), total.end());
      EXPECT_LE(*hi - *lo, 1) << "expert " << e;
      int64_t want = 0;
      for (int src = 0; src < 4; ++src) want += requests[static_cast<size_t>(src * 2 + e)];
      EXPECT_EQ(std::accumulate(total.begin(), total.end(), int64_t{0}), want);
    }
  }
}

// Without replicas the slot matrix is the request matrix (slot id = expert id, round-robin included).
TEST(RouteMap, WithoutReplicasSlotsAreExperts) {
  const ExpertPlacement placement(4, 2, PlacementKind::RoundRobin);
  const std::vector<int64_t> requests{1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(slot_requests(requests, 2, placement), requests);
}

// An explicit table without replicas may permute the experts (EPLB's R = 0 placement): slot s takes the
// requests of its expert. By hand: 4 experts in slots {2, 0, 3, 1} over 2 ranks, 2 sources.
TEST(RouteMap, APermutingTableWithoutReplicasMapsRequestsThroughIt) {
  const ExpertPlacement placement = ExpertPlacement::from_slots(4, 2, {2, 0, 3, 1});
  const std::vector<int64_t> requests{1, 2, 3, 4, 5, 6, 7, 8};  // [source][expert]
  EXPECT_EQ(slot_requests(requests, 2, placement), (std::vector<int64_t>{3, 1, 4, 2, 7, 5, 8, 6}));
}

// Every route of every source lands on a distinct row of a slot that holds its logical expert, and the rows
// of each destination are covered exactly, both when the sources are the partitions (M = P) and when four
// sources share two partitions of two ranks each (the agrs path's variable EP, dropless).
TEST(RouteMap, SlotMapsCoverEveryRowOnceAlsoOverFewerPartitions) {
  const std::vector<Routes> routes = {
      {{0, 1}, {0, 2}, {1, 0}}, {}, {{0, 2}, {2, 0}, {0, 1}, {1, 2}, {0, 1}}, {{2, 0}, {0, 1}}};
  for (const int partitions : {4, 2}) {
    SCOPED_TRACE("partitions " + std::to_string(partitions));
    const ExpertPlacement placement = partitions == 4 ? ExpertPlacement::from_slots(3, 4, {0, 1, 2, 0})
                                                      : ExpertPlacement::from_slots(3, 2, {0, 1, 0, 2, 0, 1});
    std::vector<int64_t> requests, tokens;
    std::vector<Tensor> idx;
    for (const Routes& r : routes) {
      idx.push_back(make_idx(r, 2));
      auto c = count_requests(idx.back(), 3);
      requests.insert(requests.end(), c.begin(), c.end());
      tokens.push_back(static_cast<int64_t>(r.size()));
    }
    std::vector<RouteMap> maps;
    for (int s = 0; s < 4; ++s)
      maps.push_back(build_route_map(idx[static_cast<size_t>(s)], s, requests, tokens, placement,
                                     CapacityPolicy::dropless(), partitions == 4 ? -1 : s * partitions / 4));
    for (int p = 0; p < partitions; ++p) {
      const RouteMap& holder = maps[static_cast<size_t>(p * 4 / partitions)];  // a rank of partition p
      ASSERT_EQ(holder.partition, p);
      std::vector<int> hits(static_cast<size_t>(holder.recv_rows), 0);
      for (int s = 0; s < 4; ++s)
        for (int64_t t = 0; t < maps[static_cast<size_t>(s)].tokens; ++t)
          for (int k = 0; k < 2; ++k) {
            const RouteMap& m = maps[static_cast<size_t>(s)];
            ASSERT_TRUE(m.valid(t, k));
            if (m.rank_of(t, k) != p) continue;
            const int32_t row = m.row_of(t, k);
            ASSERT_LT(row, holder.recv_rows);
            ++hits[static_cast<size_t>(row)];
            int l = 0;
            while (holder.expert_offsets[static_cast<size_t>(l + 1)] <= row) ++l;
            EXPECT_EQ(placement.global_expert(p, l),
                      routes[static_cast<size_t>(s)][static_cast<size_t>(t)][static_cast<size_t>(k)])
                << "source " << s << " token " << t << " k " << k;
          }
      for (size_t r = 0; r < hits.size(); ++r) EXPECT_EQ(hits[r], 1) << "partition " << p << " row " << r;
    }
  }
}

}  // namespace
}  // namespace expar
