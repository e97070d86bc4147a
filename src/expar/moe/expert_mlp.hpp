#pragma once
// The routed experts of one rank: a SwiGLU MLP per local expert in Hugging Face Mixtral orientation,
//   y = w2 · (silu(w1·x) ⊙ (w3·x)),  w1 (gate) [h, d], w3 (up) [h, d], w2 (down) [d, h],
// stored for E_L local experts as [E_L, h, d], [E_L, h, d], [E_L, d, h]; or gpt-oss's experts, with gate/up
// biases before the activation, a down bias after the down product, and the clamped SwiGLU, forward and
// backward (the biases' gradients included). The inference engine's experts and shared expert run here too.
// Computed as grouped GEMMs over the expert-contiguous row intervals of the expert-side buffer (contract 3):
// one oneDNN matmul per expert interval and product, with that expert's SwiGLU (and, backward, its gradient)
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
// The column form. An expert with kExpertColumnFormMinRows rows or more computes its forward transposed, aᵀ =
// w1·xᵀ, bᵀ = w3·xᵀ, yᵀ = w2·mᵀ: the weights as stored are the products' left operands (weights held in a
// narrow format dequantised tile by tile: core/weight_matmul.hpp's matmul_weight_columns) and its rows are
// their columns (x and y are transposed in and out while in cache, and the pre-activations back into rows
// when a state is kept for the backward, with non-temporal stores: core/transpose.hpp's transpose_streaming);
// from 64 rows on, the column count is rounded up to a multiple of 16 with zero columns (sgemm ran a ragged
// count below a whole one's rate: expert_mlp.cpp's padded_columns). oneDNN's sgemm packs each weight matrix
// per call, and in the row form x·w1ᵀ that packing is a large share of a product with few rows, which the
// column form avoids: the fewer rows an expert holds, the more it gains, transposes included
// (docs/performance_history.md, "The column form"). A column's bits do not depend on how
// many columns share the call (measured on AVX-512 for 2..600 columns, at 1 and 2 threads), so results stay
// independent of the path and the wave schedule, whose experts hold the same rows either way. Below the
// threshold (decode's one row: the one-row form above) and under batch invariance (its row quantum is a rule
// of the row form, and under AVX2 a column's bits do depend on the column count: matmul.hpp) an expert runs
// in the row form, x·w1ᵀ etc. The backward runs in the row form for every expert, its [rows, h] gradients and
// the saved pre-activations at a padded row stride. (Keeping the pre-activations transposed for it made it
// slower by more than the forward gained, both with the backward transposing them back, which reads cold
// rows, and with the backward wholly in the column form, whose gmᵀ = w2ᵀ·gyᵀ runs well below gy·w2:
// docs/performance_history.md, "Where a 128-row expert's forward goes".)
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "expar/core/tensor.hpp"
#include "expar/core/weight_view.hpp"
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

// gpt-oss's experts as the Hub stores them (MXFP4, io/mxfp4.hpp's layout), for the local experts: gate_up
// blocks U8 [E_L, 2I, H/32, 16] and scales [E_L, 2I, H/32] (its rows interleave gate (even) and up (odd)),
// down blocks [E_L, H, I/32, 16] and scales [E_L, H, I/32]; this rank computes intermediate rows [i0, i1),
// whole 32-value blocks of down's inputs (i0 and i1 multiples of 32, or i1 = I).
struct Mxfp4Experts {
  Tensor gate_up_blocks, gate_up_scales, down_blocks, down_scales;
  int64_t i0 = 0, i1 = 0;
};

enum class ExpertMatrix : uint8_t { Gate, Up, Down };

// The weights are F32, or (inference) BF16 or F16 held as the checkpoint stores them, or MXFP4 (`mxfp4` set,
// w1/w3/w2 undefined): the forward multiplies them as stored (core/weight_matmul.hpp), in the row form unless
// they are F32; the backward needs F32.
struct ExpertWeights {
  Tensor w1;  // [E_L, h, d]
  Tensor w3;  // [E_L, h, d]
  Tensor w2;  // [E_L, d, h]
  // Optional (gpt-oss; undefined or empty: none): gate and up biases [E_L, h] added before the activation,
  // the down bias [E_L, d] after the down product.
  Tensor b1{}, b3{}, b2{};
  ExpertMlpActivation activation = ExpertMlpActivation::Swiglu;
  std::shared_ptr<const Mxfp4Experts> mxfp4{};
  // Mixed precision (issue #35): BF16 copies of the f32 masters w1, w3, w2 (the same shapes, DType::BF16),
  // made and refreshed by refresh_bf16_copies (a trainer: once per step, after the optimizer). When held,
  // every product of the forward and backward is a BF16 product with f32 accumulation (core/matmul.hpp's
  // matmul_bf16): the weights are these copies, and each activation is rounded to BF16 where it enters a
  // product (the input rows and the SwiGLU output forward; the output gradient, the pre-activation gradients
  // and the input rows for the backward). The gate and up products' results (biases added) are rounded to
  // BF16 as they leave them, as autocast's BF16 products return BF16: the activation is computed from those
  // roundings, and they are what the state saves and the backward differentiates at. Everything else stays
  // f32: the activation's and its gradient's arithmetic, the biases, the outputs, the input gradient, and the
  // weight gradients (produced and accumulated in f32 into the f32 gradients, as without copies). Every
  // expert then runs in the row form (the column form is an f32 sgemm layout) and the one-row decode form is
  // not used.
  Tensor w1_bf16{}, w3_bf16{}, w2_bf16{};
  bool bf16_products() const { return w1_bf16.defined() && w1_bf16.ndim() == 3; }
  int64_t local_count() const { return mxfp4 ? mxfp4->gate_up_blocks.dim(0) : w1.dim(0); }
  int64_t hidden() const { return mxfp4 ? mxfp4->i1 - mxfp4->i0 : w1.dim(1); }
  int64_t model() const { return mxfp4 ? mxfp4->down_blocks.dim(1) : w1.dim(2); }
  // Whether the matrices are held as f32 (the column form and the backward need it).
  bool f32() const { return !mxfp4 && w1.dtype() == DType::F32; }
  // Local expert l's gate [h, d], up [h, d] or down [d, h] matrix, as stored.
  WeightView matrix(ExpertMatrix which, int64_t l) const;
  // The bytes the matrices and biases are held in.
  int64_t bytes() const;
  bool has_biases() const;
  // Local experts [begin, end): views of every tensor (the biases included), the same activation.
  ExpertWeights experts(int64_t begin, int64_t end) const;
  // Throws unless the three shapes (or the MXFP4 blocks and scales) and the biases agree.
  void validate() const;

