#include "expar/moe/expert_mlp.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "expar/core/bf16_round.hpp"
#include "expar/core/error.hpp"
#include "expar/core/fast_exp.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/matvec.hpp"
#include "expar/core/parallel_tasks.hpp"
#include "expar/core/tensor_convert.hpp"
#include "expar/core/transpose.hpp"
#include "expar/core/weight_matmul.hpp"
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
  if (bf16_products()) {
    s.w1_bf16 = w1_bf16.rows(begin, end);
    s.w3_bf16 = w3_bf16.rows(begin, end);
    s.w2_bf16 = w2_bf16.rows(begin, end);
  }
  if (mxfp4)
    s.mxfp4 = std::make_shared<const Mxfp4Experts>(
        Mxfp4Experts{rows(mxfp4->gate_up_blocks), rows(mxfp4->gate_up_scales), rows(mxfp4->down_blocks),
                     rows(mxfp4->down_scales), mxfp4->i0, mxfp4->i1});
  return s;
}

WeightView ExpertWeights::matrix(ExpertMatrix which, int64_t l) const {
  if (!mxfp4) {
    const Tensor& stack = which == ExpertMatrix::Gate ? w1 : which == ExpertMatrix::Up ? w3 : w2;
    const int64_t a = stack.dim(1);
    return weight_view(stack.reshape({stack.dim(0) * a, stack.dim(2)})).row_range(l * a, (l + 1) * a);
  }
  const Mxfp4Experts& m = *mxfp4;
  const int64_t d = model(), inter = m.down_blocks.dim(2) * kMxfp4Block;
  auto blocks = [](const Tensor& t) { return static_cast<const uint8_t*>(t.raw()); };
  if (which == ExpertMatrix::Down) {
    // [d, I] of expert l, its columns [i0, i1).
    const WeightView whole = WeightView::mxfp4(blocks(m.down_blocks) + l * d * inter / 2,
                                               blocks(m.down_scales) + l * d * (inter / kMxfp4Block), d,
                                               inter, inter, inter / kMxfp4Block);
    return whole.col_range(m.i0, m.i1);
  }
  // Gate rows 2i, up rows 2i + 1 of gate_up [2I, d]: every other row from the first of the shard.
  const int64_t row = 2 * (l * inter + m.i0) + (which == ExpertMatrix::Up ? 1 : 0);
  return WeightView::mxfp4(blocks(m.gate_up_blocks) + row * d / 2,
                           blocks(m.gate_up_scales) + row * (d / kMxfp4Block), m.i1 - m.i0, d, 2 * d,
                           2 * (d / kMxfp4Block));
}

int64_t ExpertWeights::bytes() const {
  int64_t total = 0;
  for (const Tensor* t : {&w1, &w3, &w2, &b1, &b3, &b2}) total += weight_bytes(*t);
  if (bf16_products())
    for (const Tensor* t : {&w1_bf16, &w3_bf16, &w2_bf16}) total += weight_bytes(*t);
  if (mxfp4)
    for (const Tensor* t :
         {&mxfp4->gate_up_blocks, &mxfp4->gate_up_scales, &mxfp4->down_blocks, &mxfp4->down_scales})
      total += static_cast<int64_t>(t->nbytes());
  return total;
}

void ExpertWeights::validate() const {
  if (mxfp4) {
    const Mxfp4Experts& m = *mxfp4;
    const Shape& gu = m.gate_up_blocks.shape();
    const Shape& dn = m.down_blocks.shape();
    EXPAR_CHECK(
        gu.size() == 4 && dn.size() == 4 && gu[3] == 16 && dn[3] == 16 && dn[0] == gu[0] &&
            gu[1] == 2 * dn[2] * kMxfp4Block && dn[1] == gu[2] * kMxfp4Block &&
            m.gate_up_scales.shape() == Shape({gu[0], gu[1], gu[2]}) &&
            m.down_scales.shape() == Shape({dn[0], dn[1], dn[2]}),
        "mxfp4 experts: gate_up blocks {} scales {}, down blocks {} scales {} do not describe [E, 2I, H/32, "
        "16] and [E, H, I/32, 16]",
        shape_string(gu), shape_string(m.gate_up_scales.shape()), shape_string(dn),
        shape_string(m.down_scales.shape()));
    const int64_t inter = dn[2] * kMxfp4Block;
    EXPAR_CHECK(0 <= m.i0 && m.i0 <= m.i1 && m.i1 <= inter && m.i0 % kMxfp4Block == 0 &&
                    (m.i1 % kMxfp4Block == 0 || m.i1 == inter),
                "mxfp4 experts: intermediate shard [{}, {}) of {}: it must cover whole blocks of {}", m.i0,
                m.i1, inter, kMxfp4Block);
  } else {
    validate_matrices();
  }
  if (bf16_products())
    EXPAR_CHECK(w1.dtype() == DType::F32 && w1_bf16.dtype() == DType::BF16 &&
                    w3_bf16.dtype() == DType::BF16 && w2_bf16.dtype() == DType::BF16 &&
                    w1_bf16.shape() == w1.shape() && w3_bf16.shape() == w3.shape() &&
                    w2_bf16.shape() == w2.shape(),
                "expert BF16 copies must be BF16 copies of f32 masters of the same shapes: masters w1 {} {}, "
                "copies w1 {} {}, w3 {} {}, w2 {} {} (make them with refresh_bf16_copies)",
                dtype_name(w1.dtype()), shape_string(w1.shape()), dtype_name(w1_bf16.dtype()),
                shape_string(w1_bf16.shape()), dtype_name(w3_bf16.dtype()), shape_string(w3_bf16.shape()),
                dtype_name(w2_bf16.dtype()), shape_string(w2_bf16.shape()));
  auto check_bias = [&](const Tensor& b, int64_t cols, const char* what) {
    if (b.defined() && b.numel() > 0)
      EXPAR_CHECK(b.dtype() == DType::F32 && b.ndim() == 2 && b.dim(0) == local_count() && b.dim(1) == cols,
                  "expert bias {} has shape {}, expected [{}, {}] f32", what, shape_string(b.shape()),
                  local_count(), cols);
  };
  check_bias(b1, hidden(), "b1 (gate)");
  check_bias(b3, hidden(), "b3 (up)");
  check_bias(b2, model(), "b2 (down)");
}

