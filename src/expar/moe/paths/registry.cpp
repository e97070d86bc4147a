// Where paths are registered: one declaration and one table line per path.
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>

#include "expar/comm/comm.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/lease_pool.hpp"
#include "expar/moe/paths/path.hpp"

namespace expar {

std::unique_ptr<ExpertPath> make_local_path(Comm& ep_group, const PathOptions& options);
std::unique_ptr<ExpertPath> make_block_path(Comm& ep_group, const PathOptions& options);
std::unique_ptr<ExpertPath> make_rowwise_path(Comm& ep_group, const PathOptions& options);
std::unique_ptr<ExpertPath> make_agrs_path(Comm& ep_group, const PathOptions& options);
std::unique_ptr<ExpertPath> make_agrs_decode_path(Comm& ep_group, const PathOptions& options);
std::unique_ptr<ExpertPath> make_aggregated_path(Comm& ep_group, const PathOptions& options);

namespace {

using PathFactory = std::unique_ptr<ExpertPath> (*)(Comm&, const PathOptions&);
struct PathEntry {
  PathTraits traits;
  PathFactory make;
};

const std::vector<PathEntry>& entries() {
  //                     name          single  =block  reduced decode waves  shared heap
  static const std::vector<PathEntry> paths = {
      {{"local", true, false, false, false}, make_local_path},
      {{"block", false, true, true, false, true}, make_block_path},
      {{"rowwise", false, true, true, false, true, true}, make_rowwise_path},
      {{"agrs", false, false, false, false}, make_agrs_path},
      {{"agrs-decode", false, false, false, true}, make_agrs_decode_path},
      {{"aggregated", false, true, true, false, true, true}, make_aggregated_path},
  };
  return paths;
}

}  // namespace

Tensor ExpertPath::expert_output_buffer(const RouteMap& map, int64_t d, PathState&) {
  return Tensor::empty({map.capacity_rows, d});
}

Tensor ExpertPath::expert_grad_input_buffer(const RouteMap& map, int64_t d, PathState&) {
  return Tensor::empty({map.capacity_rows, d});
}

namespace {

[[noreturn]] void no_waves(const ExpertPath& path) {
  fail("path '{}' has no wave schedule: pass --waves 1, or choose path {}", path.name(),
       paths_with(&PathTraits::waves));
}

}  // namespace

Tensor ExpertPath::dispatch_forward_begin(const Tensor&, const RouteMap&, PathState&) {
  no_waves(*this);
}
void ExpertPath::dispatch_forward_wave(const Tensor&, const RouteMap&, PathState&, int) {
  no_waves(*this);
}
void ExpertPath::combine_forward_wave(const Tensor&, const RouteMap&, PathState&, int) {
  no_waves(*this);
}
Tensor ExpertPath::combine_forward_end(const Tensor&, const RouteMap&, PathState&) {
  no_waves(*this);
}
Tensor ExpertPath::combine_backward_begin(const Tensor&, const Tensor&, const RouteMap&, PathState&,
                                          Tensor&) {
  no_waves(*this);
}
void ExpertPath::combine_backward_wave(const Tensor&, const Tensor&, const RouteMap&, PathState&, int) {
  no_waves(*this);
}
void ExpertPath::dispatch_backward_wave(const Tensor&, const RouteMap&, PathState&, int) {
  no_waves(*this);
}
Tensor ExpertPath::dispatch_backward_end(const RouteMap&, PathState&) {
  no_waves(*this);
}

void require_f32_payloads(const std::string& path, const PayloadPrecision& precision) {
  if (precision.all_f32()) return;
  fail(
      "path '{}' moves its rows in f32 only, but the payload precision is {}: choose path {} for "
      "reduced-precision payloads, or set every --*-precision to f32",
      path, precision.describe(), paths_with(&PathTraits::reduced_precision));
}

SymmetricHeap& path_heap(const std::string& path, Comm& ep_group, const PathOptions& options,
                         std::unique_ptr<SymmetricHeap>& own) {
  SymmetricHeap* heap = options.heap;
  if (heap == nullptr) {
    own = ep_group.make_heap();
    heap = own.get();
  }
  EXPAR_CHECK(
      heap->size() == ep_group.size() && heap->rank() == ep_group.rank(),
      "{} path: the shared symmetric heap has rank {} of {} but EP group '{}' has rank {} of {}: pass a "
      "heap made by this EP group's make_heap()",
      path, heap->rank(), heap->size(), ep_group.name(), ep_group.rank(), ep_group.size());
  return *heap;
}

LeasePool& step_lease_pool(const std::string& path, const PathOptions& options, SymmetricHeap& heap,
                           int64_t capacity_rows, int64_t d, std::shared_ptr<LeasePool>& own,
                           int& generation) {
  const size_t needed = rowwise_slot_bytes(capacity_rows, d, options.precision);
  if (options.lease_pool != nullptr) {
    EXPAR_ASSERT(options.lease_pool->slot_bytes() >= needed,
                 "{} path: capacity_rows={} x d={} ({}) needs {} bytes per symmetric slot but the shared "
                 "lease pool has "
                 "slots of {} bytes: make the pool with rowwise_slot_bytes() >= {} (the capacity is the "
                 "dropless bound "
                 "sum_s T_s*min(K, E_L) or the capacity policy's, identical on every rank)",
                 path, capacity_rows, d, options.precision.describe(), needed,
                 options.lease_pool->slot_bytes(), needed);
    return *options.lease_pool;
  }
  if (!own || own->slot_bytes() < needed) {
    // Rounded up to a power of two of rows so that a slowly growing capacity reallocates rarely; a replaced
    // pool stays alive (its symmetric memory stays resident) while earlier steps still hold its leases.
    const int64_t rows =
        static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(1, capacity_rows))));
    own =
        std::make_shared<LeasePool>(heap, fmt::format("{}{}.gen{}", path, options.block_index, generation++),
                                    rowwise_slot_bytes(rows, d, options.precision));
  }
  return *own;
}

