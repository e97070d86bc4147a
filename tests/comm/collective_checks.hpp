#pragma once
// Checks of every collective that any backend's test can run on its Comm (collectives_threads_test for
// 1..5 threads, collectives_mpi_test for 2..4 processes): each member computes the expected result locally
// from the shared seed and compares with EXPECT (never ASSERT, so every member keeps calling the same
// collectives even after a failure). Each check also asserts how many calls it added to comm.stats().
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <span>
#include <vector>

#include "comm/comm_test_data.hpp"
#include "expar/comm/comm.hpp"
#include "expar/core/error.hpp"

namespace expar::testing {

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
  EXPECT_EQ(0, count == 0 ? 0 : std::memcmp(data.data(), expected.data(), count * sizeof(T)))
      << comm.name() << " rank " << comm.rank() << " count " << count;
}

inline void check_all_reduce_all_types(Comm& comm) {
  const CommStats before = comm.stats();
  for (size_t count : {size_t{0}, size_t{1}, size_t{129}}) {
    for (auto op : {ReduceOp::Sum, ReduceOp::Max}) {
      check_all_reduce<float>(comm, count, op, 1);
      check_all_reduce<double>(comm, count, op, 2);
      check_all_reduce<int32_t>(comm, count, op, 3);
      check_all_reduce<int64_t>(comm, count, op, 4);
    }
  }
  EXPECT_EQ(comm.stats().all_reduce - before.all_reduce, 3 * 2 * 4);
}

inline void check_broadcast(Comm& comm) {
  const CommStats before = comm.stats();
  for (int root = 0; root < comm.size(); ++root) {
    for (size_t count : {size_t{0}, size_t{17}}) {
      auto data = comm.rank() == root ? values_of<float>(root, count, 10) : std::vector<float>(count, -7.0f);
      comm.broadcast(data.data(), count, DType::F32, root);
      EXPECT_EQ(data, values_of<float>(root, count, 10));
    }
  }
  EXPECT_EQ(comm.stats().broadcast - before.broadcast, 2 * comm.size());
}

inline void check_all_gather(Comm& comm) {
  const int n = comm.size();
  const CommStats before = comm.stats();
  for (size_t count : {size_t{0}, size_t{5}}) {
    auto send = values_of<int64_t>(comm.rank(), count, 20);
    std::vector<int64_t> recv(count * static_cast<size_t>(n) + 1, -1);
    comm.all_gather(send.data(), recv.data(), count, DType::I64);
    for (int r = 0; r < n; ++r) {
      auto want = values_of<int64_t>(r, count, 20);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), recv.begin() + static_cast<ptrdiff_t>(count) * r));
    }
    EXPECT_EQ(recv.back(), -1) << "the element past the end was written";
  }
  EXPECT_EQ(comm.stats().all_gather - before.all_gather, 2);
}

inline void check_all_gather_v(Comm& comm) {
  const int n = comm.size();
  const CommStats before = comm.stats();
  std::vector<size_t> counts(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = uneven_count(r, 0, n, 1);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  auto send = values_of<double>(comm.rank(), counts[static_cast<size_t>(comm.rank())], 21);
  std::vector<double> recv(total + 1, -1.0);
  comm.all_gather_v(send.data(), send.size(), recv.data(), counts, DType::F64);
  size_t at = 0;
  for (int r = 0; r < n; ++r) {
    auto want = values_of<double>(r, counts[static_cast<size_t>(r)], 21);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), recv.begin() + static_cast<ptrdiff_t>(at)))
        << "from " << r;
    at += want.size();
  }
  EXPECT_EQ(recv.back(), -1.0);
  EXPECT_EQ(comm.stats().all_gather_v - before.all_gather_v, 1);
}

inline void check_reduce_scatter(Comm& comm) {
  const int n = comm.size();
  const CommStats before = comm.stats();
  for (size_t count : {size_t{0}, size_t{7}}) {
    auto send = values_of<float>(comm.rank(), count * static_cast<size_t>(n), 30);
    std::vector<float> recv(count + 1, -5.0f);
    comm.reduce_scatter(send.data(), recv.data(), count, DType::F32);
    const size_t first = count * static_cast<size_t>(comm.rank());
    auto want = values_of<float>(0, count, 30, first);
    for (int r = 1; r < n; ++r) {
      auto v = values_of<float>(r, count, 30, first);
      for (size_t i = 0; i < count; ++i) want[i] += v[i];
    }
    EXPECT_TRUE(std::equal(want.begin(), want.end(), recv.begin()));
    EXPECT_EQ(recv.back(), -5.0f);
  }
  EXPECT_EQ(comm.stats().reduce_scatter - before.reduce_scatter, 2);
}

