// Every collective of the threads backend for 1..5 ranks, against results each rank computes locally.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "comm/comm_test_data.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"

namespace expar {
namespace {

using testing::uneven_count;
using testing::values_of;

class Collectives : public ::testing::TestWithParam<int> {
 protected:
  int ranks() const { return GetParam(); }
};

template <typename T>
void check_all_reduce(Comm& comm, size_t count, ReduceOp op, uint64_t use) {
  const int n = comm.size();
  auto data = values_of<T>(comm.rank(), count, use);
  comm.all_reduce(data.data(), count, dtype_of<T>(), op);
  // The same fold, locally, in rank order 0..n-1: the result must match to the bit.
  auto expected = values_of<T>(0, count, use);
  for (int r = 1; r < n; ++r) {
    auto v = values_of<T>(r, count, use);
    for (size_t i = 0; i < count; ++i)
      expected[i] = op == ReduceOp::Sum ? static_cast<T>(expected[i] + v[i]) : std::max(expected[i], v[i]);
  }
  ASSERT_EQ(data.size(), expected.size());
  EXPECT_EQ(0, count == 0 ? 0 : std::memcmp(data.data(), expected.data(), count * sizeof(T)))
      << "rank " << comm.rank() << " count " << count;
}

TEST_P(Collectives, AllReduceIsBitIdenticalToRankOrderFold) {
  run_ranks(ranks(), [](Comm& world) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{129}}) {
      for (auto op : {ReduceOp::Sum, ReduceOp::Max}) {
        check_all_reduce<float>(world, count, op, 1);
        check_all_reduce<double>(world, count, op, 2);
        check_all_reduce<int32_t>(world, count, op, 3);
        check_all_reduce<int64_t>(world, count, op, 4);
      }
    }
    EXPECT_EQ(world.stats().all_reduce, 3 * 2 * 4);
  });
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  run_ranks(ranks(), [](Comm& world) {
    for (int root = 0; root < world.size(); ++root) {
      for (size_t count : {size_t{0}, size_t{17}}) {
        auto data =
            world.rank() == root ? values_of<float>(root, count, 10) : std::vector<float>(count, -7.0f);
        world.broadcast(data.data(), count, DType::F32, root);
        EXPECT_EQ(data, values_of<float>(root, count, 10));
      }
    }
    EXPECT_EQ(world.stats().broadcast, 2 * world.size());
  });
}

TEST_P(Collectives, AllGather) {
  run_ranks(ranks(), [](Comm& world) {
    const int n = world.size();
    for (size_t count : {size_t{0}, size_t{5}}) {
      auto send = values_of<int64_t>(world.rank(), count, 20);
      std::vector<int64_t> recv(count * static_cast<size_t>(n) + 1, -1);
      world.all_gather(send.data(), recv.data(), count, DType::I64);
      for (int r = 0; r < n; ++r) {
        auto want = values_of<int64_t>(r, count, 20);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), recv.begin() + static_cast<ptrdiff_t>(count) * r));
      }
      EXPECT_EQ(recv.back(), -1) << "the element past the end was written";
    }
    EXPECT_EQ(world.stats().all_gather, 2);
  });
}

TEST_P(Collectives, AllGatherVWithUnevenAndZeroCounts) {
  run_ranks(ranks(), [](Comm& world) {
    const int n = world.size();
    std::vector<size_t> counts(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = uneven_count(r, 0, n, 1);
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    auto send = values_of<double>(world.rank(), counts[static_cast<size_t>(world.rank())], 21);
    std::vector<double> recv(total + 1, -1.0);
    world.all_gather_v(send.data(), send.size(), recv.data(), counts, DType::F64);
    size_t at = 0;
    for (int r = 0; r < n; ++r) {
      auto want = values_of<double>(r, counts[static_cast<size_t>(r)], 21);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), recv.begin() + static_cast<ptrdiff_t>(at)))
          << "from " << r;
      at += want.size();
    }
    EXPECT_EQ(recv.back(), -1.0);
    EXPECT_EQ(world.stats().all_gather_v, 1);
  });
}

