#pragma once
// `expar bench payload`: the product's block, rowwise and aggregated paths (every registered path that takes
// a reduced precision) moving their rows in f32, bf16 and MXFP8 (seed 000 §5.4, §5.8): `expar bench paths` at
// each uniform payload precision (moe/payload_precision.hpp), side by side. Per path and format: the encoded
// row size, the bytes each leg moves (max over ranks) and the dispatch + combine time of the forward and
// backward passes (every phase but the router, the route map and the grouped GEMM, with --sync-comm's waits
// left out), each beside the f32 run of the same path.
#include <cstdint>
#include <string>
#include <vector>

#include "expar/bench/paths.hpp"

namespace expar::bench {

struct PayloadBenchOptions : LayerBenchSetup {
  PayloadBenchOptions() {
    hidden_dim = 256;  // the GEMM is not what this measures
    repeats = 5;
  }
  std::vector<std::string> formats = {"f32", "bf16", "mxfp8", "mxfp8-floor"};
};

struct PayloadRow {
  std::string path, format;
  size_t row_bytes = 0;
  PathResult result;
};

struct PayloadReport {
  PayloadBenchOptions options;
  std::vector<PayloadRow> rows;  // path-major, f32 first
};

// Throws expar::Error naming the flag (unknown format, a shape bench paths refuses).
PayloadReport measure_payload(const PayloadBenchOptions& o);

std::string format_payload_table(const PayloadReport& report);
std::string payload_json(const PayloadReport& report);

}  // namespace expar::bench
