#include "expar/moe/expert_mlp.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "expar/core/error.hpp"
#include "expar/core/fast_exp.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/parallel_tasks.hpp"
#include "expar/moe/payload_precision.hpp"

namespace expar {

float gpt_oss_swiglu(float gate, float up) {
  gate = std::min(gate, kGptOssLimit);
  up = std::clamp(up, -kGptOssLimit, kGptOssLimit);
  return gate / (1.0f + std::exp(-kGptOssAlpha * gate)) * (up + 1.0f);
}

GptOssSwigluGrad gpt_oss_swiglu_grad(float gate, float up) {
  const float g = std::min(gate, kGptOssLimit), u = std::clamp(up, -kGptOssLimit, kGptOssLimit);
  const float s = 1.0f / (1.0f + std::exp(-kGptOssAlpha * g));
  // d/dg [g·σ(αg)] = σ + αg·σ(1 − σ); the clamps pass the gradient only inside their range (bounds included).
  const float d_gate = gate <= kGptOssLimit ? (s + kGptOssAlpha * g * s * (1.0f - s)) * (u + 1.0f) : 0.0f;
  const float d_up = up >= -kGptOssLimit && up <= kGptOssLimit ? g * s : 0.0f;
  return {d_gate, d_up};
}

bool ExpertWeights::has_biases() const {
  auto present = [](const Tensor& t) { return t.defined() && t.numel() > 0; };
  return present(b1) || present(b3) || present(b2);
}

ExpertWeights ExpertWeights::experts(int64_t begin, int64_t end) const {
  auto rows = [&](const Tensor& t) { return t.defined() && t.numel() > 0 ? t.rows(begin, end) : Tensor(); };
  ExpertWeights s{rows(w1), rows(w3), rows(w2), rows(b1), rows(b3), rows(b2)};
  s.activation = activation;
  return s;
}

void ExpertWeights::validate() const {
  EXPAR_CHECK(w1.ndim() == 3 && w3.ndim() == 3 && w2.ndim() == 3,
              "expert weights must be 3-d [E_L, h, d] / [E_L, d, h], got w1 {} w3 {} w2 {}",
              shape_string(w1.shape()), shape_string(w3.shape()), shape_string(w2.shape()));
  EXPAR_CHECK(
      w3.shape() == w1.shape() && w2.dim(0) == w1.dim(0) && w2.dim(1) == w1.dim(2) && w2.dim(2) == w1.dim(1),
      "expert weight shapes disagree: w1 {} (gate [E_L,h,d]), w3 {} (up [E_L,h,d]), w2 {} (down [E_L,d,h])",
      shape_string(w1.shape()), shape_string(w3.shape()), shape_string(w2.shape()));
  auto check_bias = [&](const Tensor& b, int64_t cols, const char* what) {
    if (b.defined() && b.numel() > 0)
      EXPAR_CHECK(b.dtype() == DType::F32 && b.ndim() == 2 && b.dim(0) == w1.dim(0) && b.dim(1) == cols,
                  "expert bias {} has shape {}, expected [{}, {}] f32", what, shape_string(b.shape()),
                  w1.dim(0), cols);
  };
  check_bias(b1, w1.dim(1), "b1 (gate)");
  check_bias(b3, w1.dim(1), "b3 (up)");
  check_bias(b2, w1.dim(2), "b2 (down)");
}

namespace {

// The SwiGLU elementwise passes use the vectorisable sigmoid (core/fast_exp.hpp): as scalar libm loops on one
// thread they were 12-14% of a grouped-GEMM step. An expert that runs alone (the only one with rows) spreads
// them over the compute threads; among experts spread over the threads they run on the expert's worker (the
// nested region is inactive). Elementwise only, so the thread count never changes a result.
constexpr int64_t kParallelMin = int64_t{1} << 15;

// m = silu(a) * b.
void swiglu(const float* a, const float* b, float* m, int64_t count) {
#pragma omp parallel for simd schedule(static) if (count > kParallelMin)
  for (int64_t i = 0; i < count; ++i) m[i] = a[i] * fast_sigmoid(a[i]) * b[i];
}

// From grad_m: grad_b = grad_m * silu(a); grad_a = grad_m * b * silu'(a), silu'(a) = s·(1 + a·(1 − s)).
// Element i of gm is read before element i of ga or gb is written, so either may be gm itself.
void swiglu_grad(const float* a, const float* b, const float* gm, float* ga, float* gb, int64_t count) {
#pragma omp parallel for simd schedule(static) if (count > kParallelMin)
  for (int64_t i = 0; i < count; ++i) {
    const float g = gm[i];
    const float s = fast_sigmoid(a[i]);
    gb[i] = g * (a[i] * s);
    ga[i] = g * b[i] * s * (1.0f + a[i] * (1.0f - s));
  }
}

bool has(const Tensor& t) {
  return t.defined() && t.numel() > 0;
}

// m = the experts' activation of the pre-activations a (gate) and b (up).
void activate(ExpertMlpActivation activation, const float* a, const float* b, float* m, int64_t count) {
  if (activation == ExpertMlpActivation::GptOssClamped) {
    for (int64_t i = 0; i < count; ++i) m[i] = gpt_oss_swiglu(a[i], b[i]);
  } else {
    swiglu(a, b, m, count);
  }
}

// The activation's gradient (swiglu_grad's contract: gm may be ga or gb).
void activate_grad(ExpertMlpActivation activation, const float* a, const float* b, const float* gm, float* ga,
                   float* gb, int64_t count) {
  if (activation != ExpertMlpActivation::GptOssClamped) return swiglu_grad(a, b, gm, ga, gb, count);
  for (int64_t i = 0; i < count; ++i) {
    const float g = gm[i];
    const GptOssSwigluGrad d = gpt_oss_swiglu_grad(a[i], b[i]);
    ga[i] = g * d.d_gate;
    gb[i] = g * d.d_up;
  }
}

// acc [cols] += Σ over the n rows of rows [n, cols], row after row.
void add_column_sums(const float* rows, int64_t n, int64_t cols, float* acc) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < cols; ++c) acc[c] += rows[r * cols + c];
}

