#pragma once
// A Comm of one rank for single-rank tests of the MoE code (every collective is a copy).
#include <cstring>
#include <stdexcept>

#include "expar/comm/comm.hpp"
#include "expar/comm/symmetric_heap.hpp"

namespace expar::testing {

class SoloComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "solo"; }
  std::vector<int> world_ranks() const override { return {0}; }
  std::shared_ptr<Comm> split(int, int, const std::string&) override { return std::make_shared<SoloComm>(); }
  void barrier() override { ++stats_.barrier; }
  void broadcast(void*, size_t, DType, int) override { ++stats_.broadcast; }
  void all_reduce(void*, size_t, DType, ReduceOp) override { ++stats_.all_reduce; }
  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    ++stats_.all_gather;
    copy(send, recv, count, dtype);
  }
  void all_gather_v(const void* send, size_t count, void* recv, std::span<const size_t>,
                    DType dtype) override {
    ++stats_.all_gather_v;
    copy(send, recv, count, dtype);
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype) override {
    ++stats_.reduce_scatter;
    copy(send, recv, count, dtype);
  }
  void reduce_scatter_v(const void* send, void* recv, std::span<const size_t> counts, DType dtype) override {
    ++stats_.reduce_scatter_v;
    copy(send, recv, counts[0], dtype);
  }
  void all_to_all(const void* send, void* recv, size_t count, DType dtype) override {
    ++stats_.all_to_all;
    copy(send, recv, count, dtype);
  }
  void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                    std::span<const size_t>, DType dtype) override {
    ++stats_.all_to_all_v;
    copy(send, recv, send_counts[0], dtype);
  }
  std::unique_ptr<SymmetricHeap> make_heap() override { throw std::logic_error("SoloComm has no heap"); }

 private:
  static void copy(const void* send, void* recv, size_t count, DType dtype) {
    if (count) std::memmove(recv, send, count * dtype_size(dtype));
  }
};

}  // namespace expar::testing
