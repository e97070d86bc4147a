#pragma once
// What `expar bench comm` measures: one-sided put/get bandwidth of row-sized transfers (256 B .. 64 KiB, at
// shuffled offsets as token rows land in dispatch) and all_to_all_v bandwidth of a communication backend,
// each beside memcpy of the same pattern in the same run, medians over repeats (the slowest rank's time).
#include <cstddef>
#include <vector>

#include "expar/comm/comm.hpp"

namespace expar::bench {

struct CommRowSize {
  size_t row_bytes = 0, rows = 0;
  double put_gbps = 0, get_gbps = 0, memcpy_gbps = 0;
};

struct CommBandwidth {
  size_t bytes_per_rank = 0;  // moved per transfer
  std::vector<CommRowSize> row_sizes;
  size_t all_to_all_bytes = 0;  // per rank
  double all_to_all_gbps = 0, all_to_all_memcpy_gbps = 0;
};

// Collective over `world`: every rank gets the same figures.
CommBandwidth measure_comm_bandwidth(Comm& world, size_t bytes_per_rank, int repeats);

}  // namespace expar::bench
