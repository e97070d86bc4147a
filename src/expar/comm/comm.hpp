#pragma once
// Comm: a group of ranks and the collectives expar needs, with host split lists for the -v variants.
// Zero-length contributions are legal everywhere (a rank with no tokens is normal in MoE).
// Backends: threads/ (ranks are threads of one process; the embedded default) and mpi/ (Open MPI).
//
// All counts and offsets are in ELEMENTS of the given dtype. Collectives are deterministic: reductions
// sum contributions in rank order 0..size-1, so results are bit-identical whatever the timing.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "expar/core/dtype.hpp"

namespace expar {

class SymmetricHeap;

enum class ReduceOp : uint8_t { Sum, Max };

// What one member sent, split by whether the receiver is on the sender's node (shared memory) or on another
// node (the network). A message is one transfer to one peer: for a collective, one per peer that gets data
// from this member (the logical exchange, whatever algorithm the backend runs underneath); for a
// symmetric heap, one per put() or get().
struct TrafficStats {
  int64_t intra_node_messages = 0, intra_node_bytes = 0;
  int64_t inter_node_messages = 0, inter_node_bytes = 0;
  void add(bool across_nodes, size_t bytes) {
    (across_nodes ? inter_node_messages : intra_node_messages) += 1;
    (across_nodes ? inter_node_bytes : intra_node_bytes) += static_cast<int64_t>(bytes);
  }
  TrafficStats& operator+=(const TrafficStats& o) {
    intra_node_messages += o.intra_node_messages;
    intra_node_bytes += o.intra_node_bytes;
    inter_node_messages += o.inter_node_messages;
    inter_node_bytes += o.inter_node_bytes;
    return *this;
  }
};

// How many times each collective was called on this Comm object; used by tests to assert, e.g., that the
// rowwise path makes no host split list (zero all_to_all_v calls).
struct CommStats {
  int64_t barrier = 0, broadcast = 0, all_reduce = 0, all_gather = 0, all_gather_v = 0, reduce_scatter = 0,
          reduce_scatter_v = 0, all_to_all = 0, all_to_all_v = 0;
  int64_t bytes_sent = 0;  // to peers, whichever node they are on
  TrafficStats traffic;
};

// Nodes of a group: node_of[member] in group-rank order, numbered 0, 1, ... in the order in which each
// node's first member appears. Members of one node share memory; between nodes is the network.
struct NodeMap {
  std::vector<int> node_of;
  int num_nodes = 1;
  // Renumbers arbitrary node labels (one per member) into the form above.
  static NodeMap from_labels(std::span<const int64_t> labels);
  bool across(int a, int b) const {
    return node_of[static_cast<size_t>(a)] != node_of[static_cast<size_t>(b)];
  }
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Human-readable name for messages ("world", "ep_mp[0,1]", ...).
  virtual std::string name() const = 0;
  // The world ranks of this group's members, in group-rank order.
  virtual std::vector<int> world_ranks() const = 0;

  // Collective over this group: members with the same color form a new group ordered by (key, rank).
  virtual std::shared_ptr<Comm> split(int color, int key, const std::string& name) = 0;
  // Collective over this group: every member passes the same list of groups (each a list of ranks of
  // THIS group, together a partition of it); returns the group that contains the caller.
  std::shared_ptr<Comm> subgroup(const std::vector<std::vector<int>>& partition, const std::string& name);

  virtual void barrier() = 0;
  virtual void broadcast(void* data, size_t count, DType dtype, int root) = 0;
  // In place: data[count] becomes the reduction over all members.
  virtual void all_reduce(void* data, size_t count, DType dtype, ReduceOp op) = 0;
  // recv[size * count] = concatenation of every member's send[count] in rank order.
  virtual void all_gather(const void* send, void* recv, size_t count, DType dtype) = 0;
  // recv = concatenation of every member's send[recv_counts[r]] in rank order; send_count must equal
  // recv_counts[rank()].
  virtual void all_gather_v(const void* send, size_t send_count, void* recv,
                            std::span<const size_t> recv_counts, DType dtype) = 0;
  // send[size * count]: block r is summed over members and lands in member r's recv[count].
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType dtype) = 0;
  // send holds size() blocks of lengths counts[0..size); member r receives the sum of block r in
  // recv[counts[r]].
  virtual void reduce_scatter_v(const void* send, void* recv, std::span<const size_t> counts,
                                DType dtype) = 0;
  // send[size * count]: block r goes to member r; recv[size * count]: block r came from member r.
  virtual void all_to_all(const void* send, void* recv, size_t count, DType dtype) = 0;
  // Host split lists: send_counts[r] elements to member r (contiguous, in rank order); recv_counts[r] from r.
  virtual void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                            std::span<const size_t> recv_counts, DType dtype) = 0;

  // A symmetric heap bound to this group (collective).
  virtual std::unique_ptr<SymmetricHeap> make_heap() = 0;

  // The node of every member. Threads backend: LaunchOptions::ranks_per_node emulates nodes (default: one
  // node); MPI: the ranks that share memory (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED).
  const NodeMap& nodes() const { return nodes_; }
  int node() const { return nodes_.node_of[static_cast<size_t>(rank())]; }

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

  // Typed conveniences.
  template <typename T>
  void all_reduce(std::span<T> data, ReduceOp op = ReduceOp::Sum) {
    all_reduce(data.data(), data.size(), dtype_of<T>(), op);
  }

 protected:
  // What every collective records of this member's sends: bytes_sent, and one message per peer with data,
  // within or across nodes. count_sends: counts[r] elements of esize bytes to member r.
  void count_send_to_each_peer(size_t bytes);
  void count_sends(std::span<const size_t> counts, size_t esize);

  CommStats stats_;
  NodeMap nodes_;  // set by the backend's constructor
};

}  // namespace expar
