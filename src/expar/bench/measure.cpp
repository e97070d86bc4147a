#include "expar/bench/measure.hpp"

#include <algorithm>
#include <fstream>
#include <thread>

#include "expar/comm/comm.hpp"
#include "expar/core/error.hpp"

namespace expar::bench {

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

unsigned machine_cores() {
  return std::max(1u, std::thread::hardware_concurrency());
}

void check_cores(int ranks, int threads, bool oversubscribe) {
  const unsigned cores = machine_cores();
  EXPAR_CHECK(oversubscribe || static_cast<unsigned>(ranks * threads) <= cores,
              "--ranks {} x --threads {} = {} compute threads but this machine has {} cores: timings would "
              "measure the scheduler; lower --ranks or --threads, or pass --oversubscribe",
              ranks, threads, ranks * threads, cores);
}

void max_over_ranks(Comm& world, std::vector<double>& values) {
  world.all_reduce(values.data(), values.size(), DType::F64, ReduceOp::Max);
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  EXPAR_CHECK(out.good(), "cannot write '{}': check the directory exists and is writable", path);
  out << text;
  EXPAR_CHECK(out.good(), "writing '{}' failed: check the disk has space", path);
}

}  // namespace expar::bench