 private:
  void validate_matrices() const;
};

// Makes (the first time) or refreshes w's BF16 copies from its f32 matrices, each value rounded to the
// nearest BF16 (ties to even); the copies are charged to `category` (a shared expert's or a dense MLP's:
// DenseWeights). Refreshed in place when they are already held, so views of them (ExpertWeights::experts)
// see the new values. Needs f32 weights.
void refresh_bf16_copies(ExpertWeights& w, MemCategory category = MemCategory::ExpertWeights);

// The fewest rows an expert computes in the column form with (above).
inline constexpr int64_t kExpertColumnFormMinRows = 8;

// The row stride (elements) of ExpertMlpState's pre-activations for experts of hidden width h: h plus one
// cache line (what a plan of the saved activations counts, train/plan_activations.hpp). A state saves 2 such
// rows per expert-side row: 4 bytes an element, 2 under BF16 products.
int64_t padded_stride(int64_t h);

struct ExpertMlpState {
  // Expert-side input rows, saved by reference (the dispatch buffer in EP) in the format they arrived in:
  // an encoded payload (u8 rows) is kept encoded and decoded again for Wgrad (moe/payload_precision.hpp).
  Tensor input;
  PayloadFormat input_format = PayloadFormat::F32;
  // w1·x and w3·x (biases added), [recv_rows, h] in rows of a padded stride: columns [h, dim(1)) are never
  // written (the backward's products read 4 KiB-strided rows slowly; expert_mlp.cpp's padded_stride). F32,
  // or BF16 under BF16 products (ExpertWeights: their rounding, which the forward's activation read).
  Tensor gate_pre;
  Tensor up_pre;
  std::vector<int64_t> offsets;  // [E_L + 1]
};

// input [>= offsets[E_L], d] f32, or encoded rows in input_format (payload_tensor's layout), decoded to f32
// for the products (BF16 products: to the BF16 rows they read, a BF16 payload read as it is); writes rows [0,
// offsets[E_L]) of `out` (same row count as needed, any capacity). `state` receives what expert_mlp_backward
// needs; nullptr (inference) keeps nothing, so the column form skips transposing the pre-activations back
// into rows.
void expert_mlp_forward(const Tensor& input, PayloadFormat input_format, std::span<const int64_t> offsets,
                        const ExpertWeights& weights, Tensor& out, ExpertMlpState* state);

// grad_out [>= recv, d]; writes rows [0, recv) of grad_in and ADDS the weight gradients into `grads`
// (tensors shaped like the weights, initialised by the caller; with biased experts, bias gradients too:
// b1/b3 += column sums of the gate/up pre-activation gradients, b2 += column sums of grad_out, each over the
// expert's rows in row order, so a result never depends on the path or the wave schedule).
//
// `update` says what the weight gradients (w1, w3, w2; the biases' are always added) hold when it is called:
// - GradientUpdate::Add (the default): anything; this backward's gradients are added to them.
// - GradientUpdate::IntoZeros: zero, every element (MoeLayer's after zero_grads, before its first backward
//   of the step). The products then write their gradients instead of adding them: the same values, since
//   0 + g = g (the sign of an exact zero aside), without reading 3 weight-sized matrices back from memory per
//   expert, which made the backward measurably faster with the same bits (docs/performance_history.md,
//   "Weight gradients written, not added").
enum class GradientUpdate : uint8_t { Add, IntoZeros };
void expert_mlp_backward(const Tensor& grad_out, const ExpertMlpState& state, const ExpertWeights& weights,
                         Tensor& grad_in, ExpertWeights& grads, GradientUpdate update = GradientUpdate::Add);

}  // namespace expar