void ExpertWeights::validate_matrices() const {
  EXPAR_CHECK(
      held_as_stored(w1) && held_as_stored(w3) && held_as_stored(w2) && w3.dtype() == w1.dtype() &&
          w2.dtype() == w1.dtype(),
      "expert weights must be F32, BF16, F16 or block-scaled FP8, all three alike, got w1 {} w3 {} w2 {}",
      dtype_name(w1.dtype()), dtype_name(w3.dtype()), dtype_name(w2.dtype()));
  EXPAR_CHECK(w1.ndim() == 3 && w3.ndim() == 3 && w2.ndim() == 3,
              "expert weights must be 3-d [E_L, h, d] / [E_L, d, h], got w1 {} w3 {} w2 {}",
              shape_string(w1.shape()), shape_string(w3.shape()), shape_string(w2.shape()));
  EXPAR_CHECK(
      w3.shape() == w1.shape() && w2.dim(0) == w1.dim(0) && w2.dim(1) == w1.dim(2) && w2.dim(2) == w1.dim(1),
      "expert weight shapes disagree: w1 {} (gate [E_L,h,d]), w3 {} (up [E_L,h,d]), w2 {} (down [E_L,d,h])",
      shape_string(w1.shape()), shape_string(w3.shape()), shape_string(w2.shape()));
}

namespace {

// The SwiGLU elementwise passes use the vectorisable sigmoid (core/fast_exp.hpp): as scalar libm loops on one
// thread they were a visible share of a grouped-GEMM step. An expert that runs alone (the only one with rows)
// spreads them over the compute threads; among experts spread over the threads they run on the expert's
// worker (the nested region is inactive). Elementwise only, so the thread count never changes a result. Every
// pass works on `rows` rows of `cols` values, each operand with its own row stride (the backward's scratch is
// padded).
constexpr int64_t kParallelMin = int64_t{1} << 15;

// A row-major operand of an elementwise pass: row r starts at p + r * ld.
template <typename T>
struct Rows {
  T* p;
  int64_t ld;
  T* row(int64_t r) const { return p + r * ld; }
};
using In = Rows<const float>;
using Out = Rows<float>;
// BF16 rows (core/bf16_round.hpp): the pre-activations saved under BF16 products, which the activation and
// its gradient read, and the outputs the elementwise passes write straight in BF16 for the BF16 product
// that reads them next, so that the f32 value is never stored and rounded in a second pass.
using InBf16 = Rows<const uint16_t>;
using OutBf16 = Rows<uint16_t>;

inline float load(const float* at) {
  return *at;
}
inline float load(const uint16_t* at) {
  return widen_bf16(*at);
}
inline void store(float* at, float value) {
  *at = value;
}
inline void store(uint16_t* at, float value) {
  *at = round_to_bf16(value);
}

// m = silu(a) * b.
template <typename A, typename T>
void swiglu(Rows<const A> a, Rows<const A> b, Rows<T> m, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const A *ar = a.row(r), *br = b.row(r);
    T* mr = m.row(r);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      const float av = load(ar + c);
      store(mr + c, av * fast_sigmoid(av) * load(br + c));
    }
  }
}

