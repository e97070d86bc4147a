#pragma once
// A SymmetricHeap wrapper for tests that records every one-sided operation its rank issues. peer_ptr
// answers null for every peer, so a path cannot move a row by load/store behind the counters' back: every
// row goes through put() or get() and is logged with its peer, buffer, offset and size.
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "expar/comm/symmetric_heap.hpp"

namespace expar::testing {

struct OneSidedOp {
  int peer = -1;
  BufferId buffer = -1;
  size_t offset = 0, bytes = 0;
  auto key() const { return std::tie(peer, buffer, offset, bytes); }
  bool operator<(const OneSidedOp& o) const { return key() < o.key(); }
  bool operator==(const OneSidedOp& o) const { return key() == o.key(); }
};

struct OneSidedLog {
  std::vector<OneSidedOp> puts, gets;
  int64_t barriers = 0;
};

class CountingHeap final : public SymmetricHeap {
 public:
  explicit CountingHeap(std::unique_ptr<SymmetricHeap> inner) : inner_(std::move(inner)) {}

  // What this rank issued since the last take() (and starts a new log).
  OneSidedLog take() { return std::exchange(log_, {}); }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  BufferId allocate(const std::string& name, size_t bytes, MemCategory category) override {
    return inner_->allocate(name, bytes, category);
  }
  void* local(BufferId buffer) override { return inner_->local(buffer); }
  size_t bytes(BufferId buffer) const override { return inner_->bytes(buffer); }
  void put(int peer, BufferId buffer, size_t offset, const void* src, size_t bytes) override {
    log_.puts.push_back({peer, buffer, offset, bytes});
    inner_->put(peer, buffer, offset, src, bytes);
  }
  void get(int peer, BufferId buffer, size_t offset, void* dst, size_t bytes) override {
    log_.gets.push_back({peer, buffer, offset, bytes});
    inner_->get(peer, buffer, offset, dst, bytes);
  }
  void quiet() override { inner_->quiet(); }
  void barrier() override {
    ++log_.barriers;
    inner_->barrier();
  }
  void* peer_ptr(int, BufferId) override { return nullptr; }
  void signal(int peer, int slot, uint64_t value) override { inner_->signal(peer, slot, value); }
  void wait_signal(int slot, uint64_t value) override { inner_->wait_signal(slot, value); }

 private:
  std::unique_ptr<SymmetricHeap> inner_;
  OneSidedLog log_;
};

}  // namespace expar::testing
