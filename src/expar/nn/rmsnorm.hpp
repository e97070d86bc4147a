#pragma once
// RMSNorm: y = x / sqrt(mean(x²) + eps) ⊙ g, over the last dimension of x [N, d].
#include "expar/core/tensor.hpp"

namespace expar::nn {

struct RmsNormSaved {
  Tensor x;     // input [N, d]; shares storage with the caller's tensor
  Tensor rstd;  // [N]: 1 / sqrt(mean(x²) + eps) per row
};

// x [N, d], gain [d]; eps > 0. Returns y [N, d]. `saved` may be nullptr (inference).
Tensor rmsnorm_forward(const Tensor& x, const Tensor& gain, float eps, RmsNormSaved* saved);

// Returns grad_x [N, d]; accumulates grad_gain [d] += Σ_rows grad_y ⊙ x ⊙ rstd.
Tensor rmsnorm_backward(const RmsNormSaved& saved, const Tensor& grad_y, const Tensor& gain,
                        Tensor& grad_gain);

}  // namespace expar::nn
