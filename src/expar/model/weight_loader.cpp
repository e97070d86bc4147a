#include "expar/model/weight_loader.hpp"

#include <cstring>

#include "expar/core/convert.hpp"
#include "expar/core/error.hpp"
#include "expar/core/weight_view.hpp"

namespace expar {

namespace {

// Element (r, c) of a 2-D view as f32 (F32, BF16 or F16).
class F32Reader {
 public:
  explicit F32Reader(const Tensor& t) : t_(t), cols_(t.dim(1)) {}
  float at(int64_t r, int64_t c) const {
    const int64_t i = r * cols_ + c;
    switch (t_.dtype()) {
      case DType::F32:
        return static_cast<const float*>(t_.raw())[i];
      case DType::BF16:
        return bf16_to_f32(static_cast<const uint16_t*>(t_.raw())[i]);
      case DType::F16:
        return f16_to_f32(static_cast<const uint16_t*>(t_.raw())[i]);
      default:
        fail("a weight of dtype {} cannot be loaded: inference loads F32, BF16 or F16 weights",
             dtype_name(t_.dtype()));
    }
  }

 private:
  const Tensor& t_;
  int64_t cols_;
};

// Columns [begin, end) of a 2-D tensor held as stored, one copy in its own dtype.
Tensor copy_columns(const Tensor& v, int64_t begin, int64_t end, MemCategory category) {
  const int64_t rows = v.dim(0), n = end - begin;
  const size_t element = dtype_size(v.dtype());
  Tensor out = Tensor::empty({rows, n}, v.dtype(), category);
  const char* src = static_cast<const char*>(v.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t a = 0; a < rows; ++a)
    std::memcpy(dst + static_cast<size_t>(a * n) * element,
                src + static_cast<size_t>(a * v.dim(1) + begin) * element, static_cast<size_t>(n) * element);
  // Block-scaled FP8: the columns keep the whole grid, placed by their first column, and v's NaN check.
  if (const Tensor* scales = v.block_scales())
    return out.with_block_scales(scales->clone(category), v.block_row0(), v.block_col0() + begin,
                                 v.fp8_nan_free());
  return out;
}

// Whether every expert's piece of block-scaled FP8 (rows seen as [rows, cols]) starts on a block row and
// holds whole block rows, so the pieces' grids stack into the stacked matrix's grid.
bool fp8_stackable(const Tensor& piece) {
  const int64_t cols = piece.shape().back(), rows = cols == 0 ? 0 : piece.numel() / cols;
  return piece.block_row0() % kFp8Block == 0 && rows % kFp8Block == 0;
}

void check_matrix(const Tensor& t, int expert) {
  EXPAR_CHECK(t.ndim() == 2, "expert {}'s weight has shape {}: an expert matrix must be 2-D", expert,
              shape_string(t.shape()));
}

}  // namespace

ExpertView per_expert_view(const TensorStore& store, std::function<std::string(int)> name) {
  return [&store, name = std::move(name)](int e) { return store.view(name(e)); };
}

ExpertView stacked_expert_view(const TensorStore& store, std::string name) {
  return [&store, name = std::move(name)](int e) {
    const TensorInfo& info = store.info(name);
    EXPAR_CHECK((info.shape.size() == 3 || info.shape.size() == 2) && e >= 0 && e < info.shape[0],
                "stacked expert tensor '{}' has shape {}: expected [E, a, b] or [E, b] with expert {} < E",
                name, shape_string(info.shape), e);
    if (info.shape.size() == 2) return store.view_rows(name, e, e + 1);  // a stacked bias: [1, b]
    return store.view_rows(name, e, e + 1).reshape({info.shape[1], info.shape[2]});
  };
}

ExpertLoader identity_loader(ExpertView view) {
  return [view = std::move(view)](int e) {
    Tensor v = view(e);
    check_matrix(v, e);
    return to_f32(v, MemCategory::ExpertWeights);
  };
}

ExpertLoader rows_loader(ExpertView view, int64_t begin, int64_t end, bool transpose) {
  return [view = std::move(view), begin, end, transpose](int e) {
    Tensor v = view(e);
    check_matrix(v, e);
    EXPAR_CHECK(0 <= begin && begin <= end && end <= v.dim(0),
                "expert {}: rows [{}, {}) are outside its {} rows: the intermediate shard does not fit", e,
                begin, end, v.dim(0));
    const int64_t n = end - begin, cols = v.dim(1);
    if (!transpose) return to_f32(v.rows(begin, end), MemCategory::ExpertWeights);
    Tensor out = Tensor::empty({cols, n}, DType::F32, MemCategory::ExpertWeights);
    F32Reader r(v);
    float* o = out.data<float>();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < cols; ++c) o[c * n + i] = r.at(begin + i, c);
    return out;
  };
}

