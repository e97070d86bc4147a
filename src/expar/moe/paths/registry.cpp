// Where paths are registered: one declaration and one table line per path.
#include <fmt/ranges.h>

#include "expar/core/error.hpp"
#include "expar/moe/paths/path.hpp"

namespace expar {

std::unique_ptr<ExpertPath> make_local_path(Comm& ep_group, const PathOptions& options);
std::unique_ptr<ExpertPath> make_block_path(Comm& ep_group, const PathOptions& options);
std::unique_ptr<ExpertPath> make_rowwise_path(Comm& ep_group, const PathOptions& options);
std::unique_ptr<ExpertPath> make_agrs_path(Comm& ep_group, const PathOptions& options);
std::unique_ptr<ExpertPath> make_agrs_decode_path(Comm& ep_group, const PathOptions& options);

namespace {

using PathFactory = std::unique_ptr<ExpertPath> (*)(Comm&, const PathOptions&);
struct PathEntry {
  const char* name;
  PathFactory make;
};

constexpr PathEntry kPaths[] = {
    {"local", make_local_path},
    {"block", make_block_path},
    {"rowwise", make_rowwise_path},
    {"agrs", make_agrs_path},
    {"agrs-decode", make_agrs_decode_path},
};

}  // namespace

Tensor ExpertPath::expert_output_buffer(const RouteMap& map, int64_t d, PathState&) {
  return Tensor::empty({map.capacity_rows, d});
}

Tensor ExpertPath::expert_grad_input_buffer(const RouteMap& map, int64_t d, PathState&) {
  return Tensor::empty({map.capacity_rows, d});
}

void require_f32_payloads(const std::string& path, const PayloadPrecision& precision) {
  EXPAR_CHECK(precision.all_f32(),
              "path '{}' moves its rows in f32 only, but the payload precision is {}: choose path block or "
              "rowwise for reduced-precision payloads, or set every --*-precision to f32",
              path, precision.describe());
}

std::vector<std::string> path_names() {
  std::vector<std::string> names;
  for (const PathEntry& p : kPaths) names.emplace_back(p.name);
  return names;
}

std::unique_ptr<ExpertPath> make_path(const std::string& name, Comm& ep_group, const PathOptions& options) {
  for (const PathEntry& p : kPaths)
    if (name == p.name) return p.make(ep_group, options);
  fail("execution path '{}' is unknown: choose one of {}", name, fmt::join(path_names(), ", "));
}

}  // namespace expar