// The forward under BF16 products: the pre-activations a and b (f32 products' results, biases added) rounded
// to BF16 into a_saved and b_saved, and m = silu(a) * b of those rounded values, in one pass over a and b.
template <typename T>
void swiglu_rounding_inputs(In a, In b, OutBf16 a_saved, OutBf16 b_saved, Rows<T> m, int64_t rows,
                            int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float *ar = a.row(r), *br = b.row(r);
    uint16_t *as = a_saved.row(r), *bs = b_saved.row(r);
    T* mr = m.row(r);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      const uint16_t ab = round_to_bf16(ar[c]), bb = round_to_bf16(br[c]);
      as[c] = ab;
      bs[c] = bb;
      const float av = widen_bf16(ab);
      store(mr + c, av * fast_sigmoid(av) * widen_bf16(bb));
    }
  }
}

// From grad_m: grad_b = grad_m * silu(a); grad_a = grad_m * b * silu'(a), silu'(a) = s·(1 + a·(1 − s)).
// Element i of gm is read before element i of ga or gb is written, so either may be gm itself.
template <typename A, typename T>
void swiglu_grad(Rows<const A> a, Rows<const A> b, In gm, Rows<T> ga, Rows<T> gb, int64_t rows,
                 int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const A *ar = a.row(r), *br = b.row(r);
    const float* gr = gm.row(r);
    T *gar = ga.row(r), *gbr = gb.row(r);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      const float g = gr[c];
      const float av = load(ar + c);
      const float s = fast_sigmoid(av);
      store(gbr + c, g * (av * s));
      store(gar + c, g * load(br + c) * s * (1.0f + av * (1.0f - s)));
    }
  }
}

bool has(const Tensor& t) {
  return t.defined() && t.numel() > 0;
}

// m = the experts' activation of the pre-activations a (gate) and b (up), read in f32 or BF16, written in
// f32 or BF16.
template <typename A, typename T>
void activate(ExpertMlpActivation activation, Rows<const A> a, Rows<const A> b, Rows<T> m, int64_t rows,
              int64_t cols) {
  if (activation != ExpertMlpActivation::GptOssClamped) return swiglu(a, b, m, rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      store(m.row(r) + c, gpt_oss_swiglu(load(a.row(r) + c), load(b.row(r) + c)));
}

// activate() of a and b rounded to BF16, the roundings kept in a_saved and b_saved (the BF16 forward).
template <typename T>
void activate_rounding_inputs(ExpertMlpActivation activation, In a, In b, OutBf16 a_saved, OutBf16 b_saved,
                              Rows<T> m, int64_t rows, int64_t cols) {
  if (activation != ExpertMlpActivation::GptOssClamped)
    return swiglu_rounding_inputs(a, b, a_saved, b_saved, m, rows, cols);
  round_rows_to_bf16(a.p, a.ld, a_saved.p, a_saved.ld, rows, cols);
  round_rows_to_bf16(b.p, b.ld, b_saved.p, b_saved.ld, rows, cols);
  activate(activation, InBf16{a_saved.p, a_saved.ld}, InBf16{b_saved.p, b_saved.ld}, m, rows, cols);
}

// The activation's gradient (swiglu_grad's contract: gm may be ga or gb), from pre-activations in f32 or
// BF16, written in f32 or BF16.
template <typename A, typename T>
void activate_grad(ExpertMlpActivation activation, Rows<const A> a, Rows<const A> b, In gm, Rows<T> ga,
                   Rows<T> gb, int64_t rows, int64_t cols) {
  if (activation != ExpertMlpActivation::GptOssClamped) return swiglu_grad(a, b, gm, ga, gb, rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float g = gm.row(r)[c];
      const GptOssSwigluGrad d = gpt_oss_swiglu_grad(load(a.row(r) + c), load(b.row(r) + c));
      store(ga.row(r) + c, g * d.d_gate);
      store(gb.row(r) + c, g * d.d_up);
    }
}

// acc [cols] += Σ over the n rows of `rows`, row after row.
void add_column_sums(In rows, int64_t n, int64_t cols, float* acc) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < cols; ++c) acc[c] += rows.row(r)[c];
}

// rows [n, cols] += bias (one row of it) on every row.
void add_row_bias(Out rows, int64_t n, int64_t cols, const float* bias) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < cols; ++c) rows.row(r)[c] += bias[c];
}

// The column form's bias: row j of the transposed pre-activation [h, n] (row stride ld) += bias[j].
void add_column_bias(float* columns, int64_t h, int64_t n, int64_t ld, const float* bias) {
  for (int64_t j = 0; j < h; ++j)
    for (int64_t i = 0; i < n; ++i) columns[j * ld + i] += bias[j];
}

