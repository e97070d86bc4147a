#pragma once
// What matmul() and matmul_bf16() share before they multiply (core/matmul.hpp): the leading dimensions with
// the packed ones (-1) filled in, and the products that multiply nothing (m or n = 0: no-op; k = 0: C is
// cleared unless accumulating), so both entry points keep one set of edge cases.
#include <cstdint>
#include <cstring>

namespace expar {

struct MatmulLeadingDims {
  int64_t lda, ldb, ldc;
};

// p is MatmulArgs or MatmulBf16Args (the same fields).
template <typename Args>
MatmulLeadingDims matmul_leading_dims(const Args& p) {
  return {p.lda >= 0 ? p.lda : (p.trans_a ? p.m : p.k), p.ldb >= 0 ? p.ldb : (p.trans_b ? p.k : p.n),
          p.ldc >= 0 ? p.ldc : p.n};
}

// Whether p multiplies nothing; if so, it is done here (a k = 0 product writes C = 0 unless accumulating).
template <typename Args>
bool matmul_done_without_products(const Args& p, int64_t ldc) {
  if (p.m == 0 || p.n == 0) return true;
  if (p.k != 0) return false;
  if (!p.accumulate)
    for (int64_t i = 0; i < p.m; ++i) std::memset(p.c + i * ldc, 0, sizeof(float) * static_cast<size_t>(p.n));
  return true;
}

}  // namespace expar