TEST_P(Collectives, ReduceScatter) {
  run_ranks(ranks(), [](Comm& world) {
    const int n = world.size();
    for (size_t count : {size_t{0}, size_t{7}}) {
      auto send = values_of<float>(world.rank(), count * static_cast<size_t>(n), 30);
      std::vector<float> recv(count + 1, -5.0f);
      world.reduce_scatter(send.data(), recv.data(), count, DType::F32);
      const size_t first = count * static_cast<size_t>(world.rank());
      auto want = values_of<float>(0, count, 30, first);
      for (int r = 1; r < n; ++r) {
        auto v = values_of<float>(r, count, 30, first);
        for (size_t i = 0; i < count; ++i) want[i] += v[i];
      }
      EXPECT_TRUE(std::equal(want.begin(), want.end(), recv.begin()));
      EXPECT_EQ(recv.back(), -5.0f);
    }
    EXPECT_EQ(world.stats().reduce_scatter, 2);
  });
}

TEST_P(Collectives, ReduceScatterVWithUnevenAndZeroCounts) {
  run_ranks(ranks(), [](Comm& world) {
    const int n = world.size();
    std::vector<size_t> counts(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = uneven_count(0, r, n, 2);
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    const size_t mine = counts[static_cast<size_t>(world.rank())];
    const size_t first = std::accumulate(counts.begin(), counts.begin() + world.rank(), size_t{0});
    auto send = values_of<int32_t>(world.rank(), total, 31);
    std::vector<int32_t> recv(mine + 1, -3);
    world.reduce_scatter_v(send.data(), recv.data(), counts, DType::I32);
    std::vector<int32_t> want(mine, 0);
    for (int r = 0; r < n; ++r) {
      auto v = values_of<int32_t>(r, mine, 31, first);
      for (size_t i = 0; i < mine; ++i) want[i] += v[i];
    }
    EXPECT_TRUE(std::equal(want.begin(), want.end(), recv.begin()));
    EXPECT_EQ(recv.back(), -3);
    EXPECT_EQ(world.stats().reduce_scatter_v, 1);
  });
}

TEST_P(Collectives, AllToAll) {
  run_ranks(ranks(), [](Comm& world) {
    const int n = world.size();
    for (size_t count : {size_t{0}, size_t{3}}) {
      auto send = values_of<float>(world.rank(), count * static_cast<size_t>(n), 40);
      std::vector<float> recv(count * static_cast<size_t>(n) + 1, -2.0f);
      world.all_to_all(send.data(), recv.data(), count, DType::F32);
      for (int r = 0; r < n; ++r) {
        auto want = values_of<float>(r, count, 40, count * static_cast<size_t>(world.rank()));
        EXPECT_TRUE(std::equal(want.begin(), want.end(), recv.begin() + static_cast<ptrdiff_t>(count) * r));
      }
      EXPECT_EQ(recv.back(), -2.0f);
    }
    EXPECT_EQ(world.stats().all_to_all, 2);
    EXPECT_EQ(world.stats().all_to_all_v, 0);
  });
}

// Member s sends uneven_count(s, r) elements to r, taken from its data at the prefix offset.
void check_all_to_all_v(Comm& comm, uint64_t use) {
  const int n = comm.size(), me = comm.rank();
  std::vector<size_t> send_counts(static_cast<size_t>(n)), recv_counts(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    send_counts[static_cast<size_t>(r)] = uneven_count(me, r, n, use);
    recv_counts[static_cast<size_t>(r)] = uneven_count(r, me, n, use);
  }
  auto send = values_of<float>(me, std::accumulate(send_counts.begin(), send_counts.end(), size_t{0}), use);
  std::vector<float> recv(std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0}) + 1, -9.0f);
  comm.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, DType::F32);
  size_t at = 0;
  for (int s = 0; s < n; ++s) {
    size_t first = 0;
    for (int r = 0; r < me; ++r) first += uneven_count(s, r, n, use);
    auto want = values_of<float>(s, uneven_count(s, me, n, use), use, first);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), recv.begin() + static_cast<ptrdiff_t>(at)))
        << "group " << comm.name() << " rank " << me << " from " << s;
    at += want.size();
  }
  EXPECT_EQ(recv.back(), -9.0f);
}

TEST_P(Collectives, AllToAllVWithUnevenAndZeroSplits) {
  run_ranks(ranks(), [](Comm& world) {
    for (uint64_t use = 0; use < 4; ++use) check_all_to_all_v(world, use);
    EXPECT_EQ(world.stats().all_to_all_v, 4);
    world.reset_stats();
    EXPECT_EQ(world.stats().all_to_all_v, 0);
  });
}

