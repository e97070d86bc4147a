#include "expar/nn/rope.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "expar/core/assert.hpp"
#include "expar/nn/check.hpp"

namespace expar::nn {

std::string rope_type_name(RopeType type) {
  switch (type) {
    case RopeType::Default:
      return "default";
    case RopeType::Linear:
      return "linear";
    case RopeType::Yarn:
      return "yarn";
    case RopeType::Llama3:
      return "llama3";
  }
  return "?";
}

void RopeScaling::validate() const {
  const std::string t = rope_type_name(type);
  EXPAR_CHECK(std::isfinite(theta) && theta > 1.0,
              "Rope: theta={} must be finite and above 1: the usual is 10000", theta);
  if (type == RopeType::Default) return;
  EXPAR_CHECK(std::isfinite(factor) && factor > 0.0, "Rope ({}): factor={} must be finite and positive", t,
              factor);
  if (type == RopeType::Linear) return;
  EXPAR_CHECK(
      original_max_position_embeddings > 0,
      "Rope ({}): original_max_position_embeddings={} must be positive: the pretraining context length", t,
      original_max_position_embeddings);
  if (type == RopeType::Yarn) {
    EXPAR_CHECK(std::isfinite(attention_factor) && attention_factor >= 0.0,
                "Rope (yarn): attention_factor={} must be finite and not negative (0: the default)",
                attention_factor);
    EXPAR_CHECK(
        std::isfinite(beta_fast) && std::isfinite(beta_slow) && beta_slow > 0.0 && beta_fast > beta_slow,
        "Rope (yarn): beta_fast={} and beta_slow={} must be finite with beta_fast > beta_slow > 0 (the "
        "usual: 32 and 1)",
        beta_fast, beta_slow);
    return;
  }
  EXPAR_CHECK(
      std::isfinite(low_freq_factor) && std::isfinite(high_freq_factor) && low_freq_factor > 0.0 &&
          high_freq_factor > low_freq_factor,
      "Rope (llama3): low_freq_factor={} and high_freq_factor={} must be finite with high > low > 0 (the "
      "usual: 1 and 4)",
      low_freq_factor, high_freq_factor);
}

std::vector<double> RopeScaling::inverse_frequencies(int64_t head_dim) const {
  validate();
  const int64_t half = head_dim / 2;
  const auto dim = static_cast<double>(head_dim);
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv[static_cast<size_t>(i)] = std::pow(theta, -2.0 * static_cast<double>(i) / dim);
  switch (type) {
    case RopeType::Default:
      break;
    case RopeType::Linear:
      for (double& f : inv) f /= factor;
      break;
    case RopeType::Yarn: {
      // YaRN (arXiv 2309.00071) as transformers computes it: dimensions rotating fewer than beta_slow times
      // over the original context are interpolated (divided by factor), those rotating more than beta_fast
      // times are kept, with a linear ramp between.
      const auto orig = static_cast<double>(original_max_position_embeddings);
      auto correction_dim = [&](double rotations) {
        return dim * std::log(orig / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
      };
      double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
      if (truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, dim - 1.0);
      if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
      for (int64_t i = 0; i < half; ++i) {
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double keep = 1.0 - ramp;  // the extrapolation share
        double& f = inv[static_cast<size_t>(i)];
        f = f / factor * (1.0 - keep) + f * keep;
      }
      break;
    }
    case RopeType::Llama3: {
      const auto old = static_cast<double>(original_max_position_embeddings);
      const double low_wavelen = old / low_freq_factor, high_wavelen = old / high_freq_factor;
      for (double& f : inv) {
        const double wavelen = 2.0 * std::numbers::pi / f;
        if (wavelen > low_wavelen) {
          f /= factor;  // low frequencies: interpolated
        } else if (wavelen >= high_wavelen) {
          const double smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
          f = (1.0 - smooth) * f / factor + smooth * f;
        }  // high frequencies: kept
      }
      break;
    }
  }
  return inv;
}

double RopeScaling::cos_sin_scale() const {
  if (type != RopeType::Yarn) return 1.0;
  if (attention_factor > 0.0) return attention_factor;
  return factor <= 1.0 ? 1.0 : 0.1 * std::log(factor) + 1.0;
}

namespace {

RopeScaling plain(double theta) {
  RopeScaling s;
  s.theta = theta;
  return s;
}

}  // namespace

Rope::Rope(int64_t head_dim, int64_t max_positions, double theta, RopePairing pairing)
    : Rope(head_dim, max_positions, plain(theta), pairing) {}

Rope::Rope(int64_t head_dim, int64_t max_positions, const RopeScaling& scaling, RopePairing pairing)
    : head_dim_(head_dim), max_positions_(max_positions), scaling_(scaling), pairing_(pairing) {
  EXPAR_CHECK(pairing == RopePairing::Half || pairing == RopePairing::Interleaved,
              "Rope: pairing={} is neither Half nor Interleaved", static_cast<int>(pairing));
  EXPAR_CHECK(head_dim > 0 && head_dim % 2 == 0,
              "Rope: head_dim={} must be positive and even (values rotate in pairs): choose an even head_dim",
              head_dim);
  EXPAR_CHECK(max_positions > 0, "Rope: max_positions={} must be positive: pass the longest sequence length",
              max_positions);
  const std::vector<double> inv_freq = scaling.inverse_frequencies(head_dim);
  const double scale = scaling.cos_sin_scale();
  const int64_t half = head_dim / 2;
  cos_.resize(static_cast<size_t>(max_positions * half));
  sin_.resize(cos_.size());
  for (int64_t i = 0; i < half; ++i) {
    for (int64_t p = 0; p < max_positions; ++p) {
      // The angle in double: at position 10^4 an f32 product would already be off by ~1e-3 rad.
      const double angle = static_cast<double>(p) * inv_freq[static_cast<size_t>(i)];
      cos_[static_cast<size_t>(p * half + i)] = static_cast<float>(scale * std::cos(angle));
      sin_[static_cast<size_t>(p * half + i)] = static_cast<float>(scale * std::sin(angle));
    }
  }
}
void Rope::apply(float* x, int64_t rows, int64_t n_heads, int64_t ld, const int32_t* positions,
                 bool inverse) const {
  EXPAR_ASSERT(n_heads >= 0 && ld >= n_heads * head_dim_,
               "Rope::apply: n_heads={} with head_dim={} needs a row stride of at least {}, got ld={}",
               n_heads, head_dim_, n_heads * head_dim_, ld);
  const int64_t half = head_dim_ / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t pos = positions[r];
    EXPAR_CHECK(pos >= 0 && pos < max_positions_,
                "Rope: position {} of row {} is outside [0, {}): build the Rope with a larger max_positions",
                pos, r, max_positions_);
    const float* c = cos_.data() + static_cast<int64_t>(pos) * half;
    const float* s = sin_.data() + static_cast<int64_t>(pos) * half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + r * ld + h * head_dim_;
      // Two loops rather than one with a runtime pair stride: the halves' loop stays unit-stride.
      if (pairing_ == RopePairing::Half) {
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half], sn = sign * s[i];
          v[i] = a * c[i] - b * sn;
          v[i + half] = b * c[i] + a * sn;
        }
      } else {
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[2 * i], b = v[2 * i + 1], sn = sign * s[i];
          v[2 * i] = a * c[i] - b * sn;
          v[2 * i + 1] = b * c[i] + a * sn;
        }
      }
    }
  }
}

void Rope::forward(Tensor& x, int64_t n_heads, const Tensor& positions) const {
  const int64_t n = x.ndim() >= 1 ? x.dim(0) : 0;
  check_f32(x, "Rope::forward", "x", {n, n_heads * head_dim_});
  check_i32(positions, "Rope::forward", "positions", n);
  apply(x.data<float>(), n, n_heads, n_heads * head_dim_, positions.data<int32_t>(), false);
}

void Rope::backward(Tensor& grad_x, int64_t n_heads, const Tensor& positions) const {
  const int64_t n = grad_x.ndim() >= 1 ? grad_x.dim(0) : 0;
  check_f32(grad_x, "Rope::backward", "grad_x", {n, n_heads * head_dim_});
  check_i32(positions, "Rope::backward", "positions", n);
  apply(grad_x.data<float>(), n, n_heads, n_heads * head_dim_, positions.data<int32_t>(), true);
}

}  // namespace expar::nn
