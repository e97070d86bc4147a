// Micro-benchmarks of the MoE building blocks `expar bench paths` times inside a layer step: the route-map
// build, the local permute (dispatch of the local path) and the grouped expert GEMM (SwiGLU MLP forward).
// Run: build/<dir>/microbench/moe_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <numeric>
#include <vector>

#include "expar/comm/launcher.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/expert_mlp.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/route_map.hpp"

namespace expar {
namespace {

constexpr int kExperts = 32;
constexpr int kTopK = 4;

// Distinct random experts per token (a partial Fisher-Yates shuffle per token, deterministic).
Tensor random_topk(int64_t tokens) {
  Tensor idx = Tensor::empty({tokens, kTopK}, DType::I32);
  int32_t* out = idx.data<int32_t>();
  std::vector<int32_t> experts(kExperts);
  for (int64_t t = 0; t < tokens; ++t) {
    std::iota(experts.begin(), experts.end(), 0);
    for (int k = 0; k < kTopK; ++k) {
      const uint32_t j =
          k + random_u32(5, static_cast<uint64_t>(t), static_cast<uint64_t>(k)) % (kExperts - k);
      std::swap(experts[static_cast<size_t>(k)], experts[j]);
      out[t * kTopK + k] = experts[static_cast<size_t>(k)];
    }
  }
  return idx;
}

RouteMap local_map(const Tensor& idx) {
  const ExpertPlacement placement(kExperts, 1);
  const std::vector<int64_t> requests = count_requests(idx, kExperts);
  const std::vector<int64_t> tokens = {idx.dim(0)};
  return build_route_map(idx, 0, requests, tokens, placement, CapacityPolicy::dropless());
}

void BM_RouteMapBuild(benchmark::State& state) {
  const Tensor idx = random_topk(state.range(0));
  const ExpertPlacement placement(kExperts, 1);
  const std::vector<int64_t> tokens = {idx.dim(0)};
  for (auto _ : state) {
    const std::vector<int64_t> requests = count_requests(idx, kExperts);
    RouteMap map = build_route_map(idx, 0, requests, tokens, placement, CapacityPolicy::dropless());
    benchmark::DoNotOptimize(map.dst_row.raw());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0) * kTopK);
}
BENCHMARK(BM_RouteMapBuild)->Arg(1024)->Arg(4096)->Arg(16384)->Unit(benchmark::kMicrosecond);

void BM_LocalPermute(benchmark::State& state) {
  const int64_t tokens = state.range(0), d = state.range(1);
  const RouteMap map = local_map(random_topk(tokens));
  Tensor x = Tensor::empty({tokens, d});
  fill_normal(x, 1, 1, 1.0f);
  const ExpertPlacement placement(kExperts, 1);
  PathOptions options;
  options.model_dim = d;
  options.top_k = kTopK;
  options.placement = &placement;
  // The local path needs a Comm of one rank.
  run_ranks(1, [&](Comm& world) {
    auto path = make_path("local", world, options);
    for (auto _ : state) {
      PathState path_state;
      Tensor in = path->dispatch_forward(x, map, path_state);
      benchmark::DoNotOptimize(in.raw());
    }
  });
  // Bytes read + written: every route's row once each way.
  state.SetBytesProcessed(state.iterations() * 2 * map.recv_rows * d * static_cast<int64_t>(sizeof(float)));
}
BENCHMARK(BM_LocalPermute)->Args({4096, 256})->Args({4096, 512})->Args({4096, 1024})->Args({16384, 256})->Unit(benchmark::kMicrosecond);

void BM_GroupedGemmForward(benchmark::State& state) {
  const int64_t tokens = state.range(0), d = state.range(1), h = state.range(2);
  const RouteMap map = local_map(random_topk(tokens));
  Tensor in = Tensor::empty({map.capacity_rows, d});
  fill_normal(in, 2, 2, 1.0f);
  ExpertWeights w;
  w.w1 = Tensor::empty({kExperts, h, d});
  w.w3 = Tensor::empty({kExperts, h, d});
  w.w2 = Tensor::empty({kExperts, d, h});
  fill_normal(w.w1, 3, 1, 0.05f);
  fill_normal(w.w3, 3, 2, 0.05f);
  fill_normal(w.w2, 3, 3, 0.05f);
  Tensor out = Tensor::empty({map.capacity_rows, d});
  for (auto _ : state) {
    ExpertMlpState mlp;
    expert_mlp_forward(in, PayloadFormat::F32, map.expert_offsets, w, out, &mlp);
    benchmark::DoNotOptimize(out.raw());
  }
  const double flops =
      6.0 * static_cast<double>(map.recv_rows) * static_cast<double>(d) * static_cast<double>(h);
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_GroupedGemmForward)
    ->Args({1024, 512, 1024})
    ->Args({4096, 1024, 2048})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace expar