TEST_P(Collectives, SplitOrdersByKeyThenRank) {
  run_ranks(ranks(), [](Comm& world) {
    // Two colors (even / odd), keys reversed so group rank order is the reverse of world order.
    const int me = world.rank();
    auto sub = world.split(me % 2, -me, me % 2 ? "odd" : "even");
    std::vector<int> want;
    for (int r = world.size() - 1; r >= 0; --r)
      if (r % 2 == me % 2) want.push_back(r);
    EXPECT_EQ(sub->world_ranks(), want);
    EXPECT_EQ(sub->world_ranks()[static_cast<size_t>(sub->rank())], me);
    EXPECT_EQ(sub->name(), me % 2 ? "odd" : "even");
    int64_t value = me;
    sub->all_reduce(std::span<int64_t>(&value, 1));
    int64_t sum = 0;
    for (int r : want) sum += r;
    EXPECT_EQ(value, sum);
    check_all_to_all_v(*sub, 7);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, ::testing::Values(1, 2, 3, 4, 5));

// EP_MP = {0,1},{2,3} and EP_DP = {0,2},{1,3} of a 4-rank layout, used by the same threads at the same time:
// the two groups of each kind run concurrently, and every rank interleaves its MP and DP collectives.
TEST(Subgroups, EpMpAndEpDpUsedConcurrently) {
  run_ranks(4, [](Comm& world) {
    auto mp = world.subgroup({{0, 1}, {2, 3}}, "ep_mp");
    auto dp = world.subgroup({{0, 2}, {1, 3}}, "ep_dp");
    const int me = world.rank();
    EXPECT_EQ(mp->world_ranks(), (std::vector<int>{me / 2 * 2, me / 2 * 2 + 1}));
    EXPECT_EQ(dp->world_ranks(), (std::vector<int>{me % 2, me % 2 + 2}));
    for (uint64_t iter = 0; iter < 30; ++iter) {
      std::vector<float> g = values_of<float>(me, 33, 100 + iter);
      dp->all_reduce(g.data(), g.size(), DType::F32, ReduceOp::Sum);
      std::vector<float> want = values_of<float>(me % 2, 33, 100 + iter);
      auto other = values_of<float>(me % 2 + 2, 33, 100 + iter);
      for (size_t i = 0; i < want.size(); ++i) want[i] += other[i];
      EXPECT_EQ(g, want);
      check_all_to_all_v(*mp, iter);
      if (iter % 3 == 0) world.barrier();
    }
    EXPECT_EQ(dp->stats().all_reduce, 30);
    EXPECT_EQ(mp->stats().all_to_all_v, 30);
    EXPECT_EQ(world.stats().barrier, 10);
  });
}

TEST(Subgroups, PartitionMustCoverEveryRank) {
  EXPECT_THROW(run_ranks(2, [](Comm& world) { world.subgroup({{0}}, "partial"); }), Error);
}

TEST(Mismatch, DifferentCountsAreReportedOnEveryMember) {
  run_ranks(3, [](Comm& world) {
    std::vector<float> send(8), recv(8 * 3);
    const size_t count = world.rank() == 1 ? 8 : 4;
    try {
      world.all_gather(send.data(), recv.data(), count, DType::F32);
      ADD_FAILURE() << "rank " << world.rank() << " did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("same count"), std::string::npos) << e.what();
    }
  });
}

TEST(Mismatch, SplitListsThatDisagreeAreReportedOnEveryMember) {
  run_ranks(2, [](Comm& world) {
    std::vector<float> send(4), recv(4);
    std::vector<size_t> sc{1, 1}, rc{1, world.rank() == 0 ? size_t{2} : size_t{1}};
    EXPECT_THROW(world.all_to_all_v(send.data(), sc, recv.data(), rc, DType::F32), Error);
    world.barrier();  // the group is still usable afterwards
  });
}

TEST(Mismatch, DifferentCollectivesAreReported) {
  EXPECT_THROW(run_ranks(2,
                         [](Comm& world) {
                           if (world.rank() == 0) {
                             world.barrier();
                           } else {
                             int64_t x = 1;
                             world.all_reduce(std::span<int64_t>(&x, 1));
                           }
                         }),
               Error);
}

TEST(Mismatch, UnreducibleDtypeIsRejected) {
  run_ranks(1, [](Comm& world) {
    uint8_t x = 0;
    EXPECT_THROW(world.all_reduce(&x, 1, DType::U8, ReduceOp::Sum), Error);
  });
}

}  // namespace
}  // namespace expar