ExpertLoader columns_loader(ExpertView view, int64_t begin, int64_t end, int64_t stride, int64_t offset,
                            bool transpose) {
  return [view = std::move(view), begin, end, stride, offset, transpose](int e) {
    Tensor v = view(e);
    check_matrix(v, e);
    const int64_t rows = v.dim(0), n = end - begin;
    EXPAR_CHECK(stride >= 1 && offset >= 0 && 0 <= begin && begin <= end &&
                    (n == 0 || offset + stride * (end - 1) < v.dim(1)),
                "expert {}: columns {}+{}*[{}, {}) are outside its {} columns: the intermediate shard does "
                "not fit",
                e, offset, stride, begin, end, v.dim(1));
    Tensor out =
        Tensor::empty(transpose ? Shape{n, rows} : Shape{rows, n}, DType::F32, MemCategory::ExpertWeights);
    F32Reader r(v);
    float* o = out.data<float>();
    for (int64_t a = 0; a < rows; ++a)
      for (int64_t j = 0; j < n; ++j) {
        const float x = r.at(a, offset + stride * (begin + j));
        if (transpose)
          o[j * rows + a] = x;
        else
          o[a * n + j] = x;
      }
    return out;
  };
}

ExpertLoader rows_loader_as_stored(ExpertView view, int64_t begin, int64_t end) {
  ExpertLoader widened = rows_loader(view, begin, end);
  return [view = std::move(view), begin, end, widened = std::move(widened)](int e) {
    Tensor v = view(e);
    if (!held_as_stored(v) || v.ndim() != 2 || begin < 0 || end > v.dim(0) || begin > end)
      return widened(e);  // widened, or refused with widened's message
    return v.rows(begin, end).clone(MemCategory::ExpertWeights);
  };
}

ExpertLoader columns_loader_as_stored(ExpertView view, int64_t begin, int64_t end) {
  ExpertLoader widened = columns_loader(view, begin, end);
  return [view = std::move(view), begin, end, widened = std::move(widened)](int e) {
    Tensor v = view(e);
    if (!held_as_stored(v) || v.ndim() != 2 || begin < 0 || end > v.dim(1) || begin > end) return widened(e);
    return copy_columns(v, begin, end, MemCategory::ExpertWeights);
  };
}

Tensor expert_parallel_weight_loader(std::span<const int> local_experts, const ExpertLoader& base) {
  Tensor out, grid;
  int64_t per = 0, col0 = 0;
  // Block-scaled FP8 pieces that do not cover whole block rows are widened to f32 (their values exactly).
  bool widen = false;
  bool nan_free = true;  // every FP8 piece checked free of NaN codes: so is their stack
  for (size_t l = 0; l < local_experts.size(); ++l) {
    Tensor piece = base(local_experts[l]);
    if (l == 0 && piece.block_scales() != nullptr) widen = !fp8_stackable(piece);
    if (widen) piece = to_f32(piece, MemCategory::ExpertWeights);
    if (l == 0) {
      Shape s{static_cast<int64_t>(local_experts.size())};
      s.insert(s.end(), piece.shape().begin(), piece.shape().end());
      out = Tensor::empty(s, piece.dtype(), MemCategory::ExpertWeights);
      per = piece.numel();
      if (const Tensor* scales = piece.block_scales()) {
        const int64_t block_rows = piece.numel() / piece.shape().back() / kFp8Block;
        grid = Tensor::empty({static_cast<int64_t>(local_experts.size()) * block_rows, scales->dim(1)},
                             DType::F32, MemCategory::ExpertWeights);
        col0 = piece.block_col0();
      }
    }
    if (grid.defined() && grid.numel() > 0) {
      // This expert's block rows of its grid, after the previous experts'.
      const Tensor* scales = piece.block_scales();
      const int64_t block_rows = grid.dim(0) / static_cast<int64_t>(local_experts.size());
      EXPAR_CHECK(scales != nullptr && fp8_stackable(piece) && scales->dim(1) == grid.dim(1) &&
                      piece.block_col0() == col0,
                  "expert {}'s FP8 weight does not stack with expert {}'s: the same shard of every expert "
                  "must cover whole 128-row blocks",
                  local_experts[l], local_experts[0]);
      nan_free = nan_free && piece.fp8_nan_free();
      std::memcpy(grid.data<float>() + static_cast<int64_t>(l) * block_rows * grid.dim(1),
                  scales->data<float>() + piece.block_row0() / kFp8Block * scales->dim(1),
                  static_cast<size_t>(block_rows * grid.dim(1)) * sizeof(float));
    }
    EXPAR_CHECK(
        piece.numel() == per && piece.dtype() == out.dtype() &&
            Shape(out.shape().begin() + 1, out.shape().end()) == piece.shape(),
        "expert {} loads as {} {} but expert {} loaded as {} {}: every expert must have the same shape "
        "and dtype",
        local_experts[l], dtype_name(piece.dtype()), shape_string(piece.shape()), local_experts[0],
        dtype_name(out.dtype()), shape_string(Shape(out.shape().begin() + 1, out.shape().end())));
    std::memcpy(static_cast<char*>(out.raw()) + l * piece.nbytes(), piece.raw(), piece.nbytes());
  }
  if (grid.defined() && grid.numel() > 0) return out.with_block_scales(std::move(grid), 0, col0, nan_free);
  return out;
}