void check_dispatch_input(const std::string& path, const Comm& ep_group, const RouteMap& map,
                          const Tensor& x) {
  EXPAR_ASSERT(
      map.sources_are_partitions(),
      "{} dispatch: the route map sends its {} sources' rows to {} expert partitions; this path needs "
      "one partition per source rank (only agrs takes partitions of several ranks)",
      path, map.ep_size, map.partitions);
  EXPAR_CHECK(
      map.ep_size == ep_group.size() && map.ep_rank == ep_group.rank(),
      "{} dispatch: the route map is for EP rank {} of {} but the path's group '{}' has rank {} of {}", path,
      map.ep_rank, map.ep_size, ep_group.name(), ep_group.rank(), ep_group.size());
  EXPAR_CHECK(x.dtype() == DType::F32 && x.ndim() == 2 && x.dim(0) == map.tokens,
              "{} dispatch: x must be f32 [{}, d], got {} {}", path, map.tokens, dtype_name(x.dtype()),
              shape_string(x.shape()));
}

const std::vector<PathTraits>& path_registry() {
  static const std::vector<PathTraits> traits = [] {
    std::vector<PathTraits> t;
    for (const PathEntry& p : entries()) t.push_back(p.traits);
    return t;
  }();
  return traits;
}

std::vector<std::string> path_names() {
  std::vector<std::string> names;
  for (const PathTraits& p : path_registry()) names.push_back(p.name);
  return names;
}

std::vector<std::string> path_names_with(bool PathTraits::*trait) {
  std::vector<std::string> names;
  for (const PathTraits& p : path_registry())
    if (p.*trait) names.push_back(p.name);
  return names;
}

std::string paths_with(bool PathTraits::*trait) {
  return fmt::format("{}", fmt::join(path_names_with(trait), " or "));
}

const PathTraits& path_traits(const std::string& name) {
  for (const PathTraits& p : path_registry())
    if (p.name == name) return p;
  fail("execution path '{}' is unknown: choose one of {}", name, fmt::join(path_names(), ", "));
}

std::unique_ptr<ExpertPath> make_path(const std::string& name, Comm& ep_group, const PathOptions& options) {
  const PathTraits& traits = path_traits(name);  // an unknown name is refused with the list
  if (!traits.reduced_precision) require_f32_payloads(name, options.precision);
  for (const PathEntry& p : entries())
    if (name == p.traits.name) return p.make(ep_group, options);
  fail("execution path '{}' has traits but no factory", name);
}

}  // namespace expar
