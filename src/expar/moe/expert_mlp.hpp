#pragma once
// The routed experts of one rank: a SwiGLU MLP per local expert in Hugging Face Mixtral orientation,
//   y = w2 · (silu(w1·x) ⊙ (w3·x)),  w1 (gate) [h, d], w3 (up) [h, d], w2 (down) [d, h],
// stored for E_L local experts as [E_L, h, d], [E_L, h, d], [E_L, d, h]; or gpt-oss's experts, with gate/up
// biases before the activation, a down bias after the down product, and the clamped SwiGLU, forward and
// backward (the biases' gradients included). The inference engine's experts and shared expert run here too.
// Computed as grouped GEMMs over the expert-contiguous row intervals of the expert-side buffer (contract 3):
// one product per expert interval and weight matrix, with that expert's SwiGLU (and, backward, its gradient)
// between its products so that the [rows, h] intermediates are consumed while in cache. With several compute
// threads and several experts holding rows, the experts are spread over the threads (core/parallel_tasks.hpp,
// most rows first), each expert's products on one thread with its own scratch: small experts' products
// split over all threads ran well below one big product's rate, and the results are those of one compute
// thread. Decode is the exception: when every expert holding rows holds one (and matmul() would send its
// m = 1 products to core/matvec), the forward runs every gate and up product as one matvec region and every
// down product as a second, so a thread that finishes its expert takes rows of another's instead of waiting
// (the same bits: matvec's do not depend on how products are grouped). Rows at and past offsets[E_L] (the
// capacity tail) are never read or written.
//
// Experts of kExpertWeightProductMinRows rows or more run their three forward products through
// core/weight_product (x·w1ᵀ, x·w3ᵀ, m·w2ᵀ with the weights as stored), which fetches each weight matrix while it
// multiplies where oneDNN's sgemm reads it first: the forward's products and saved pre-activations then need no
// transposes either (docs/performance.md, "Small experts: weights fetched while multiplying"). Every element is
// one chain of fused multiply-adds over k in order, so a row's result does not depend on how many rows its
// expert holds: results stay independent of the path and the wave schedule, and of the instruction set
// (AVX-512 and AVX2 give the same bits). Below the threshold (decode's one row: the one-row form above) and
// under batch invariance (its row quantum is a rule of matmul(): core/matmul.hpp) an expert's products run
// through matmul(). The backward runs through matmul() for every expert, its [rows, h] gradients and the saved
// pre-activations at a padded row stride.
#include <cstdint>
#include <span>
#include <vector>

#include "expar/core/tensor.hpp"
#include "expar/moe/payload_codec.hpp"

namespace expar {

enum class ExpertMlpActivation : uint8_t {
  Swiglu,        // silu(gate)·up
  GptOssClamped  // gpt_oss_swiglu
};

inline constexpr float kGptOssAlpha = 1.702f, kGptOssLimit = 7.0f;
// gpt-oss's activation (transformers' GptOssExperts): gate clamped to <= 7, up to [-7, 7];
// gate·sigmoid(1.702·gate)·(up + 1).
float gpt_oss_swiglu(float gate, float up);
// Its partial derivatives at (gate, up): zero where a clamp is active (gate > 7, |up| > 7), as torch's clamp.
struct GptOssSwigluGrad {
  float d_gate, d_up;
};
GptOssSwigluGrad gpt_oss_swiglu_grad(float gate, float up);

struct ExpertWeights {
  Tensor w1;  // [E_L, h, d]
  Tensor w3;  // [E_L, h, d]
  Tensor w2;  // [E_L, d, h]
  // Optional (gpt-oss; undefined or empty: none): gate and up biases [E_L, h] added before the activation,
  // the down bias [E_L, d] after the down product.
  Tensor b1{}, b3{}, b2{};
  ExpertMlpActivation activation = ExpertMlpActivation::Swiglu;
  int64_t local_count() const { return w1.dim(0); }
  int64_t hidden() const { return w1.dim(1); }
  int64_t model() const { return w1.dim(2); }
  bool has_biases() const;
  // Local experts [begin, end): views of every tensor (the biases included), the same activation.
  ExpertWeights experts(int64_t begin, int64_t end) const;
  // Throws unless the three shapes agree.
  void validate() const;
};

// The fewest rows an expert computes with core/weight_product (above): below it packing each panel of weights
// costs more than the few rows' arithmetic gains (at 8 rows the products ran at 0.23-0.29 of a 2048-row
// product's rate, either kernel).
inline constexpr int64_t kExpertWeightProductMinRows = 8;

struct ExpertMlpState {
  // Expert-side input rows, saved by reference (the dispatch buffer in EP) in the format they arrived in:
  // an encoded payload (u8 rows) is kept encoded and decoded again for Wgrad (moe/payload_precision.hpp).
  Tensor input;
  PayloadFormat input_format = PayloadFormat::F32;
  // w1·x and w3·x (biases added), [recv_rows, h] in rows of a padded stride: columns [h, dim(1)) are never
  // written (the backward's products read 4 KiB-strided rows slowly; expert_mlp.cpp's padded_stride).
  Tensor gate_pre;
  Tensor up_pre;
  std::vector<int64_t> offsets;  // [E_L + 1]
};

// input [>= offsets[E_L], d] f32, or encoded rows in input_format (payload_tensor's layout), decoded to f32
// for the products; writes rows [0, offsets[E_L]) of `out` (same row count as needed, any capacity). `state`
// receives what expert_mlp_backward needs; nullptr (inference) keeps nothing.
void expert_mlp_forward(const Tensor& input, PayloadFormat input_format, std::span<const int64_t> offsets,
                        const ExpertWeights& weights, Tensor& out, ExpertMlpState* state);

// grad_out [>= recv, d]; writes rows [0, recv) of grad_in and ADDS the weight gradients into `grads`
// (tensors shaped like the weights, initialised by the caller; with biased experts, bias gradients too:
// b1/b3 += column sums of the gate/up pre-activation gradients, b2 += column sums of grad_out, each over the
// expert's rows in row order, so a result never depends on the path or the wave schedule).
void expert_mlp_backward(const Tensor& grad_out, const ExpertMlpState& state, const ExpertWeights& weights,
                         Tensor& grad_in, ExpertWeights& grads);

}  // namespace expar