inline void check_reduce_scatter_v(Comm& comm) {
  const int n = comm.size();
  const CommStats before = comm.stats();
  std::vector<size_t> counts(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = uneven_count(0, r, n, 2);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t mine = counts[static_cast<size_t>(comm.rank())];
  const size_t first = std::accumulate(counts.begin(), counts.begin() + comm.rank(), size_t{0});
  auto send = values_of<int32_t>(comm.rank(), total, 31);
  std::vector<int32_t> recv(mine + 1, -3);
  comm.reduce_scatter_v(send.data(), recv.data(), counts, DType::I32);
  std::vector<int32_t> want(mine, 0);
  for (int r = 0; r < n; ++r) {
    auto v = values_of<int32_t>(r, mine, 31, first);
    for (size_t i = 0; i < mine; ++i) want[i] += v[i];
  }
  EXPECT_TRUE(std::equal(want.begin(), want.end(), recv.begin()));
  EXPECT_EQ(recv.back(), -3);
  EXPECT_EQ(comm.stats().reduce_scatter_v - before.reduce_scatter_v, 1);
}

inline void check_all_to_all(Comm& comm) {
  const int n = comm.size();
  const CommStats before = comm.stats();
  for (size_t count : {size_t{0}, size_t{3}}) {
    auto send = values_of<float>(comm.rank(), count * static_cast<size_t>(n), 40);
    std::vector<float> recv(count * static_cast<size_t>(n) + 1, -2.0f);
    comm.all_to_all(send.data(), recv.data(), count, DType::F32);
    for (int r = 0; r < n; ++r) {
      auto want = values_of<float>(r, count, 40, count * static_cast<size_t>(comm.rank()));
      EXPECT_TRUE(std::equal(want.begin(), want.end(), recv.begin() + static_cast<ptrdiff_t>(count) * r));
    }
    EXPECT_EQ(recv.back(), -2.0f);
  }
  EXPECT_EQ(comm.stats().all_to_all - before.all_to_all, 2);
  EXPECT_EQ(comm.stats().all_to_all_v - before.all_to_all_v, 0);
}

// Member s sends uneven_count(s, r) elements to r, taken from its data at the prefix offset.
inline void check_all_to_all_v(Comm& comm, uint64_t use) {
  const int n = comm.size(), me = comm.rank();
  const CommStats before = comm.stats();
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
  EXPECT_EQ(comm.stats().all_to_all_v - before.all_to_all_v, 1);
  EXPECT_EQ(comm.stats().all_to_all - before.all_to_all, 0);
}

// Two colors (even / odd), keys reversed so the group rank order is the reverse of the parent's; then the
// new groups run collectives of their own.
inline void check_split_orders_by_key_then_rank(Comm& world) {
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
  check_all_to_all_v(*sub, 9);
  check_all_reduce_all_types(*sub);
  check_reduce_scatter_v(*sub);
}

// EP_MP = {0,1},{2,3} and EP_DP = {0,2},{1,3} of a 4-member world, used at the same time: the two groups of
// each kind run concurrently, and every member interleaves its MP and DP collectives with world barriers.
inline void check_ep_mp_and_ep_dp_interleaved(Comm& world, int iterations) {
  auto mp = world.subgroup({{0, 1}, {2, 3}}, "ep_mp");
  auto dp = world.subgroup({{0, 2}, {1, 3}}, "ep_dp");
  const int me = world.rank();
  EXPECT_EQ(mp->world_ranks(), (std::vector<int>{me / 2 * 2, me / 2 * 2 + 1}));
  EXPECT_EQ(dp->world_ranks(), (std::vector<int>{me % 2, me % 2 + 2}));
  const CommStats before = world.stats();
  for (int iter = 0; iter < iterations; ++iter) {
    const uint64_t use = 100 + static_cast<uint64_t>(iter);
    std::vector<float> g = values_of<float>(me, 33, use);
    dp->all_reduce(g.data(), g.size(), DType::F32, ReduceOp::Sum);
    std::vector<float> want = values_of<float>(me % 2, 33, use);
    auto other = values_of<float>(me % 2 + 2, 33, use);
    for (size_t i = 0; i < want.size(); ++i) want[i] += other[i];
    EXPECT_EQ(g, want) << "iteration " << iter;
    check_all_to_all_v(*mp, static_cast<uint64_t>(iter));
    if (iter % 3 == 0) world.barrier();
  }
  EXPECT_EQ(dp->stats().all_reduce, iterations);
  EXPECT_EQ(mp->stats().all_to_all_v, iterations);
  EXPECT_EQ(world.stats().barrier - before.barrier, (iterations + 2) / 3);
}

// Member 0 expects 2 elements from the last member, which sends 1: every member throws, and the group is
// still usable afterwards.
inline void check_split_list_mismatch_is_reported_on_every_member(Comm& world) {
  const auto n = static_cast<size_t>(world.size());
  std::vector<size_t> sc(n, 1), rc(n, 1);
  if (world.rank() == 0) rc[n - 1] = 2;
  std::vector<float> send(n), recv(n + 1);
  EXPECT_THROW(world.all_to_all_v(send.data(), sc, recv.data(), rc, DType::F32), Error);
  world.barrier();
}

}  // namespace expar::testing
