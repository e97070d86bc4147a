#include "expar/comm/mpi/mpi_comm.hpp"

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string_view>
#include <vector>

#include "expar/comm/mpi/mpi_heap.hpp"
#include "expar/comm/mpi/mpi_util.hpp"
#include "expar/comm/reduce.hpp"
#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"

namespace expar::mpi {

namespace {

std::vector<int> byte_counts(std::span<const size_t> counts, size_t esize, const char* op) {
  std::vector<int> out(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) out[i] = to_int(counts[i] * esize, op);
  return out;
}

std::vector<int> displacements(const std::vector<int>& counts, const char* op) {
  std::vector<int> out(counts.size(), 0);
  size_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    out[i] = to_int(at, op);
    at += static_cast<size_t>(counts[i]);
  }
  to_int(at, op);
  return out;
}

// MPI forbids a null buffer argument in some implementations' checks even for zero counts.
const void* nonnull(const void* p) {
  static const std::byte dummy{};
  return p ? p : &dummy;
}
void* nonnull(void* p) {
  static std::byte dummy{};
  return p ? p : &dummy;
}

}  // namespace

HeapMode heap_mode_from_env() {
  const char* v = std::getenv("EXPAR_MPI_FORCE_REMOTE");
  return v != nullptr && std::string_view(v) == "1" ? HeapMode::ForceRemote : HeapMode::Auto;
}

