#pragma once
// The operands of the inference engine's weight products (`--precision` of generate, eval, serve and bench
// generate; docs/inference.md, "BF16 products").
//  - F32 (the default): each product is the f32 sum of the f32 activations times the stored weights' exact
//    values (core/weight_view.hpp).
//  - BF16: where a weight is held narrow (BF16, F16, MXFP4, FP8) the activations entering its product are
//    rounded to BF16 (nearest, ties to even, as core/bf16_round.hpp), the weights' values stay exact and the
//    sums accumulate in f32; a BF16 weight then multiplies on the CPU's BF16 dot products (core/matvec for
//    one row, oneDNN's BF16 matmul for several), which is what llama.cpp and vLLM run. F32 weights keep
//    f32 products: rounding their activations alone would change results without saving a read or an
//    instruction (`--weight-dtype bf16` makes them BF16 first).
// Per thread, like the batch-invariance quantum (core/matmul.hpp): each rank sets its own, the engine for the
// length of each step (ScopedProductPrecision), so nothing else a thread runs (training) sees it.
#include <cstdint>
#include <string>
#include <vector>

namespace expar {

enum class ProductPrecision : uint8_t { F32, BF16 };

// "f32" | "bf16".
std::string product_precision_name(ProductPrecision precision);
// Inverse of product_precision_name; throws expar::Error naming the value and the accepted names.
ProductPrecision product_precision_from_name(const std::string& name);
std::vector<std::string> product_precision_names();

void set_product_precision(ProductPrecision precision);
ProductPrecision product_precision();

// Sets the calling thread's precision for its lifetime and restores the one before.
class ScopedProductPrecision {
 public:
  explicit ScopedProductPrecision(ProductPrecision precision) : before_(product_precision()) {
    set_product_precision(precision);
  }
  ~ScopedProductPrecision() { set_product_precision(before_); }
  ScopedProductPrecision(const ScopedProductPrecision&) = delete;
  ScopedProductPrecision& operator=(const ScopedProductPrecision&) = delete;

 private:
  ProductPrecision before_;
};

// Throws expar::Error for BF16 on a CPU without BF16 dot products (core/matmul.hpp's bf16_native), naming the
// instruction set found and the fix (--precision f32): never run there another, slower way.
void check_product_precision(ProductPrecision precision);

// Where a product over weights of this format rounds its activations under `precision`.
bool rounds_activations(ProductPrecision precision, bool weight_is_f32);

// out[r·ld_out + c] = the BF16 value of x[r·ld_x + c], as f32 (exact), for r < rows, c < cols: the
// activations of a BF16-precision product that multiplies them by f32 (widened or dequantised) weights.
void round_rows_to_bf16_values(const float* x, int64_t ld_x, float* out, int64_t ld_out, int64_t rows,
                               int64_t cols);

}  // namespace expar
