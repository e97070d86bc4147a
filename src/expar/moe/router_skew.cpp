#include "expar/moe/router_skew.hpp"

#include <cmath>
#include <numeric>
#include <utility>

#include "expar/core/error.hpp"
#include "expar/core/rng.hpp"

namespace expar {

void check_router_skew(double exponent) {
  EXPAR_CHECK(std::isfinite(exponent) && exponent >= 0,
              "--router-skew {} must be a finite number >= 0 (the Zipf exponent s of the experts' "
              "popularity; real models measure about 1): pass --router-skew 1, or 0 for no skew",
              exponent);
}

std::vector<int> router_skew_ranks(int num_experts, uint64_t seed, int layer) {
  EXPAR_CHECK(num_experts >= 1, "router skew: {} experts, need at least 1", num_experts);
  EXPAR_CHECK(layer >= 0, "router skew: layer {} must be >= 0 (a layer index)", layer);
  const uint64_t first = static_cast<uint64_t>(layer) * static_cast<uint64_t>(num_experts);
  std::vector<int> ranks(static_cast<size_t>(num_experts));
  std::iota(ranks.begin(), ranks.end(), 1);
  const uint64_t stream = stream_of("router_skew");
  for (int i = num_experts - 1; i > 0; --i) {
    const auto j = static_cast<int>(random_u32(seed, stream, first + static_cast<uint64_t>(i)) %
                                    static_cast<uint32_t>(i + 1));
    std::swap(ranks[static_cast<size_t>(i)], ranks[static_cast<size_t>(j)]);
  }
  return ranks;
}

Tensor router_skew_bias(double exponent, int num_experts, uint64_t seed, int layer) {
  check_router_skew(exponent);
  Tensor bias = Tensor::zeros({num_experts}, DType::F32, MemCategory::DenseWeights);
  if (exponent == 0) return bias;
  const std::vector<int> ranks = router_skew_ranks(num_experts, seed, layer);
  for (int e = 0; e < num_experts; ++e)
    bias.data<float>()[e] =
        static_cast<float>(-exponent * std::log(static_cast<double>(ranks[static_cast<size_t>(e)])));
  return bias;
}

void add_router_skew(Tensor& logit_bias, double exponent, int num_experts, uint64_t seed, int layer) {
  // A new tensor, not an update in place: a loaded bias may be a view of a mapped, read-only file.
  Tensor sum = router_skew_bias(exponent, num_experts, seed, layer);
  if (logit_bias.defined() && logit_bias.numel() > 0) {
    EXPAR_CHECK(logit_bias.dtype() == DType::F32 && logit_bias.numel() == num_experts,
                "router skew: the router's logit bias is {} {}, not f32 [{}]", dtype_name(logit_bias.dtype()),
                shape_string(logit_bias.shape()), num_experts);
    for (int e = 0; e < num_experts; ++e) sum.data<float>()[e] += logit_bias.data<float>()[e];
  }
  logit_bias = std::move(sum);
}

}  // namespace expar
