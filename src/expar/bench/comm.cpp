#include "expar/bench/comm.hpp"

#include <cstring>
#include <numeric>

#include "expar/bench/measure.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/error.hpp"
#include "expar/core/rng.hpp"

namespace expar::bench {

namespace {

double gbps(size_t bytes, double seconds) {
  return static_cast<double>(bytes) / seconds / 1e9;
}

}  // namespace

CommBandwidth measure_comm_bandwidth(Comm& world, size_t bytes_per_rank, int repeats) {
  EXPAR_CHECK(repeats >= 1, "--repeats {}: use at least 1", repeats);
  EXPAR_CHECK(bytes_per_rank >= 65536, "--bytes {}: use at least 65536 (one 64 KiB row)", bytes_per_rank);
  const int n = world.size(), me = world.rank();
  const size_t total = bytes_per_rank;
  CommBandwidth result;
  result.bytes_per_rank = total;
  auto heap = world.make_heap();
  BufferId buf = heap->allocate("bench", total);
  std::vector<std::byte> src(total, std::byte{1}), dst(total);
  const int peer = (me + 1) % n;
  for (size_t row = 256; row <= 65536; row *= 4) {
    const size_t rows = total / row;
    // Rows land at shuffled offsets, as token rows do in dispatch.
    std::vector<size_t> order(rows);
    std::iota(order.begin(), order.end(), size_t{0});
    for (size_t i = rows - 1; i > 0; --i) std::swap(order[i], order[random_u32(7, 1, i) % (i + 1)]);
    std::vector<double> put_s, get_s, copy_s;
    for (int rep = 0; rep < repeats; ++rep) {
      put_s.push_back(timed_max(world, [&] {
        for (size_t i = 0; i < rows; ++i) heap->put(peer, buf, order[i] * row, src.data() + i * row, row);
        heap->quiet();
        heap->barrier();
      }));
      get_s.push_back(timed_max(world, [&] {
        for (size_t i = 0; i < rows; ++i) heap->get(peer, buf, order[i] * row, dst.data() + i * row, row);
        heap->quiet();
      }));
      copy_s.push_back(timed_max(world, [&] {
        auto* local = static_cast<std::byte*>(heap->local(buf));
        for (size_t i = 0; i < rows; ++i) std::memcpy(local + order[i] * row, src.data() + i * row, row);
      }));
    }
    result.row_sizes.push_back(
        {row, rows, gbps(total, median(put_s)), gbps(total, median(get_s)), gbps(total, median(copy_s))});
  }
  // all_to_all_v: an even split of the same volume to every member (f32 elements).
  const size_t elems = total / 4 / static_cast<size_t>(n);
  std::vector<size_t> counts(static_cast<size_t>(n), elems);
  std::vector<float> send(elems * static_cast<size_t>(n), 1.0f), recv(elems * static_cast<size_t>(n));
  std::vector<double> a2a_s, copy_s;
  for (int rep = 0; rep < repeats; ++rep) {
    a2a_s.push_back(
        timed_max(world, [&] { world.all_to_all_v(send.data(), counts, recv.data(), counts, DType::F32); }));
    copy_s.push_back(
        timed_max(world, [&] { std::memcpy(recv.data(), send.data(), send.size() * sizeof(float)); }));
  }
  result.all_to_all_bytes = send.size() * sizeof(float);
  result.all_to_all_gbps = gbps(result.all_to_all_bytes, median(a2a_s));
  result.all_to_all_memcpy_gbps = gbps(result.all_to_all_bytes, median(copy_s));
  heap->barrier();
  return result;
}

}  // namespace expar::bench