// rows [n, cols] += bias (one row of it) on every row.
void add_row_bias(float* rows, int64_t n, int64_t cols, const float* bias) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < cols; ++c) rows[r * cols + c] += bias[c];
}

int64_t max_expert_rows(std::span<const int64_t> offsets) {
  int64_t rows = 0;
  for (size_t l = 0; l + 1 < offsets.size(); ++l) rows = std::max(rows, offsets[l + 1] - offsets[l]);
  return rows;
}

// The local experts that have rows, most rows first (ties in expert order): the tasks for_each_task spreads
// over the compute threads, the longest first so that the last ones to finish are short. Each expert's
// products then run on one thread, as at one compute thread, so its results never depend on the thread
// count; with a single expert holding rows there is one task, run on the calling thread with its products
// on all compute threads (on one under batch invariance: core/parallel_tasks.hpp).
std::vector<int64_t> experts_by_rows(std::span<const int64_t> offsets) {
  auto rows = [&](int64_t l) {
    return offsets[static_cast<size_t>(l) + 1] - offsets[static_cast<size_t>(l)];
  };
  std::vector<int64_t> order;
  for (int64_t l = 0; l + 1 < static_cast<int64_t>(offsets.size()); ++l)
    if (rows(l) > 0) order.push_back(l);
  std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return rows(i) > rows(j); });
  return order;
}

void check_rows(const Tensor& t, int64_t rows, int64_t cols, const char* what) {
  EXPAR_CHECK(t.dtype() == DType::F32 && t.ndim() == 2 && t.dim(0) >= rows && t.dim(1) == cols,
              "{} must be f32 [>= {}, {}], got {} {}", what, rows, cols, dtype_name(t.dtype()),
              shape_string(t.shape()));
}

}  // namespace