// From kColumnPaddingMinRows rows, the column form's products run on a whole number of kColumnQuantum
// columns, the expert's rows followed by zero columns: oneDNN's sgemm ran a ragged column count well below a
// whole one's rate. Compared in one process, the padded forward took less time at every row count from 64 on;
// below 64 rows, where the padding is a larger share, it went both ways, hence the threshold
// (docs/performance_history.md, "Ragged experts padded to 16 columns"). A column's bits do not depend on the
// column count under AVX-512 (expert_mlp.hpp), so the padding changes no result there. 32 was no better.
constexpr int64_t kColumnQuantum = 16;
constexpr int64_t kColumnPaddingMinRows = 64;
int64_t padded_columns(int64_t n) {
  if (n < kColumnPaddingMinRows) return n;
  return (n + kColumnQuantum - 1) / kColumnQuantum * kColumnQuantum;
}

}  // namespace

// The row stride of the saved pre-activations and of the backward's [rows, h] scratch: h plus one cache line,
// so that a stride is never a multiple of 4 KiB: rows 4 KiB apart fall into the same cache sets, so both the
// weight-gradient product gaᵀ·x, which reads ga down its columns, and the transposes into the state ran
// clearly slower at h = 1024 without the extra line (docs/performance_history.md, "The column form").
int64_t padded_stride(int64_t h) {
  return h + 16;
}

namespace {

// Whether experts of kExpertColumnFormMinRows rows or more compute in the column form (expert_mlp.hpp) on the
// calling thread: never under batch invariance, whose row quantum is a rule about the rows of the row form
// (core/matmul.hpp).
bool column_form_allowed_here() {
  return matmul_min_rows() == 0;
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

// Decode's experts: every expert holding rows holds one, so each product is one row against a weight
// matrix (core/matvec). They run as two regions of matvec_transposed_many, every gate and up product and
// then every down product, the activations between them, instead of one task per expert: a thread that
// finishes its expert first takes chunks of the other's rows instead of waiting for it, where with two
// experts over two threads the faster had idled at the end of every MoE block. Each output is the same
// dot product either way (matvec's bits do not depend on the grouping), so the results are those of the
// row form. Only where matmul() would run each of them through core/matvec (not under batch invariance,
// whose row quantum sends m = 1 products to sgemm: core/matmul.hpp).
void forward_one_row_experts(const Tensor& decoded, std::span<const int64_t> offsets,
                             std::span<const int64_t> order, const ExpertWeights& weights, Tensor& out,
                             ExpertMlpState* state) {
  const int64_t h = weights.hidden(), d = weights.model(), ldp = padded_stride(h);
  const int64_t tasks = static_cast<int64_t>(order.size());
  // Without a state (inference) the pre-activations go to scratch, one [2, ldp] pair per expert.
  Tensor unsaved_pre = Tensor::empty({state ? 0 : tasks, 2, ldp});
  Tensor act = Tensor::empty({tasks, h});
  auto row_of = [&](int64_t task) { return offsets[static_cast<size_t>(order[static_cast<size_t>(task)])]; };
  auto pre = [&](int64_t task, int up) {
    if (state) return (up ? state->up_pre : state->gate_pre).data<float>() + row_of(task) * ldp;
    return unsaved_pre.data<float>() + (task * 2 + up) * ldp;
  };
  const float* x = decoded.data<float>();
  float* y = out.data<float>();
  std::vector<MatvecProduct> products;
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t l = order[static_cast<size_t>(task)];
    const float* xl = x + row_of(task) * d;
    products.push_back({xl, weights.matrix(ExpertMatrix::Gate, l), pre(task, 0), false});
    products.push_back({xl, weights.matrix(ExpertMatrix::Up, l), pre(task, 1), false});
  }
  matvec_transposed_many(products);
  products.clear();
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t l = order[static_cast<size_t>(task)];
    float* a = pre(task, 0);
    float* b = pre(task, 1);
    float* m = act.data<float>() + task * h;
    if (has(weights.b1)) add_row_bias(Out{a, ldp}, 1, h, weights.b1.data<float>() + l * h);
    if (has(weights.b3)) add_row_bias(Out{b, ldp}, 1, h, weights.b3.data<float>() + l * h);
    activate(weights.activation, In{a, ldp}, In{b, ldp}, Out{m, h}, 1, h);
    products.push_back({m, weights.matrix(ExpertMatrix::Down, l), y + row_of(task) * d, false});
  }
  matvec_transposed_many(products);
  if (has(weights.b2))
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t l = order[static_cast<size_t>(task)];
      add_row_bias(Out{y + row_of(task) * d, d}, 1, d, weights.b2.data<float>() + l * d);
    }
}

}  // namespace

void refresh_bf16_copies(ExpertWeights& w, MemCategory category) {
  EXPAR_CHECK(w.f32(), "BF16 copies are made from f32 expert weights, got {}",
              w.mxfp4 ? "mxfp4" : dtype_name(w.w1.dtype()));
  refresh_bf16_copy(w.w1, w.w1_bf16, category);
  refresh_bf16_copy(w.w3, w.w3_bf16, category);
  refresh_bf16_copy(w.w2, w.w2_bf16, category);
}

