#pragma once
// Rotary position embeddings (RoPE) in the GPT-NeoX / LLaMA "rotate half" convention: within each head of
// head_dim = 2h values, element i (i < h) and element i + h form a pair rotated by the angle
// position · inv_freq[i]:
//   x'[i]     = s · (x[i] cos - x[i+h] sin)
//   x'[i + h] = s · (x[i+h] cos + x[i] sin)
// This is the layout Hugging Face LLaMA, Mixtral, Qwen-MoE, OLMoE and gpt-oss checkpoints use, so their q/k
// projection weights load without a permutation. inv_freq and the scale s come from RopeScaling (the rope
// types of Hugging Face's modeling_rope_utils): default inv_freq[i] = theta^(-2i / head_dim), s = 1; linear,
// YaRN and llama3 rescale the frequencies, YaRN also sets s (its attention factor, applied to cos and sin as
// transformers does, so q·k scales by s²). The backward pass rotates by the negative angle with the same s:
// the adjoint of s·R is s·Rᵀ.
//
// RopePairing::Interleaved pairs adjacent elements instead: element 2i and element 2i + 1 rotate by the
// angle position · inv_freq[i]:
//   x'[2i]     = s · (x[2i] cos - x[2i+1] sin)
//   x'[2i + 1] = s · (x[2i+1] cos + x[2i] sin)
// the layout of DeepSeek checkpoints (V2's complex-number form, V3 with rope_interleave): their multi-head
// latent attention (latent_attention.hpp) rotates its rope parts this way. transformers' V3 code
// de-interleaves the pairs and rotates halves, which permutes q and k alike and gives the same scores.
#include <cstdint>
#include <string>
#include <vector>

#include "expar/core/tensor.hpp"

namespace expar::nn {

enum class RopeType : uint8_t { Default, Linear, Yarn, Llama3 };
// Which elements of a head rotate together: (i, i + head_dim/2) or (2i, 2i + 1).
enum class RopePairing : uint8_t { Half, Interleaved };
std::string rope_type_name(RopeType type);  // "default", "linear", "yarn", "llama3"

struct RopeScaling {
  RopeType type = RopeType::Default;
  double theta = 10000.0;
  double factor = 1.0;  // linear, yarn, llama3: > 0
  // yarn and llama3: the context length the model was pretrained with (yarn: defaults to the model's
  // max_position_embeddings when the config has none; the reader fills it in).
  int64_t original_max_position_embeddings = 0;
  // yarn
  double attention_factor = 0.0;  // <= 0: 0.1·ln(factor) + 1 (1 for factor <= 1)
  double beta_fast = 32.0, beta_slow = 1.0;
  bool truncate = true;  // floor/ceil the correction range (gpt-oss: false)
  // llama3
  double low_freq_factor = 1.0, high_freq_factor = 4.0;

  // Throws expar::Error naming the bad field (finite, positive, ordered) and the fix.
  void validate() const;
  // inv_freq[i] for i < head_dim / 2, and the cos/sin scale s.
  std::vector<double> inverse_frequencies(int64_t head_dim) const;
  double cos_sin_scale() const;
};

class Rope {
 public:
  // Precomputes cos/sin for positions [0, max_positions). head_dim must be even, theta > 1.
  Rope(int64_t head_dim, int64_t max_positions, double theta = 10000.0,
       RopePairing pairing = RopePairing::Half);
  Rope(int64_t head_dim, int64_t max_positions, const RopeScaling& scaling,
       RopePairing pairing = RopePairing::Half);

  int64_t head_dim() const { return head_dim_; }
  int64_t max_positions() const { return max_positions_; }
  double theta() const { return scaling_.theta; }
  const RopeScaling& scaling() const { return scaling_; }
  RopePairing pairing() const { return pairing_; }

  // Rotates in place `rows` rows of x, each holding n_heads heads of head_dim values starting at x + r·ld
  // (ld >= n_heads·head_dim); row r is at position positions[r]. inverse = true rotates by the negative
  // angle (the backward pass). Positions outside [0, max_positions) throw.
  void apply(float* x, int64_t rows, int64_t n_heads, int64_t ld, const int32_t* positions,
             bool inverse) const;

  // Tensor forms: x [N, n_heads·head_dim] f32, positions int32 [N].
  void forward(Tensor& x, int64_t n_heads, const Tensor& positions) const;
  void backward(Tensor& grad_x, int64_t n_heads, const Tensor& positions) const;

 private:
  int64_t head_dim_;
  int64_t max_positions_;
  RopeScaling scaling_;
  RopePairing pairing_;
  std::vector<float> cos_;  // [max_positions, head_dim / 2], times the scale s
  std::vector<float> sin_;
};

}  // namespace expar::nn