MpiComm::MpiComm(MPI_Comm comm, std::string name, double timeout_seconds)
    : comm_(comm), name_(std::move(name)), timeout_seconds_(timeout_seconds) {
  check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  MPI_Group mine, world;
  check(MPI_Comm_group(comm_, &mine), "MPI_Comm_group");
  check(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group");
  std::vector<int> ranks(static_cast<size_t>(size_));
  std::iota(ranks.begin(), ranks.end(), 0);
  world_ranks_.resize(ranks.size());
  check(MPI_Group_translate_ranks(mine, size_, ranks.data(), world, world_ranks_.data()),
        "MPI_Group_translate_ranks");
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  // My node is labelled by its lowest world rank: the members that share memory with me agree on it.
  BlockingDeadline deadline("node discovery (MPI_Comm_split_type)", name_, timeout_seconds_);
  MPI_Comm node;
  check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  int64_t me = world_ranks_[static_cast<size_t>(rank_)], label = 0;
  check(MPI_Allreduce(&me, &label, 1, MPI_INT64_T, MPI_MIN, node), "MPI_Allreduce");
  MPI_Comm_free(&node);
  std::vector<int64_t> labels(static_cast<size_t>(size_));
  check(MPI_Allgather(&label, 1, MPI_INT64_T, labels.data(), 1, MPI_INT64_T, comm_), "MPI_Allgather");
  nodes_ = NodeMap::from_labels(labels);
}

MpiComm::~MpiComm() {
  // While an error unwinds, leave the communicator to MPI_Abort (MPI_Comm_free is collective).
  if (comm_ != MPI_COMM_WORLD && active() && !unwinding()) MPI_Comm_free(&comm_);
}

void MpiComm::wait(MPI_Request& request, const char* op) const {
  mpi::wait(request, op, name_, timeout_seconds_);
}

std::shared_ptr<Comm> MpiComm::split(int color, int key, const std::string& name) {
  EXPAR_ASSERT(color >= 0, "split of group '{}' into '{}': color {} must be non-negative", name_, name,
               color);
  MPI_Comm child;
  {
    BlockingDeadline deadline("split", name_, timeout_seconds_);
    check(MPI_Comm_split(comm_, color, key, &child), "MPI_Comm_split");
  }
  return std::make_shared<MpiComm>(child, name, timeout_seconds_);
}

void MpiComm::barrier() {
  ++stats_.barrier;
  MPI_Request r;
  check(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
  wait(r, "barrier");
}

void MpiComm::broadcast(void* data, size_t count, DType dtype, int root) {
  ++stats_.broadcast;
  EXPAR_ASSERT(root >= 0 && root < size_, "broadcast on group '{}': root {} is outside [0, {})", name_, root,
               size_);
  const size_t bytes = count * dtype_size(dtype);
  if (rank_ == root) count_send_to_each_peer(bytes);
  MPI_Request r;
  check(MPI_Ibcast(nonnull(data), to_int(bytes, "broadcast"), MPI_BYTE, root, comm_, &r), "MPI_Ibcast");
  wait(r, "broadcast");
}

void MpiComm::all_reduce(void* data, size_t count, DType dtype, ReduceOp op) {
  ++stats_.all_reduce;
  check_reducible(dtype, "all_reduce");
  const size_t bytes = count * dtype_size(dtype);
  count_send_to_each_peer(static_cast<size_t>(bytes));
  std::vector<std::byte> all(bytes * static_cast<size_t>(size_));
  MPI_Request r;
  check(MPI_Iallgather(nonnull(static_cast<const void*>(data)), to_int(bytes, "all_reduce"), MPI_BYTE,
                       nonnull(static_cast<void*>(all.data())), to_int(bytes, "all_reduce"), MPI_BYTE, comm_,
                       &r),
        "MPI_Iallgather");
  wait(r, "all_reduce");
  if (bytes == 0) return;
  std::memcpy(data, all.data(), bytes);
  for (int m = 1; m < size_; ++m)
    reduce_into(data, all.data() + static_cast<size_t>(m) * bytes, count, dtype, op);
}

void MpiComm::all_gather(const void* send, void* recv, size_t count, DType dtype) {
  ++stats_.all_gather;
  const int bytes = to_int(count * dtype_size(dtype), "all_gather");
  count_send_to_each_peer(static_cast<size_t>(bytes));
  MPI_Request r;
  check(MPI_Iallgather(nonnull(send), bytes, MPI_BYTE, nonnull(recv), bytes, MPI_BYTE, comm_, &r),
        "MPI_Iallgather");
  wait(r, "all_gather");
}

void MpiComm::all_gather_v(const void* send, size_t send_count, void* recv,
                           std::span<const size_t> recv_counts, DType dtype) {
  ++stats_.all_gather_v;
  EXPAR_ASSERT(recv_counts.size() == static_cast<size_t>(size_),
               "all_gather_v on group '{}': {} recv_counts for {} members; pass one per member", name_,
               recv_counts.size(), size_);
  EXPAR_ASSERT(
      send_count == recv_counts[static_cast<size_t>(rank_)],
      "all_gather_v on group '{}': send_count {} differs from recv_counts[{}]={}; they must be equal", name_,
      send_count, rank_, recv_counts[static_cast<size_t>(rank_)]);
  const size_t esize = dtype_size(dtype);
  count_send_to_each_peer(send_count * esize);
  auto counts = byte_counts(recv_counts, esize, "all_gather_v");
  auto displs = displacements(counts, "all_gather_v");
  MPI_Request r;
  check(MPI_Iallgatherv(nonnull(send), to_int(send_count * esize, "all_gather_v"), MPI_BYTE, nonnull(recv),
                        counts.data(), displs.data(), MPI_BYTE, comm_, &r),
        "MPI_Iallgatherv");
  wait(r, "all_gather_v");
}

void MpiComm::alltoallv_bytes(const void* send, std::span<const size_t> send_counts, void* recv,
                              std::span<const size_t> recv_counts, size_t esize, const char* op) {
  auto sc = byte_counts(send_counts, esize, op);
  auto rc = byte_counts(recv_counts, esize, op);
  auto sd = displacements(sc, op);
  auto rd = displacements(rc, op);
  MPI_Request r;
  check(MPI_Ialltoallv(nonnull(send), sc.data(), sd.data(), MPI_BYTE, nonnull(recv), rc.data(), rd.data(),
                       MPI_BYTE, comm_, &r),
        "MPI_Ialltoallv");
  wait(r, op);
}

void MpiComm::reduce_scatter(const void* send, void* recv, size_t count, DType dtype) {
  ++stats_.reduce_scatter;
  check_reducible(dtype, "reduce_scatter");
  const size_t bytes = count * dtype_size(dtype);
  count_send_to_each_peer(static_cast<size_t>(bytes));
  std::vector<std::byte> blocks(bytes * static_cast<size_t>(size_));
  MPI_Request r;
  check(MPI_Ialltoall(nonnull(send), to_int(bytes, "reduce_scatter"), MPI_BYTE,
                      nonnull(static_cast<void*>(blocks.data())), to_int(bytes, "reduce_scatter"), MPI_BYTE,
                      comm_, &r),
        "MPI_Ialltoall");
  wait(r, "reduce_scatter");
  if (bytes == 0) return;
  std::memcpy(recv, blocks.data(), bytes);
  for (int m = 1; m < size_; ++m)
    reduce_into(recv, blocks.data() + static_cast<size_t>(m) * bytes, count, dtype, ReduceOp::Sum);
}

void MpiComm::reduce_scatter_v(const void* send, void* recv, std::span<const size_t> counts, DType dtype) {
  ++stats_.reduce_scatter_v;
  check_reducible(dtype, "reduce_scatter_v");
  EXPAR_ASSERT(counts.size() == static_cast<size_t>(size_),
               "reduce_scatter_v on group '{}': {} counts for {} members; pass one per member", name_,
               counts.size(), size_);
  const size_t esize = dtype_size(dtype);
  const size_t mine = counts[static_cast<size_t>(rank_)];
  count_sends(counts, esize);
  // Member m's block r goes to r; I receive my block from everyone, then fold in rank order.
  std::vector<size_t> recv_counts(static_cast<size_t>(size_), mine);
  std::vector<std::byte> blocks(mine * esize * static_cast<size_t>(size_));
  alltoallv_bytes(send, counts, blocks.data(), recv_counts, esize, "reduce_scatter_v");
  if (mine == 0) return;
  std::memcpy(recv, blocks.data(), mine * esize);
  for (int m = 1; m < size_; ++m)
    reduce_into(recv, blocks.data() + static_cast<size_t>(m) * mine * esize, mine, dtype, ReduceOp::Sum);
}

void MpiComm::all_to_all(const void* send, void* recv, size_t count, DType dtype) {
  ++stats_.all_to_all;
  const int bytes = to_int(count * dtype_size(dtype), "all_to_all");
  count_send_to_each_peer(static_cast<size_t>(bytes));
  MPI_Request r;
  check(MPI_Ialltoall(nonnull(send), bytes, MPI_BYTE, nonnull(recv), bytes, MPI_BYTE, comm_, &r),
        "MPI_Ialltoall");
  wait(r, "all_to_all");
}

void MpiComm::all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                           std::span<const size_t> recv_counts, DType dtype) {
  ++stats_.all_to_all_v;
  const auto n = static_cast<size_t>(size_);
  EXPAR_ASSERT(
      send_counts.size() == n && recv_counts.size() == n,
      "all_to_all_v on group '{}': {} send_counts and {} recv_counts for {} members; pass one per member",
      name_, send_counts.size(), recv_counts.size(), size_);
  // Check the split lists agree (what peer m sends me must be what I expect from it): a mismatch would
  // otherwise truncate or leave garbage.
  std::vector<uint64_t> mine(send_counts.begin(), send_counts.end()), theirs(n);
  MPI_Request r;
  check(MPI_Ialltoall(mine.data(), 1, MPI_UINT64_T, theirs.data(), 1, MPI_UINT64_T, comm_, &r),
        "MPI_Ialltoall");
  wait(r, "all_to_all_v (split lists)");
  std::string problem;
  for (size_t m = 0; m < n && problem.empty(); ++m)
    if (theirs[m] != recv_counts[m])
      problem = fmt::format(
          "all_to_all_v on group '{}': group rank {} sends {} elements to group rank {}, which expects {} "
          "(its "
          "recv_counts[{}]); the split lists must agree",
          name_, m, theirs[m], rank_, recv_counts[m], m);
  // Agree on the verdict so that every member throws, not only the one that saw the mismatch.
  int bad = problem.empty() ? 0 : 1, any_bad = 0;
  check(MPI_Iallreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, comm_, &r), "MPI_Iallreduce");
  wait(r, "all_to_all_v (split lists)");
  if (!problem.empty()) throw Error(problem);
  EXPAR_ASSERT(
      any_bad == 0,
      "all_to_all_v on group '{}': another member's split lists disagree with its peers' (its own message "
      "names them)",
      name_);
  const size_t esize = dtype_size(dtype);
  count_sends(send_counts, esize);
  alltoallv_bytes(send, send_counts, recv, recv_counts, esize, "all_to_all_v");
}

std::unique_ptr<SymmetricHeap> MpiComm::make_heap() {
  return make_heap(heap_mode_from_env());
}

std::unique_ptr<SymmetricHeap> MpiComm::make_heap(HeapMode mode) {
  return std::make_unique<MpiHeap>(comm_, name_ + ".heap", timeout_seconds_, mode, nodes_);
}

}  // namespace expar::mpi