void expert_mlp_forward(const Tensor& input, PayloadFormat input_format, std::span<const int64_t> offsets,
                        const ExpertWeights& weights, Tensor& out, ExpertMlpState& state) {
  weights.validate();
  const int64_t e_local = weights.local_count(), h = weights.hidden(), d = weights.model();
  EXPAR_CHECK(offsets.size() == static_cast<size_t>(e_local + 1) && offsets[0] == 0,
              "expert offsets must be [E_L + 1] = {} entries starting at 0, got {}", e_local + 1,
              offsets.size());
  for (int64_t l = 0; l < e_local; ++l)
    EXPAR_CHECK(offsets[static_cast<size_t>(l) + 1] >= offsets[static_cast<size_t>(l)],
                "expert offsets decrease at local expert {}", l);
  const int64_t recv = offsets[static_cast<size_t>(e_local)];
  const Tensor decoded = decode_payload(input, input_format, recv, d);
  check_rows(decoded, recv, d, "expert input");
  check_rows(out, recv, d, "expert output");

  state.input = input;
  state.input_format = input_format;
  state.offsets.assign(offsets.begin(), offsets.end());
  state.gate_pre = Tensor::empty({recv, h});
  state.up_pre = Tensor::empty({recv, h});
  // The activation of one expert at a time per worker, reused expert after expert: it is consumed by that
  // expert's down product right away, so it is read back from cache instead of from a [recv, h] buffer.
  const std::vector<int64_t> order = experts_by_rows(offsets);
  const int64_t tasks = static_cast<int64_t>(order.size()), max_rows = max_expert_rows(offsets);
  Tensor act = Tensor::empty({task_threads(tasks), max_rows, h});
  const float* x = decoded.data<float>();
  float* a = state.gate_pre.data<float>();
  float* b = state.up_pre.data<float>();
  float* y = out.data<float>();
  for_each_task(tasks, [&](int64_t task, int thread) {
    const int64_t l = order[static_cast<size_t>(task)];
    const int64_t begin = offsets[static_cast<size_t>(l)], n = offsets[static_cast<size_t>(l) + 1] - begin;
    const float* w1 = weights.w1.data<float>() + l * h * d;
    const float* w3 = weights.w3.data<float>() + l * h * d;
    const float* w2 = weights.w2.data<float>() + l * d * h;
    float* m = act.data<float>() + thread * max_rows * h;
    float* yl = y + begin * d;
    if (h == 0) {  // an empty intermediate shard (inference with expert TP): only the down bias, if held
      std::fill(yl, yl + n * d, 0.0f);
    } else {
      float* al = a + begin * h;
      float* bl = b + begin * h;
      matmul(x + begin * d, w1, al, n, h, d, false, true, false);
      matmul(x + begin * d, w3, bl, n, h, d, false, true, false);
      if (has(weights.b1)) add_row_bias(al, n, h, weights.b1.data<float>() + l * h);
      if (has(weights.b3)) add_row_bias(bl, n, h, weights.b3.data<float>() + l * h);
      activate(weights.activation, al, bl, m, n * h);
      matmul(m, w2, yl, n, d, h, false, true, false);
    }
    if (has(weights.b2)) add_row_bias(yl, n, d, weights.b2.data<float>() + l * d);
  });
}

