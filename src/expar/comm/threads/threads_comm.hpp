#pragma once
// Comm for the threads backend: the members of a group are threads of one process sharing a GroupState.
// Each collective publishes the member's pointers, every member copies (or reduces, in rank order) what it
// needs straight from the peers' buffers, and a closing wait keeps those buffers valid until all are done.
#include <memory>

#include "expar/comm/comm.hpp"
#include "expar/comm/threads/group_state.hpp"

namespace expar::threads {

struct CollectiveSpec;  // what a data collective states about itself (threads_comm.cpp)

class ThreadsComm final : public Comm {
 public:
  ThreadsComm(std::shared_ptr<GroupState> group, int rank);

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string name() const override { return group_->name(); }
  std::vector<int> world_ranks() const override { return group_->world_ranks(); }
  std::shared_ptr<Comm> split(int color, int key, const std::string& name) override;

  void barrier() override;
  void broadcast(void* data, size_t count, DType dtype, int root) override;
  void all_reduce(void* data, size_t count, DType dtype, ReduceOp op) override;
  void all_gather(const void* send, void* recv, size_t count, DType dtype) override;
  void all_gather_v(const void* send, size_t send_count, void* recv, std::span<const size_t> recv_counts,
                    DType dtype) override;
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype) override;
  void reduce_scatter_v(const void* send, void* recv, std::span<const size_t> counts, DType dtype) override;
  void all_to_all(const void* send, void* recv, size_t count, DType dtype) override;
  void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                    std::span<const size_t> recv_counts, DType dtype) override;
  std::unique_ptr<SymmetricHeap> make_heap() override;

  using Comm::all_reduce;

 private:
  std::span<const Slot> exchange(Slot slot) { return group_->exchange(rank_, std::move(slot)); }
  // Throws (identically on every member) when members passed different counts or dtypes.
  void check_uniform(std::span<const Slot> slots, const char* op, bool check_count) const;
  // The rendezvous every data collective shares: counts the call, publishes `mine` under the collective's
  // name, checks what every member must pass alike, runs `body(slots)` while the peers' buffers are valid,
  // and closes with the wait that keeps this member's buffers valid until every peer is done with them.
  template <typename Body>
  void rendezvous(const CollectiveSpec& spec, Slot mine, Body&& body);

  std::shared_ptr<GroupState> group_;
  int rank_;
};

}  // namespace expar::threads
