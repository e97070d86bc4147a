#pragma once
// RecordingComm: a Comm that forwards every call to another Comm and appends "<group> <collective>" to a
// log shared by every group split from it, so a test can assert the ORDER of one rank's collectives across
// its groups (seed 002's step lists), not only their counts. Groups are named by the split's name ("tp",
// "dp", ...); the wrapped Comm does the work, and this Comm's stats() mirror its counts.
#include <memory>
#include <string>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/comm/symmetric_heap.hpp"

namespace expar::testing {

class RecordingComm final : public Comm {
 public:
  RecordingComm(Comm& inner, std::string label, std::shared_ptr<std::vector<std::string>> log)
      : inner_(inner), label_(std::move(label)), log_(std::move(log)) {}
  RecordingComm(std::shared_ptr<Comm> inner, std::string label, std::shared_ptr<std::vector<std::string>> log)
      : owned_(std::move(inner)), inner_(*owned_), label_(std::move(label)), log_(std::move(log)) {}

  const std::vector<std::string>& log() const { return *log_; }
  void clear_log() { log_->clear(); }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name(); }
  std::vector<int> world_ranks() const override { return inner_.world_ranks(); }
  std::shared_ptr<Comm> split(int color, int key, const std::string& name) override {
    return std::make_shared<RecordingComm>(inner_.split(color, key, name), name, log_);
  }
  void barrier() override {
    record("barrier", [&] { inner_.barrier(); });
  }
  void broadcast(void* data, size_t count, DType dtype, int root) override {
    record("broadcast", [&] { inner_.broadcast(data, count, dtype, root); });
  }
  void all_reduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    record("all_reduce", [&] { inner_.all_reduce(data, count, dtype, op); });
  }
  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    record("all_gather", [&] { inner_.all_gather(send, recv, count, dtype); });
  }
  void all_gather_v(const void* send, size_t send_count, void* recv, std::span<const size_t> recv_counts,
                    DType dtype) override {
    record("all_gather_v", [&] { inner_.all_gather_v(send, send_count, recv, recv_counts, dtype); });
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype) override {
    record("reduce_scatter", [&] { inner_.reduce_scatter(send, recv, count, dtype); });
  }
  void reduce_scatter_v(const void* send, void* recv, std::span<const size_t> counts, DType dtype) override {
    record("reduce_scatter_v", [&] { inner_.reduce_scatter_v(send, recv, counts, dtype); });
  }
  void all_to_all(const void* send, void* recv, size_t count, DType dtype) override {
    record("all_to_all", [&] { inner_.all_to_all(send, recv, count, dtype); });
  }
  void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                    std::span<const size_t> recv_counts, DType dtype) override {
    record("all_to_all_v", [&] { inner_.all_to_all_v(send, send_counts, recv, recv_counts, dtype); });
  }
  std::unique_ptr<SymmetricHeap> make_heap() override {
    log_->push_back(label_ + " make_heap");
    return inner_.make_heap();
  }

 private:
  template <typename Call>
  void record(const char* collective, Call&& call) {
    log_->push_back(label_ + " " + collective);
    inner_.reset_stats();
    call();
    const CommStats& s = inner_.stats();
    stats_.barrier += s.barrier;
    stats_.broadcast += s.broadcast;
    stats_.all_reduce += s.all_reduce;
    stats_.all_gather += s.all_gather;
    stats_.all_gather_v += s.all_gather_v;
    stats_.reduce_scatter += s.reduce_scatter;
    stats_.reduce_scatter_v += s.reduce_scatter_v;
    stats_.all_to_all += s.all_to_all;
    stats_.all_to_all_v += s.all_to_all_v;
    stats_.bytes_sent += s.bytes_sent;
  }

  std::shared_ptr<Comm> owned_;
  Comm& inner_;
  std::string label_;
  std::shared_ptr<std::vector<std::string>> log_;
};

}  // namespace expar::testing
