#include "expar/comm/threads/threads_comm.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "expar/comm/reduce.hpp"
#include "expar/comm/threads/threads_heap.hpp"
#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"

namespace expar::threads {

namespace {

// memcpy with zero-length (and then possibly null) buffers allowed.
void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

std::vector<size_t> offsets_of(std::span<const size_t> counts) {
  std::vector<size_t> offsets(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
  return offsets;
}

}  // namespace

// What differs between the data collectives' rendezvous. The names are string literals because a published
// slot's op is read by peers after this member may have returned.
struct CollectiveSpec {
  const char* op;
  const char* closing;        // the closing wait's name
  int64_t CommStats::*calls;  // the counter the call increments
  unsigned checks;            // which of kReducible / kSameCount the arguments must pass
};

namespace {

enum : unsigned {
  kAnyCount = 0,
  kReducible = 1,  // the dtype must be one reduce_into folds
  kSameCount = 2,  // every member must pass the same count
};

constexpr CollectiveSpec kBroadcast{"broadcast", "broadcast (closing)", &CommStats::broadcast, kSameCount};
constexpr CollectiveSpec kAllReduce{"all_reduce", "all_reduce (closing)", &CommStats::all_reduce,
                                    kReducible | kSameCount};
constexpr CollectiveSpec kAllGather{"all_gather", "all_gather (closing)", &CommStats::all_gather, kSameCount};
constexpr CollectiveSpec kAllGatherV{"all_gather_v", "all_gather_v (closing)", &CommStats::all_gather_v,
                                     kAnyCount};
constexpr CollectiveSpec kReduceScatter{"reduce_scatter", "reduce_scatter (closing)",
                                        &CommStats::reduce_scatter, kReducible | kSameCount};
constexpr CollectiveSpec kReduceScatterV{"reduce_scatter_v", "reduce_scatter_v (closing)",
                                         &CommStats::reduce_scatter_v, kReducible};
constexpr CollectiveSpec kAllToAll{"all_to_all", "all_to_all (closing)", &CommStats::all_to_all, kSameCount};
constexpr CollectiveSpec kAllToAllV{"all_to_all_v", "all_to_all_v (closing)", &CommStats::all_to_all_v,
                                    kAnyCount};

}  // namespace

namespace {

NodeMap emulated_nodes(const GroupState& group) {
  std::vector<int64_t> labels;
  for (int w : group.world_ranks()) labels.push_back(w / group.world_ptr()->ranks_per_node());
  return NodeMap::from_labels(labels);
}

}  // namespace

ThreadsComm::ThreadsComm(std::shared_ptr<GroupState> group, int rank)
    : group_(std::move(group)), rank_(rank) {
  nodes_ = emulated_nodes(*group_);
}

void ThreadsComm::check_uniform(std::span<const Slot> slots, const char* op, bool check_count) const {
  for (size_t m = 1; m < slots.size(); ++m) {
    EXPAR_ASSERT(
        slots[m].dtype == slots[0].dtype,
        "{} on group '{}': group rank 0 passes dtype {} but group rank {} passes {}; every member must "
        "pass the same dtype",
        op, name(), dtype_name(slots[0].dtype), m, dtype_name(slots[m].dtype));
    EXPAR_ASSERT(
        !check_count || slots[m].count == slots[0].count,
        "{} on group '{}': group rank 0 passes count {} but group rank {} passes {}; every member must "
        "pass the same count",
        op, name(), slots[0].count, m, slots[m].count);
  }
}

template <typename Body>
void ThreadsComm::rendezvous(const CollectiveSpec& spec, Slot mine, Body&& body) {
  ++(stats_.*spec.calls);
  if (spec.checks & kReducible) check_reducible(mine.dtype, spec.op);
  mine.op = spec.op;
  auto slots = exchange(std::move(mine));
  check_uniform(slots, spec.op, (spec.checks & kSameCount) != 0);
  body(slots);
  group_->wait(rank_, spec.closing);
}

std::shared_ptr<Comm> ThreadsComm::split(int color, int key, const std::string& name) {
  Slot mine;
  mine.op = "split";
  mine.a = color;
  mine.b = key;
  auto slots = exchange(std::move(mine));
  // Members of my color, ordered by (key, parent rank).
  std::vector<int> members;
  for (int m = 0; m < size(); ++m)
    if (slots[static_cast<size_t>(m)].a == color) members.push_back(m);
  std::stable_sort(members.begin(), members.end(), [&](int x, int y) {
    return slots[static_cast<size_t>(x)].b < slots[static_cast<size_t>(y)].b;
  });
  const int my_index = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  std::vector<int> world;
  for (int m : members) world.push_back(group_->world_ranks()[static_cast<size_t>(m)]);

  // The first member of each new group creates its state; a second generation hands it to the others.
  Slot offer;
  offer.op = "split (hand over)";
  if (my_index == 0) offer.object = GroupState::create(group_->world_ptr(), world, name);
  auto offers = exchange(std::move(offer));
  auto state = std::static_pointer_cast<GroupState>(offers[static_cast<size_t>(members[0])].object);
  return std::make_shared<ThreadsComm>(std::move(state), my_index);
}

void ThreadsComm::barrier() {
  ++stats_.barrier;
  group_->wait(rank_, "barrier");
}

void ThreadsComm::broadcast(void* data, size_t count, DType dtype, int root) {
  rendezvous(kBroadcast, {.send = data, .count = count, .a = root, .dtype = dtype},
             [&](std::span<const Slot> slots) {
               for (size_t m = 0; m < slots.size(); ++m)
                 EXPAR_ASSERT(
                     slots[m].a == slots[0].a && root >= 0 && root < size(),
                     "broadcast on group '{}': root {} (group rank 0 passes {}, group rank {} passes "
                     "{}) must be the same group rank in [0, {}) on every member",
                     name(), root, slots[0].a, m, slots[m].a, size());
               const size_t bytes = count * dtype_size(dtype);
               if (rank_ == root) {
                 count_send_to_each_peer(bytes);
               } else {
                 copy_bytes(data, slots[static_cast<size_t>(root)].send, bytes);
               }
             });
}

void ThreadsComm::all_reduce(void* data, size_t count, DType dtype, ReduceOp op) {
  // Reduce into a private accumulator in rank order; `data` is someone else's input until the closing wait.
  std::vector<std::byte> acc;
  rendezvous(kAllReduce, {.send = data, .count = count, .a = static_cast<int64_t>(op), .dtype = dtype},
             [&](std::span<const Slot> slots) {
               for (size_t m = 1; m < slots.size(); ++m)
                 EXPAR_ASSERT(slots[m].a == slots[0].a,
                              "all_reduce on group '{}': members pass different reduce operations", name());
               const size_t bytes = count * dtype_size(dtype);
               count_send_to_each_peer(bytes);
               acc.resize(bytes);
               copy_bytes(acc.data(), slots[0].send, bytes);
               for (size_t m = 1; m < slots.size(); ++m)
                 reduce_into(acc.data(), slots[m].send, count, dtype, op);
             });
  copy_bytes(data, acc.data(), acc.size());
}

void ThreadsComm::all_gather(const void* send, void* recv, size_t count, DType dtype) {
  rendezvous(kAllGather, {.send = send, .count = count, .dtype = dtype}, [&](std::span<const Slot> slots) {
    const size_t bytes = count * dtype_size(dtype);
    count_send_to_each_peer(bytes);
    for (size_t m = 0; m < slots.size(); ++m)
      copy_bytes(static_cast<std::byte*>(recv) + m * bytes, slots[m].send, bytes);
  });
}

void ThreadsComm::all_gather_v(const void* send, size_t send_count, void* recv,
                               std::span<const size_t> recv_counts, DType dtype) {
  rendezvous(
      kAllGatherV, {.send = send, .counts = recv_counts, .count = send_count, .dtype = dtype},
      [&](std::span<const Slot> slots) {
        const size_t n = slots.size();
        for (size_t q = 0; q < n; ++q) {
          EXPAR_ASSERT(
              slots[q].counts.size() == n,
              "all_gather_v on group '{}': group rank {} passes {} recv_counts; pass one per member ({})",
              name(), q, slots[q].counts.size(), n);
        }
        for (size_t q = 0; q < n; ++q)
          for (size_t m = 0; m < n; ++m)
            EXPAR_ASSERT(
                slots[q].counts[m] == slots[m].count,
                "all_gather_v on group '{}': group rank {} sends {} elements but group rank {} expects "
                "recv_counts[{}]={}; recv_counts must hold every member's send_count",
                name(), m, slots[m].count, q, m, slots[q].counts[m]);
        const size_t esize = dtype_size(dtype);
        count_send_to_each_peer(send_count * esize);
        auto offsets = offsets_of(recv_counts);
        for (size_t m = 0; m < n; ++m)
          copy_bytes(static_cast<std::byte*>(recv) + offsets[m] * esize, slots[m].send,
                     slots[m].count * esize);
      });
}

void ThreadsComm::reduce_scatter(const void* send, void* recv, size_t count, DType dtype) {
  std::vector<std::byte> acc;
  rendezvous(kReduceScatter, {.send = send, .count = count, .dtype = dtype},
             [&](std::span<const Slot> slots) {
               const size_t bytes = count * dtype_size(dtype);
               count_send_to_each_peer(bytes);
               const size_t my_offset = static_cast<size_t>(rank_) * bytes;
               acc.resize(bytes);
               copy_bytes(acc.data(), static_cast<const std::byte*>(slots[0].send) + my_offset, bytes);
               for (size_t m = 1; m < slots.size(); ++m)
                 reduce_into(acc.data(), static_cast<const std::byte*>(slots[m].send) + my_offset, count,
                             dtype, ReduceOp::Sum);
             });
  copy_bytes(recv, acc.data(), acc.size());
}

void ThreadsComm::reduce_scatter_v(const void* send, void* recv, std::span<const size_t> counts,
                                   DType dtype) {
  std::vector<std::byte> acc;
  rendezvous(
      kReduceScatterV, {.send = send, .counts = counts, .dtype = dtype}, [&](std::span<const Slot> slots) {
        const size_t n = slots.size();
        for (size_t q = 0; q < n; ++q)
          EXPAR_ASSERT(std::ranges::equal(slots[q].counts, slots[0].counts) && slots[0].counts.size() == n,
                       "reduce_scatter_v on group '{}': group rank {} passes counts {} but group rank 0 "
                       "passes {}; every "
                       "member must pass the same {} counts",
                       name(), q, slots[q].counts, slots[0].counts, n);
        const size_t esize = dtype_size(dtype);
        auto offsets = offsets_of(counts);
        count_sends(counts, esize);
        const size_t my_offset = offsets[static_cast<size_t>(rank_)] * esize;
        const size_t my_count = counts[static_cast<size_t>(rank_)];
        acc.resize(my_count * esize);
        copy_bytes(acc.data(), static_cast<const std::byte*>(slots[0].send) + my_offset, acc.size());
        for (size_t m = 1; m < n; ++m)
          reduce_into(acc.data(), static_cast<const std::byte*>(slots[m].send) + my_offset, my_count, dtype,
                      ReduceOp::Sum);
      });
  copy_bytes(recv, acc.data(), acc.size());
}

void ThreadsComm::all_to_all(const void* send, void* recv, size_t count, DType dtype) {
  rendezvous(kAllToAll, {.send = send, .count = count, .dtype = dtype}, [&](std::span<const Slot> slots) {
    const size_t bytes = count * dtype_size(dtype);
    count_send_to_each_peer(bytes);
    const size_t my_offset = static_cast<size_t>(rank_) * bytes;
    for (size_t m = 0; m < slots.size(); ++m)
      copy_bytes(static_cast<std::byte*>(recv) + m * bytes,
                 static_cast<const std::byte*>(slots[m].send) + my_offset, bytes);
  });
}

void ThreadsComm::all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                               std::span<const size_t> recv_counts, DType dtype) {
  rendezvous(
      kAllToAllV, {.send = send, .counts = send_counts, .counts2 = recv_counts, .dtype = dtype},
      [&](std::span<const Slot> slots) {
        const size_t n = slots.size();
        for (size_t q = 0; q < n; ++q)
          EXPAR_ASSERT(
              slots[q].counts.size() == n && slots[q].counts2.size() == n,
              "all_to_all_v on group '{}': group rank {} passes {} send_counts and {} recv_counts; pass one "
              "per member ({})",
              name(), q, slots[q].counts.size(), slots[q].counts2.size(), n);
        for (size_t s = 0; s < n; ++s)
          for (size_t r = 0; r < n; ++r)
            EXPAR_ASSERT(
                slots[s].counts[r] == slots[r].counts2[s],
                "all_to_all_v on group '{}': group rank {} sends {} elements to group rank {}, which expects "
                "{} (its recv_counts[{}]); the split lists must agree",
                name(), s, slots[s].counts[r], r, slots[r].counts2[s], s);
        const size_t esize = dtype_size(dtype);
        count_sends(send_counts, esize);
        auto recv_offsets = offsets_of(recv_counts);
        for (size_t s = 0; s < n; ++s) {
          auto send_offsets = offsets_of(slots[s].counts);
          copy_bytes(
              static_cast<std::byte*>(recv) + recv_offsets[s] * esize,
              static_cast<const std::byte*>(slots[s].send) + send_offsets[static_cast<size_t>(rank_)] * esize,
              recv_counts[s] * esize);
        }
      });
}

std::unique_ptr<SymmetricHeap> ThreadsComm::make_heap() {
  Slot offer;
  offer.op = "make_heap";
  if (rank_ == 0) offer.object = std::make_shared<HeapShared>(group_);
  auto offers = exchange(std::move(offer));
  return std::make_unique<ThreadsHeap>(std::static_pointer_cast<HeapShared>(offers[0].object), rank_, nodes_);
}

}  // namespace expar::threads
