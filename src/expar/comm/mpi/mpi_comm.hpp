#pragma once
// Comm for the MPI backend: a communicator, with every collective mapped to a non-blocking MPI collective
// completed by a polling wait (so that every wait has a timeout). Reductions are deterministic: MPI's own
// reductions may associate differently per algorithm and process count, so sums are computed as an exchange
// (all-gather, all-to-all) followed by a local fold in rank order 0..size-1, bit-identical to the threads
// backend. all_to_all_v first exchanges the split lists to check that they agree.
#include <memory>

#include "expar/comm/comm.hpp"
#include "expar/comm/mpi/mpi_c.hpp"

namespace expar::mpi {

enum class HeapMode : uint8_t {
  Auto,         // shared-memory window among members on one node (peer_ptr works), MPI_Put/MPI_Get to others
  ForceRemote,  // MPI_Win_allocate + MPI_Put/MPI_Get for every peer, peer_ptr null (the across-node path)
};
// ForceRemote when EXPAR_MPI_FORCE_REMOTE=1, else Auto.
HeapMode heap_mode_from_env();

class MpiComm final : public Comm {
 public:
  // Takes ownership of `comm` (freed on destruction) unless it is MPI_COMM_WORLD. Collective over `comm`.
  MpiComm(MPI_Comm comm, std::string name, double timeout_seconds);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  MPI_Comm handle() const { return comm_; }
  double timeout_seconds() const { return timeout_seconds_; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  std::vector<int> world_ranks() const override { return world_ranks_; }
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
  // The mode from EXPAR_MPI_FORCE_REMOTE.
  std::unique_ptr<SymmetricHeap> make_heap() override;
  // Explicit mode (tests create both kinds in one run).
  std::unique_ptr<SymmetricHeap> make_heap(HeapMode mode);

  using Comm::all_reduce;

 private:
  void wait(MPI_Request& request, const char* op) const;
  void alltoallv_bytes(const void* send, std::span<const size_t> send_counts, void* recv,
                       std::span<const size_t> recv_counts, size_t esize, const char* op);

  MPI_Comm comm_;
  std::string name_;
  double timeout_seconds_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;
};

}  // namespace expar::mpi
