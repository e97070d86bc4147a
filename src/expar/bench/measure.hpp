#pragma once
// The helpers every benchmark of the bench layer shares: medians, the core budget check, the slowest rank,
// and writing a report file. (Timers are core/timer.hpp; phase timers moe/phase_timer.hpp.)
#include <string>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/core/timer.hpp"

namespace expar::bench {

// The median (upper middle for an even count); 0 for none.
double median(std::vector<double> v);

// Cores of this machine (at least 1).
unsigned machine_cores();

// Throws expar::Error unless ranks x threads compute threads fit the cores (timings would measure the
// scheduler), or `oversubscribe` allows it; names the flags --ranks, --threads and --oversubscribe.
void check_cores(int ranks, int threads, bool oversubscribe);

// Element-wise max over the ranks of `world` (collective).
void max_over_ranks(Comm& world, std::vector<double>& values);

// Seconds of the slowest rank for fn, from a world barrier (collective).
template <typename Fn>
double timed_max(Comm& world, Fn&& fn) {
  world.barrier();
  Timer t;
  fn();
  double s = t.seconds();
  world.all_reduce(&s, 1, DType::F64, ReduceOp::Max);
  return s;
}

// Writes `text` to `path`; throws expar::Error naming the path when it cannot.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace expar::bench
