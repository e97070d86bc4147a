#include "expar/core/product_precision.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>

#include "expar/core/bf16_round.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"

namespace expar {

namespace {

thread_local ProductPrecision current = ProductPrecision::F32;

}  // namespace

std::string product_precision_name(ProductPrecision precision) {
  return precision == ProductPrecision::BF16 ? "bf16" : "f32";
}

ProductPrecision product_precision_from_name(const std::string& name) {
  if (name == "f32") return ProductPrecision::F32;
  if (name == "bf16") return ProductPrecision::BF16;
  fail(
      "--precision {}: the products' precision must be one of {} (f32: today's f32 products; bf16: "
      "activations "
      "rounded to BF16 for the products over narrow weights)",
      name, fmt::join(product_precision_names(), ", "));
}

std::vector<std::string> product_precision_names() {
  return {"f32", "bf16"};
}

void set_product_precision(ProductPrecision precision) {
  current = precision;
}

ProductPrecision product_precision() {
  return current;
}

void check_product_precision(ProductPrecision precision) {
  EXPAR_CHECK(precision == ProductPrecision::F32 || bf16_native(),
              "--precision bf16 needs a CPU with BF16 dot products (AVX512_BF16 or AMX-BF16), which oneDNN "
              "finds missing here: it runs {}{}; use --precision f32 (the default) on this CPU",
              dnnl_isa_name(), std::getenv("DNNL_MAX_CPU_ISA") ? " (capped by DNNL_MAX_CPU_ISA)" : "");
}

bool rounds_activations(ProductPrecision precision, bool weight_is_f32) {
  return precision == ProductPrecision::BF16 && !weight_is_f32;
}

void round_rows_to_bf16_values(const float* x, int64_t ld_x, float* out, int64_t ld_out, int64_t rows,
                               int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = x + r * ld_x;
    float* d = out + r * ld_out;
    for (int64_t c = 0; c < cols; ++c)
      d[c] = widen_bf16(round_to_bf16(s[c]));
  }
}

}  // namespace expar