void expert_mlp_backward(const Tensor& grad_out, const ExpertMlpState& state, const ExpertWeights& weights,
                         Tensor& grad_in, ExpertWeights& grads) {
  weights.validate();
  grads.validate();
  EXPAR_CHECK(grads.w1.shape() == weights.w1.shape(), "expert weight gradients have shape {}, weights {}",
              shape_string(grads.w1.shape()), shape_string(weights.w1.shape()));
  for (auto [w, g, what] :
       {std::tuple{&weights.b1, &grads.b1, "b1"}, std::tuple{&weights.b3, &grads.b3, "b3"},
        std::tuple{&weights.b2, &grads.b2, "b2"}})
    EXPAR_CHECK(has(*w) == has(*g) && (!has(*w) || w->shape() == g->shape()),
                "expert bias {}: the weights {} it but its gradient is {}: give the gradients the biases' "
                "shapes",
                what, has(*w) ? "have" : "do not have", has(*g) ? shape_string(g->shape()) : "absent");
  const int64_t e_local = weights.local_count(), h = weights.hidden(), d = weights.model();
  EXPAR_CHECK(state.offsets.size() == static_cast<size_t>(e_local + 1),
              "expert backward: saved state is for {} local experts, weights for {}",
              static_cast<int64_t>(state.offsets.size()) - 1, e_local);
  const int64_t recv = state.offsets[static_cast<size_t>(e_local)];
  check_rows(grad_out, recv, d, "expert output gradient");
  check_rows(grad_in, recv, d, "expert input gradient");

  // Per worker, two [rows of the largest expert, h] scratch buffers, reused expert after expert so that each
  // expert's activation and its gradients are produced and consumed while in cache: the first holds the
  // recomputed activation m, then grad_a; the second grad_m, then grad_b (swiglu_grad works in place).
  // Each expert writes only its own rows of grad_in and its own slices of the gradients.
  const std::vector<int64_t> order = experts_by_rows(state.offsets);
  const int64_t tasks = static_cast<int64_t>(order.size()), max_rows = max_expert_rows(state.offsets);
  const int workers = task_threads(tasks);
  Tensor scratch_m = Tensor::empty({workers, max_rows, h});
  Tensor scratch_gm = Tensor::empty({workers, max_rows, h});
  // The Wgrad input: the saved payload, decoded again if it was kept encoded.
  const Tensor decoded = decode_payload(state.input, state.input_format, recv, d);
  const float* x = decoded.data<float>();
  const float* a = state.gate_pre.data<float>();
  const float* b = state.up_pre.data<float>();
  const float* gy = grad_out.data<float>();
  float* gx = grad_in.data<float>();
  for_each_task(tasks, [&](int64_t task, int thread) {
    const int64_t l = order[static_cast<size_t>(task)];
    const int64_t begin = state.offsets[static_cast<size_t>(l)];
    const int64_t n = state.offsets[static_cast<size_t>(l) + 1] - begin;
    const float* w1 = weights.w1.data<float>() + l * h * d;
    const float* w3 = weights.w3.data<float>() + l * h * d;
    const float* w2 = weights.w2.data<float>() + l * d * h;
    float* m = scratch_m.data<float>() + thread * max_rows * h;
    float* gm = scratch_gm.data<float>() + thread * max_rows * h;
    if (has(grads.b2)) add_column_sums(gy + begin * d, n, d, grads.b2.data<float>() + l * d);
    if (h == 0) {  // an empty intermediate shard: only the down bias had a gradient
      std::fill(gx + begin * d, gx + (begin + n) * d, 0.0f);
      return;
    }
    // grad_w2 [d,h] += gyᵀ [d,n] · m [n,h];  grad_m [n,h] = gy [n,d] · w2 [d,h].
    activate(weights.activation, a + begin * h, b + begin * h, m, n * h);
    matmul(gy + begin * d, m, grads.w2.data<float>() + l * d * h, d, h, n, true, false, true);
    matmul(gy + begin * d, w2, gm, n, h, d, false, false, false);
    float* ga = m;   // m is no longer needed
    float* gb = gm;  // in place
    activate_grad(weights.activation, a + begin * h, b + begin * h, gm, ga, gb, n * h);
    if (has(grads.b1)) add_column_sums(ga, n, h, grads.b1.data<float>() + l * h);
    if (has(grads.b3)) add_column_sums(gb, n, h, grads.b3.data<float>() + l * h);
    // grad_w1 [h,d] += gaᵀ [h,n] · x [n,d]; same for w3; grad_x [n,d] = ga · w1 + gb · w3.
    matmul(ga, x + begin * d, grads.w1.data<float>() + l * h * d, h, d, n, true, false, true);
    matmul(gb, x + begin * d, grads.w3.data<float>() + l * h * d, h, d, n, true, false, true);
    matmul(ga, w1, gx + begin * d, n, d, h, false, false, false);
    matmul(gb, w3, gx + begin * d, n, d, h, false, false, true);
  });
}

}  // namespace expar