void expert_mlp_forward(const Tensor& input, PayloadFormat input_format, std::span<const int64_t> offsets,
                        const ExpertWeights& weights, Tensor& out, ExpertMlpState* state) {
  weights.validate();
  const int64_t e_local = weights.local_count(), h = weights.hidden(), d = weights.model();
  EXPAR_CHECK(offsets.size() == static_cast<size_t>(e_local + 1) && offsets[0] == 0,
              "expert offsets must be [E_L + 1] = {} entries starting at 0, got {}", e_local + 1,
              offsets.size());
  for (int64_t l = 0; l < e_local; ++l)
    EXPAR_CHECK(offsets[static_cast<size_t>(l) + 1] >= offsets[static_cast<size_t>(l)],
                "expert offsets decrease at local expert {}", l);
  const int64_t recv = offsets[static_cast<size_t>(e_local)];
  // BF16 products read each expert's input rows as BF16 straight from the payload (payload_rows_bf16: a BF16
  // payload as it arrived), never as f32 rows.
  const bool bf16 = weights.bf16_products();
  const Tensor decoded = bf16 ? Tensor{} : decode_payload(input, input_format, recv, d);
  if (!bf16) check_rows(decoded, recv, d, "expert input");
  check_rows(out, recv, d, "expert output");

  const std::vector<int64_t> order = experts_by_rows(offsets);
  const int64_t tasks = static_cast<int64_t>(order.size()), max_rows = max_expert_rows(offsets);
  const int workers = task_threads(tasks);
  // Decided here, on the calling thread: the batch-invariance setting is per thread. Weights held in a narrow
  // format run in the column form too, their tiles dequantised as its products go (core/weight_matmul.hpp).
  const bool column_form_allowed = column_form_allowed_here() && !weights.bf16_products();
  auto in_column_form = [&](int64_t rows) { return column_form_allowed && rows >= kExpertColumnFormMinRows; };
  auto rows_of = [&](int64_t l) {
    return offsets[static_cast<size_t>(l) + 1] - offsets[static_cast<size_t>(l)];
  };
  const bool any_row_form = !order.empty() && !in_column_form(rows_of(order.back()));  // fewest rows last
  // The pre-activations as rows [rows, h] at a padded stride (padded_stride): saved for the backward, or
  // without a state (inference) per worker where the row form computes them; the column form, which
  // computes them transposed, then never transposes them back. BF16 products save them in BF16
  // (ExpertMlpState) and compute them in f32 per worker, in cache, before rounding them.
  const int64_t ldp = padded_stride(h);
  if (state) {
    state->input = input;
    state->input_format = input_format;
    state->offsets.assign(offsets.begin(), offsets.end());
    const DType saved = bf16 ? DType::BF16 : DType::F32;
    state->gate_pre = Tensor::empty({recv, ldp}, saved);
    state->up_pre = Tensor::empty({recv, ldp}, saved);
  }
  if (h > 0 && max_rows == 1 && matmul_runs_matvec(1, false, true) && !bf16) {
    forward_one_row_experts(decoded, offsets, order, weights, out, state);
    return;
  }
  Tensor unsaved_pre = Tensor::empty({(!state || bf16) && any_row_form ? workers : 0, 2, max_rows, ldp});
  // Per worker, reused expert after expert so that it is read back from cache: the activation [rows, h], and
  // for the column form the transposed pre-activations [h, rows] and input and output [d, rows].
  const int64_t max_columns = padded_columns(max_rows);
  Tensor act = Tensor::empty({workers, max_columns, h});
  Tensor columns = Tensor::empty({in_column_form(max_rows) ? workers : 0, max_columns, h + 2 * d});
  // BF16 products: per worker the expert's input rows [rows, d] (unless the payload is BF16), its activation
  // [rows, ldp] and, without a state, its rounded pre-activations [rows, 2 * ldp] in BF16.
  const int64_t bf16_row = d + ldp + (state ? 0 : 2 * ldp);
  Tensor bf16_scratch = Tensor::empty({bf16 ? workers : 0, max_rows, bf16_row}, DType::BF16);
  const float* x = bf16 ? nullptr : decoded.data<float>();
  float* y = out.data<float>();
  for_each_task(tasks, [&](int64_t task, int thread) {
    const int64_t l = order[static_cast<size_t>(task)];
    const int64_t begin = offsets[static_cast<size_t>(l)], n = rows_of(l);
    float* m = act.data<float>() + thread * max_columns * h;
    float* yl = y + begin * d;
    float* al = state && !bf16 ? state->gate_pre.data<float>() + begin * ldp
                               : unsaved_pre.data<float>() + thread * 2 * max_rows * ldp;
    float* bl = state && !bf16 ? state->up_pre.data<float>() + begin * ldp : al + max_rows * ldp;
    if (h == 0) {  // an empty intermediate shard (inference with expert TP): only the down bias, if held
      std::fill(yl, yl + n * d, 0.0f);
    } else if (in_column_form(n)) {
      // aᵀ [h, n] = w1 · xᵀ, bᵀ likewise, yᵀ [d, n] = w2 · mᵀ: the weights are the products' left operand as
      // stored, not transposed, and the n rows their columns (expert_mlp.hpp). The pre-activations are saved
      // as rows, transposed while in cache and written past the cache: the backward reads them long after.
      // The n rows as the first n of cols columns, any others zero (padded_columns).
      const int64_t cols = padded_columns(n);
      float* bt = columns.data<float>() + thread * max_columns * (h + 2 * d);
      float* xt = bt + h * cols;
      float* yt = xt + d * cols;
      float* at = m;
      transpose(x + begin * d, n, d, d, xt, cols);
      if (cols > n)
        for (int64_t c = 0; c < d; ++c) std::fill(xt + c * cols + n, xt + (c + 1) * cols, 0.0f);
      matmul_weight_columns({.w = weights.matrix(ExpertMatrix::Gate, l), .xt = xt, .cols = cols, .yt = at});
      matmul_weight_columns({.w = weights.matrix(ExpertMatrix::Up, l), .xt = xt, .cols = cols, .yt = bt});
      if (has(weights.b1)) add_column_bias(at, h, n, cols, weights.b1.data<float>() + l * h);
      if (has(weights.b3)) add_column_bias(bt, h, n, cols, weights.b3.data<float>() + l * h);
      if (state) {
        transpose_streaming(at, h, n, cols, al, ldp);
        transpose_streaming(bt, h, n, cols, bl, ldp);
      }
      // mᵀ over aᵀ, in place, the zero columns too (their activation is 0, so no NaN or denormal reaches the
      // down product, whose extra columns are then dropped).
      activate(weights.activation, In{at, cols}, In{bt, cols}, Out{m, cols}, h, cols);
      matmul_weight_columns({.w = weights.matrix(ExpertMatrix::Down, l), .xt = m, .cols = cols, .yt = yt});
      transpose(yt, d, n, cols, yl, d);
    } else if (bf16) {
      uint16_t* x_scratch = static_cast<uint16_t*>(bf16_scratch.raw()) + thread * max_rows * bf16_row;
      uint16_t* mb = x_scratch + max_rows * d;
      uint16_t* as =
          state ? static_cast<uint16_t*>(state->gate_pre.raw()) + begin * ldp : mb + max_rows * ldp;
      uint16_t* bs = state ? static_cast<uint16_t*>(state->up_pre.raw()) + begin * ldp : as + max_rows * ldp;
      const uint16_t* w1 = static_cast<const uint16_t*>(weights.w1_bf16.raw()) + l * h * d;
      const uint16_t* w3 = static_cast<const uint16_t*>(weights.w3_bf16.raw()) + l * h * d;
      const uint16_t* w2 = static_cast<const uint16_t*>(weights.w2_bf16.raw()) + l * d * h;
      // a [n, h] = x·w1ᵀ, b = x·w3ᵀ, y [n, d] = m·w2ᵀ: x rounded to BF16; a and b computed in f32, biases
      // added, then rounded to BF16 (the BF16 outputs of autocast's products), which m is computed from and
      // the backward reads; m rounded to BF16; y f32.
      const uint16_t* xb = payload_rows_bf16(input, input_format, begin, n, d, x_scratch);
      matmul_bf16({.a = xb, .b = w1, .c = al, .m = n, .n = h, .k = d, .trans_b = true, .ldc = ldp});
      matmul_bf16({.a = xb, .b = w3, .c = bl, .m = n, .n = h, .k = d, .trans_b = true, .ldc = ldp});
      if (has(weights.b1)) add_row_bias(Out{al, ldp}, n, h, weights.b1.data<float>() + l * h);
      if (has(weights.b3)) add_row_bias(Out{bl, ldp}, n, h, weights.b3.data<float>() + l * h);
      activate_rounding_inputs(weights.activation, In{al, ldp}, In{bl, ldp}, OutBf16{as, ldp},
                               OutBf16{bs, ldp}, OutBf16{mb, ldp}, n, h);
      matmul_bf16({.a = mb, .b = w2, .c = yl, .m = n, .n = d, .k = h, .trans_b = true, .lda = ldp});
    } else {
      const WeightProduct gate{
          .x = x + begin * d, .m = n, .w = weights.matrix(ExpertMatrix::Gate, l), .y = al, .ldy = ldp};
      matmul_weight(gate);
      WeightProduct up = gate;
      up.w = weights.matrix(ExpertMatrix::Up, l);
      up.y = bl;
      matmul_weight(up);
      if (has(weights.b1)) add_row_bias(Out{al, ldp}, n, h, weights.b1.data<float>() + l * h);
      if (has(weights.b3)) add_row_bias(Out{bl, ldp}, n, h, weights.b3.data<float>() + l * h);
      activate(weights.activation, In{al, ldp}, In{bl, ldp}, Out{m, h}, n, h);
      matmul_weight(WeightProduct{.x = m, .m = n, .w = weights.matrix(ExpertMatrix::Down, l), .y = yl});
    }
    if (has(weights.b2)) add_row_bias(Out{yl, d}, n, d, weights.b2.data<float>() + l * d);
  });
}

