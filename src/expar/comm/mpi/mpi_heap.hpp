#pragma once
// SymmetricHeap for the MPI backend. Each buffer is one MPI window over the heap's group:
// - Auto: MPI_Win_allocate_shared over the members on this node (MPI_Comm_split_type), so put/get/peer_ptr
//   to them are plain loads and stores; when the group spans nodes, an MPI_Win_create over the same memory
//   serves the other members with MPI_Put/MPI_Get.
// - ForceRemote: MPI_Win_allocate and MPI_Put/MPI_Get for every peer (peer_ptr is null): the across-node
// path,
//   testable on one machine.
// All windows stay in one passive-target epoch (MPI_Win_lock_all) for the heap's lifetime; quiet() flushes,
// barrier() flushes, synchronizes memory (MPI_Win_sync) and meets the other members.
// Destroying the heap is collective (MPI_Win_free): destroy heaps in the same order on every member.
#include <memory>
#include <string>
#include <vector>

#include "expar/comm/mpi/mpi_c.hpp"
#include "expar/comm/mpi/mpi_comm.hpp"
#include "expar/comm/symmetric_heap.hpp"

namespace expar::mpi {

class MpiHeap final : public SymmetricHeap {
 public:
  // Collective over `comm` (duplicated, so heap traffic never matches the group's collectives).
  // `nodes`: the group's nodes (MpiComm::nodes()), for the traffic statistics.
  MpiHeap(MPI_Comm comm, std::string name, double timeout_seconds, HeapMode mode, NodeMap nodes);
  ~MpiHeap() override;
  MpiHeap(const MpiHeap&) = delete;
  MpiHeap& operator=(const MpiHeap&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  BufferId allocate(const std::string& name, size_t bytes, MemCategory category) override;
  void* local(BufferId buffer) override;
  size_t bytes(BufferId buffer) const override;
  void put(int peer, BufferId buffer, size_t offset, const void* src, size_t bytes) override;
  void get(int peer, BufferId buffer, size_t offset, void* dst, size_t bytes) override;
  void quiet() override;
  void barrier() override;
  void* peer_ptr(int peer, BufferId buffer) override;
  void signal(int peer, int slot, uint64_t value) override;
  void wait_signal(int slot, uint64_t value) override;

  HeapMode mode() const { return mode_; }

 private:
  struct Window {
    MPI_Win shm = MPI_WIN_NULL;  // over node_ (Auto)
    MPI_Win rma = MPI_WIN_NULL;  // over group_ (ForceRemote, or Auto across nodes)
    std::byte* base = nullptr;
    std::vector<std::byte*> peers;  // [group rank] -> direct pointer or null
    bool pending = false;           // MPI_Put/MPI_Get issued since the last flush
  };
  struct Buffer {
    std::string name;
    size_t bytes = 0;
    MemCategory category = MemCategory::SymmetricBuffers;
    MemoryTracker* tracker = nullptr;
    Window window;
  };
  Window create_window(size_t bytes);
  void free_window(Window& w);
  const Buffer& buffer_at(BufferId buffer, const char* op) const;
  void check_range(int peer, const Buffer& b, size_t offset, size_t bytes, const char* op) const;
  void sync_memory();

  MPI_Comm group_ = MPI_COMM_NULL;
  MPI_Comm node_ = MPI_COMM_NULL;
  std::string name_;
  double timeout_seconds_;
  HeapMode mode_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> node_rank_;  // [group rank] -> rank in node_, or MPI_UNDEFINED
  bool spans_nodes_ = false;
  std::vector<Buffer> buffers_;
  Window signals_;  // kSignalSlots uint64 per member
};

}  // namespace expar::mpi