Tensor load_dense(const TensorStore& store, const std::string& name) {
  const TensorInfo& i = store.info(name);
  if (i.shape.empty()) return to_f32(store.view(name), MemCategory::DenseWeights);  // a scalar: one value
  return load_rows(store, name, 0, i.shape[0]);
}

Tensor load_rows(const TensorStore& store, const std::string& name, int64_t begin, int64_t end) {
  Tensor copy = to_f32(store.view_rows(name, begin, end), MemCategory::DenseWeights);
  store.release_rows(name, begin, end);
  return copy;
}

Tensor map_rows(const TensorStore& store, const std::string& name, int64_t begin, int64_t end) {
  Tensor v = store.view_rows(name, begin, end);
  // F32 rows of a mapped file are used where they lie: the view keeps the mapping alive.
  if (v.dtype() == DType::F32 && store.mapped(name)) return v.charged(MemCategory::MappedWeights);
  return load_rows(store, name, begin, end);
}

Tensor load_rows_as_stored(const TensorStore& store, const std::string& name, int64_t begin, int64_t end) {
  const Tensor v = store.view_rows(name, begin, end);
  if (!held_as_stored(v)) return load_rows(store, name, begin, end);
  Tensor copy = v.clone(MemCategory::DenseWeights);
  store.release_rows(name, begin, end);
  return copy;
}

Tensor map_rows_as_stored(const TensorStore& store, const std::string& name, int64_t begin, int64_t end) {
  Tensor v = store.view_rows(name, begin, end);
  if (held_as_stored(v) && store.mapped(name)) return v.charged(MemCategory::MappedWeights);
  return load_rows_as_stored(store, name, begin, end);
}

Tensor load_columns_as_stored(const TensorStore& store, const std::string& name, int64_t begin, int64_t end) {
  const Tensor v = store.view(name);
  if (!held_as_stored(v) || v.ndim() != 2 || begin < 0 || end > v.dim(1) || begin > end)
    return load_columns(store, name, begin, end);  // widened, or refused with its message
  Tensor out = copy_columns(v, begin, end, MemCategory::DenseWeights);
  store.release_rows(name, 0, v.dim(0));
  return out;
}

Tensor load_columns(const TensorStore& store, const std::string& name, int64_t begin, int64_t end) {
  Tensor v = store.view(name);
  if (v.ndim() == 2 && begin == 0 && end == v.dim(1)) return load_dense(store, name);  // every column
  EXPAR_CHECK(v.ndim() == 2 && 0 <= begin && begin <= end && end <= v.dim(1),
              "tensor '{}' has shape {}: cannot take columns [{}, {})", name, shape_string(v.shape()), begin,
              end);
  const int64_t rows = v.dim(0), n = end - begin;
  Tensor out = Tensor::empty({rows, n}, DType::F32, MemCategory::DenseWeights);
  F32Reader r(v);
  float* o = out.data<float>();
  for (int64_t a = 0; a < rows; ++a)
    for (int64_t j = 0; j < n; ++j) o[a * n + j] = r.at(a, begin + j);
  store.release_rows(name, 0, rows);
  return out;
}

}  // namespace expar