void expert_mlp_backward(const Tensor& grad_out, const ExpertMlpState& state, const ExpertWeights& weights,
                         Tensor& grad_in, ExpertWeights& grads, GradientUpdate update) {
  weights.validate();
  EXPAR_CHECK(weights.f32(), "the expert backward needs f32 weights, got {}",
              weights.mxfp4 ? "mxfp4" : dtype_name(weights.w1.dtype()));
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

  // Per worker, two [rows of the largest expert, h] scratch buffers with padded rows (padded_stride), reused
  // expert after expert so that each expert's activation and its gradients are produced and consumed while in
  // cache: the first holds the recomputed activation m (unpadded: gyᵀ·m read it fastest so), then grad_a; the
  // second grad_m, then grad_b (swiglu_grad works in place). Each expert writes only its own rows of grad_in
  // and its own slices of the gradients.
  const std::vector<int64_t> order = experts_by_rows(state.offsets);
  const int64_t tasks = static_cast<int64_t>(order.size()), max_rows = max_expert_rows(state.offsets);
  const int workers = task_threads(tasks);
  const int64_t ldp = padded_stride(h);
  Tensor scratch = Tensor::empty({workers, 2, max_rows, ldp});
  // BF16 products: per worker the expert's input rows and output gradient [rows, d] and two [rows, ldp]
  // (the activation, then the gate pre-activation's gradient; the up pre-activation's gradient) in BF16.
  const bool bf16 = weights.bf16_products();
  Tensor bf16_scratch = Tensor::empty({bf16 ? workers : 0, max_rows, 2 * d + 2 * ldp}, DType::BF16);
  // The Wgrad input: the saved payload, decoded again if it was kept encoded (BF16 products read it as BF16
  // rows per expert instead: payload_rows_bf16).
  const Tensor decoded = bf16 ? Tensor{} : decode_payload(state.input, state.input_format, recv, d);
  const float* x = bf16 ? nullptr : decoded.data<float>();
  const DType saved = bf16 ? DType::BF16 : DType::F32;
  EXPAR_CHECK(state.gate_pre.dtype() == saved && state.up_pre.dtype() == saved,
              "expert backward: the saved pre-activations are {} but the weights {} BF16 copies, which save "
              "them in {}: run the forward and the backward with the same weights",
              dtype_name(state.gate_pre.dtype()), bf16 ? "hold" : "do not hold", dtype_name(saved));
  const float* gy = grad_out.data<float>();
  float* gx = grad_in.data<float>();
  // Each expert's weight gradients are written by one product each, so into zeros they need not be read.
  const bool add_weight_grads = update == GradientUpdate::Add;
  for_each_task(tasks, [&](int64_t task, int thread) {
    const int64_t l = order[static_cast<size_t>(task)];
    const int64_t begin = state.offsets[static_cast<size_t>(l)];
    const int64_t n = state.offsets[static_cast<size_t>(l) + 1] - begin;
    const float* w1 = weights.w1.data<float>() + l * h * d;
    const float* w3 = weights.w3.data<float>() + l * h * d;
    const float* w2 = weights.w2.data<float>() + l * d * h;
    float* m = scratch.data<float>() + thread * 2 * max_rows * ldp;
    float* gm = m + max_rows * ldp;
    if (has(grads.b2)) add_column_sums(In{gy + begin * d, d}, n, d, grads.b2.data<float>() + l * d);
    if (h == 0) {  // an empty intermediate shard: only the down bias had a gradient
      std::fill(gx + begin * d, gx + (begin + n) * d, 0.0f);
      return;
    }
    if (bf16) {
      const InBf16 al{static_cast<const uint16_t*>(state.gate_pre.raw()) + begin * ldp, ldp};
      const InBf16 bl{static_cast<const uint16_t*>(state.up_pre.raw()) + begin * ldp, ldp};
      uint16_t* x_scratch =
          static_cast<uint16_t*>(bf16_scratch.raw()) + thread * max_rows * (2 * d + 2 * ldp);
      uint16_t* gyb = x_scratch + max_rows * d;
      uint16_t* mb = gyb + max_rows * d;  // m, then grad_a
      uint16_t* gbb = mb + max_rows * ldp;
      const uint16_t* w1b = static_cast<const uint16_t*>(weights.w1_bf16.raw()) + l * h * d;
      const uint16_t* w3b = static_cast<const uint16_t*>(weights.w3_bf16.raw()) + l * h * d;
      const uint16_t* w2b = static_cast<const uint16_t*>(weights.w2_bf16.raw()) + l * d * h;
      // The f32 backward's products below, each on BF16 operands with an f32 result.
      round_rows_to_bf16(gy + begin * d, d, gyb, d, n, d);
      activate(weights.activation, al, bl, OutBf16{mb, ldp}, n, h);
      matmul_bf16({.a = gyb,
                   .b = mb,
                   .c = grads.w2.data<float>() + l * d * h,
                   .m = d,
                   .n = h,
                   .k = n,
                   .trans_a = true,
                   .accumulate = add_weight_grads,
                   .lda = d,
                   .ldb = ldp});
      matmul_bf16({.a = gyb, .b = w2b, .c = gm, .m = n, .n = h, .k = d, .ldc = ldp});
      // The pre-activations' gradients go straight to BF16, unless the biases' gradients need their f32
      // values.
      if (has(grads.b1) || has(grads.b3)) {
        float* ga = m;
        float* gb = gm;
        activate_grad(weights.activation, al, bl, In{gm, ldp}, Out{ga, ldp}, Out{gb, ldp}, n, h);
        if (has(grads.b1)) add_column_sums(In{ga, ldp}, n, h, grads.b1.data<float>() + l * h);
        if (has(grads.b3)) add_column_sums(In{gb, ldp}, n, h, grads.b3.data<float>() + l * h);
        round_rows_to_bf16(ga, ldp, mb, ldp, n, h);
        round_rows_to_bf16(gb, ldp, gbb, ldp, n, h);
      } else {
        activate_grad(weights.activation, al, bl, In{gm, ldp}, OutBf16{mb, ldp}, OutBf16{gbb, ldp}, n, h);
      }
      const uint16_t* xb = payload_rows_bf16(state.input, state.input_format, begin, n, d, x_scratch);
      for (auto [g, grad_w] : {std::pair{mb, grads.w1.data<float>()}, std::pair{gbb, grads.w3.data<float>()}})
        matmul_bf16({.a = g,
                     .b = xb,
                     .c = grad_w + l * h * d,
                     .m = h,
                     .n = d,
                     .k = n,
                     .trans_a = true,
                     .accumulate = add_weight_grads,
                     .lda = ldp,
                     .ldb = d});
      float* gxl = gx + begin * d;
      matmul_bf16({.a = mb, .b = w1b, .c = gxl, .m = n, .n = d, .k = h, .lda = ldp});
      matmul_bf16({.a = gbb, .b = w3b, .c = gxl, .m = n, .n = d, .k = h, .accumulate = true, .lda = ldp});
      return;
    }
    // grad_w2 [d,h] += gyᵀ [d,n] · m [n,h];  grad_m [n,h] = gy [n,d] · w2 [d,h].
    const In al{state.gate_pre.data<float>() + begin * ldp, ldp},
        bl{state.up_pre.data<float>() + begin * ldp, ldp};
    activate(weights.activation, al, bl, Out{m, h}, n, h);
    matmul(gy + begin * d, m, grads.w2.data<float>() + l * d * h, d, h, n, true, false, add_weight_grads);
    MatmulArgs m_grad{gy + begin * d, w2, gm, n, h, d, false, false, false};
    m_grad.ldc = ldp;
    matmul(m_grad);
    float* ga = m;   // m is no longer needed
    float* gb = gm;  // in place
    activate_grad(weights.activation, al, bl, In{gm, ldp}, Out{ga, ldp}, Out{gb, ldp}, n, h);
    if (has(grads.b1)) add_column_sums(In{ga, ldp}, n, h, grads.b1.data<float>() + l * h);
    if (has(grads.b3)) add_column_sums(In{gb, ldp}, n, h, grads.b3.data<float>() + l * h);
    // grad_w1 [h,d] += gaᵀ [h,n] · x [n,d]; same for w3; grad_x [n,d] = ga · w1 + gb · w3.
    for (auto [g, grad_w] : {std::pair{ga, grads.w1.data<float>()}, std::pair{gb, grads.w3.data<float>()}}) {
      MatmulArgs w_grad{g, x + begin * d, grad_w + l * h * d, h, d, n, true, false, add_weight_grads};
      w_grad.lda = ldp;
      matmul(w_grad);
    }
    MatmulArgs x_grad{ga, w1, gx + begin * d, n, d, h, false, false, false};
    x_grad.lda = ldp;
    matmul(x_grad);
    x_grad.a = gb;
    x_grad.b = w3;
    x_grad.accumulate = true;
    matmul(x_grad);
  });
}

}  // namespace expar
