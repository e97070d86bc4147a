#include "expar/nn/init.hpp"

#include <cmath>
#include <string>

#include "expar/core/error.hpp"
#include "expar/core/rng.hpp"

namespace expar::nn {

uint64_t param_stream(std::string_view name) {
  return stream_of(std::string(name).c_str());
}

void init_normal(Tensor& t, uint64_t seed, std::string_view name, float stddev, int64_t first_element) {
  EXPAR_CHECK(!name.empty(),
              "init_normal: the parameter name is empty: name every parameter (it selects the "
              "random stream)");
  EXPAR_CHECK(std::isfinite(stddev) && stddev >= 0.0f,
              "init_normal: stddev={} for {} must be finite and >= 0", stddev, name);
  EXPAR_CHECK(first_element >= 0, "init_normal: first_element={} for {} must not be negative", first_element,
              name);
  fill_normal(t, seed, param_stream(name), stddev, static_cast<uint64_t>(first_element));
}

void init_constant(Tensor& t, float value) {
  t.fill(value);
}

}  // namespace expar::nn
