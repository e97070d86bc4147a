// Block-scaled FP8 weights (DeepSeek-V3's and Qwen3's FP8 storage: E4M3 codes and one f32 multiplier per
// 128 × 128 block) in the engine, held and multiplied as stored: against the same checkpoint written with the
// F32 values the codes encode, decode's logits are the same bits and prefill's within 1e-5, on one rank, TP
// 2, TP 2 with EP and TP 4 with EP 2, for Mixtral with 128-wide matrices (experts held in FP8 where a rank's
// shard covers whole 128-row blocks, widened to f32 where not) and Qwen-MoE with ragged blocks and a shared
// expert. `--weight-dtype fp8` on the F32 checkpoint gives the bits of the checkpoint stored in FP8, and
// `--weight-dtype fp8|bf16` the conversions of the unconverted weights (experts converted piece by piece or
// stacked).
#include <gtest/gtest.h>

#include "common/temp_dir.hpp"
#include "expar/core/convert.hpp"
#include "expar/core/tensor_convert.hpp"
#include "expar/infer/engine.hpp"
#include "expar/model/weight_loader.hpp"
#include "hf_test_models.hpp"

namespace expar::infer {
namespace {

using namespace testing;

TEST(Fp8Weights, BlocksRoundTripAndViewsKeepTheirScales) {
  Tensor t = Tensor::empty({200, 300});
  fill_normal(t, 5, 1, 1.0f);
  t.data<float>()[7 * 300 + 11] = 0.0f;
  const Tensor codes = to_fp8_blocks(t, MemCategory::Other);
  ASSERT_NE(codes.block_scales(), nullptr);
  EXPECT_EQ(codes.block_scales()->shape(), (Shape{2, 3}));
  const Tensor back = to_f32(codes, MemCategory::Other);
  const float* v = t.data<float>();
  const float* b = back.data<float>();
  const float* s = codes.block_scales()->data<float>();
  const auto* c = static_cast<const uint8_t*>(codes.raw());
  for (int64_t r = 0; r < 200; ++r)
    for (int64_t k = 0; k < 300; ++k) {
      const float scale = s[(r / 128) * 3 + k / 128];
      // Each value is its code's E4M3 value times the block's multiplier, rounded once.
      ASSERT_EQ(b[r * 300 + k], e4m3_to_f32(c[r * 300 + k]) * scale) << r << " " << k;
      // Within half an E4M3 step: 2^-4 relative for normals, 2^-10 · scale below them.
      EXPECT_LE(std::fabs(b[r * 300 + k] - v[r * 300 + k]),
                std::max(std::fabs(v[r * 300 + k]) / 16.0f, scale * 0x1p-10f) * 1.0001f)
          << r << " " << k;
    }
  // A row view keeps the grid, placed by its first row: the same values as the rows of the whole.
  const Tensor part = to_f32(codes.rows(130, 190), MemCategory::Other);
  EXPECT_EQ(std::memcmp(part.raw(), b + 130 * 300, part.nbytes()), 0);
  const Tensor copy = codes.rows(5, 150).clone();
  const Tensor copied = to_f32(copy, MemCategory::Other);
  EXPECT_EQ(std::memcmp(copied.raw(), b + 5 * 300, copied.nbytes()), 0);
  // Without its scales an FP8 tensor is no weight.
  EXPECT_THROW(weight_view(Tensor::zeros({4, 4}, DType::F8E4M3)), Error);
}

// The NaN-code check travels with the codes: a column copy keeps its source's flag and a stack of experts is
// free of NaN codes exactly when every expert is, without the copies being read again.
TEST(Fp8Weights, LoadedCopiesKeepTheNanCheckOfTheirSources) {
  std::vector<Tensor> experts;
  for (int e = 0; e < 3; ++e) {
    Tensor t = Tensor::empty({128, 256});
    fill_normal(t, 11, static_cast<uint64_t>(e), 1.0f);
    Tensor codes = to_fp8_blocks(t, MemCategory::Other);
    if (e == 1) {  // a NaN code in expert 1's first column block: scaled again, so the check sees it
      static_cast<uint8_t*>(codes.raw())[5 * 256 + 3] = 0x7f;
      codes = codes.with_block_scales(codes.block_scales()->clone(), 0, 0);
    }
    experts.push_back(codes);
  }
  ASSERT_TRUE(experts[0].fp8_nan_free());
  ASSERT_FALSE(experts[1].fp8_nan_free());
  const ExpertView view = [&](int e) { return experts[static_cast<size_t>(e)]; };
  const std::vector<int> clean{0, 2}, with_nan{0, 1, 2};
  const ExpertLoader whole = rows_loader_as_stored(view, 0, 128);
  const Tensor clean_stack = expert_parallel_weight_loader(clean, whole);
  ASSERT_EQ(clean_stack.dtype(), DType::F8E4M3);
  EXPECT_TRUE(clean_stack.fp8_nan_free());
  EXPECT_FALSE(expert_parallel_weight_loader(with_nan, whole).fp8_nan_free());
  // Columns [128, 256) of expert 1 hold no NaN code but come from a tensor that does: the flag stays off,
  // which keeps the NaN lanes' handling and the same values.
  const ExpertLoader columns = columns_loader_as_stored(view, 128, 256);
  EXPECT_TRUE(columns(0).fp8_nan_free());
  EXPECT_FALSE(columns(1).fp8_nan_free());
  const Tensor stacked = expert_parallel_weight_loader(clean, columns);
  EXPECT_TRUE(stacked.fp8_nan_free());
  EXPECT_EQ(stacked.dtype(), DType::F8E4M3);
}

struct Logits {
  Tensor prefill, decode;
  DType experts = DType::F32, attention = DType::F32;
};

Logits run(const fs::path& dir, const InferenceLayout& layout, const std::vector<int32_t>& prompt,
           std::optional<DType> weight_dtype = std::nullopt) {
  const ModelSpec spec = open_model_spec(dir);
  MemoryTracker& host = current_tracker();
  Logits out;
  run_ranks(layout.world(), [&](Comm& world) {
    auto store = open_store(spec);
    Engine engine(layout, world, load_rank_weights(*store, spec, layout, world.rank(), weight_dtype));
    const int id = engine.add_sequence(32);
    const Tensor prefill = engine.prefill(std::vector<int>{id}, {prompt});
    engine.decode(std::vector<int>{id}, std::vector<int32_t>{prompt[0]});
    const Tensor decode = engine.decode(std::vector<int>{id}, std::vector<int32_t>{prompt[1]});
    if (world.rank() == 0) {
      out.prefill = export_to(host, prefill);
      out.decode = export_to(host, decode);
      out.experts = engine.weights().layers[0].experts.w1.dtype();
      out.attention = engine.weights().layers[0].attn.wq.dtype();
    }
  });
  return out;
}

void expect_bits_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << what;
}

TEST(Fp8Weights, TheEngineMultipliesThemAsStored) {
  // Mixtral's intermediate of 128 at TP 2: gate/up shards of 64 rows do not stack, down's 128 rows do, and
  // all three are widened alike.
  for (const char* family : {"mixtral", "mixtral 128", "qwen2_moe"}) {
    const std::string f = family;
    HfTestModel m = f == "mixtral"       ? mixtral_fp8_test_model()
                    : f == "mixtral 128" ? mixtral_fp8_test_model(128)
                                         : qwen_test_model();
    test::TempDir dir("fp8_weights");
    const fs::path f32_dir = dir.path() / "f32", fp8_dir = dir.path() / "fp8";
    fs::create_directories(f32_dir);
    fs::create_directories(fp8_dir);
    const Fp8Checkpoint c = fp8_quantised(m.tensors);
    write_sharded_checkpoint(f32_dir, c.dequantised, 256 * 1024);
    write_sharded_checkpoint(fp8_dir, c.stored, 256 * 1024);
    std::ofstream(f32_dir / "config.json") << m.config().dump(2);
    std::ofstream(fp8_dir / "config.json") << fp8_config(m.config()).dump(2);
    const std::vector<int32_t> prompt = vocab_tokens(5, 7, m.vocab);
    for (auto [tp, ep, ep_degree] :
         {std::tuple{1, false, 0}, std::tuple{2, false, 0}, std::tuple{2, true, 0}, std::tuple{4, true, 2}}) {
      const InferenceLayout layout = make_layout(
          tp, 1, ep, ep_degree > 0 ? std::optional(ep_degree) : std::nullopt, static_cast<int>(m.experts));
      const std::string what = fmt::format("{} TP {} EP {}", family, tp, layout.ep_degree());
      const Logits want = run(f32_dir, layout, prompt);
      const Logits got = run(fp8_dir, layout, prompt);
      // Experts in FP8 where every rank's shard covers whole 128-row blocks: Mixtral's 256 intermediate rows
      // whole or halved; Qwen's 12 never.
      const int64_t shard = m.inter * layout.ep_degree() / tp;
      EXPECT_EQ(got.experts, f != "qwen2_moe" && shard % 128 == 0 ? DType::F8E4M3 : DType::F32) << what;
      EXPECT_EQ(got.attention, DType::F8E4M3) << what;
      EXPECT_TRUE(close(got.prefill, want.prefill, 1e-5)) << what;
      expect_bits_equal(got.decode, want.decode, what + " decode");
    }
  }
}

TEST(Fp8Weights, ConvertedAtLoadAsTheStoredCheckpoint) {
  // --weight-dtype fp8 quantises the F32 weights as the FP8 checkpoint was made (whole matrices at TP 1,
  // and whole 128-row experts), so the logits are its bits.
  HfTestModel m = mixtral_fp8_test_model();
  test::TempDir dir("fp8_convert");
  const fs::path f32_dir = dir.path() / "f32", fp8_dir = dir.path() / "fp8";
  fs::create_directories(f32_dir);
  fs::create_directories(fp8_dir);
  write_sharded_checkpoint(f32_dir, m.tensors, 256 * 1024);
  write_sharded_checkpoint(fp8_dir, fp8_quantised(m.tensors, true).stored, 256 * 1024);
  std::ofstream(f32_dir / "config.json") << m.config().dump(2);
  std::ofstream(fp8_dir / "config.json") << fp8_config(m.config()).dump(2);
  const std::vector<int32_t> prompt = vocab_tokens(9, 6, m.vocab);
  const InferenceLayout layout = make_layout(1, 1, false, std::nullopt, static_cast<int>(m.experts));
  const Logits stored = run(fp8_dir, layout, prompt);
  const Logits converted = run(f32_dir, layout, prompt, DType::F8E4M3);
  EXPECT_EQ(converted.experts, DType::F8E4M3);
  expect_bits_equal(converted.prefill, stored.prefill, "prefill");
  expect_bits_equal(converted.decode, stored.decode, "decode");
  // And FP8 is not F32: the unconverted checkpoint's logits differ.
  const Logits f32 = run(f32_dir, layout, prompt);
  EXPECT_NE(std::memcmp(f32.decode.raw(), stored.decode.raw(), f32.decode.nbytes()), 0);
}

void expect_same_tensor(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  EXPECT_EQ(std::memcmp(got.raw(), want.raw(), got.nbytes()), 0) << what;
  ASSERT_EQ(got.block_scales() != nullptr, want.block_scales() != nullptr) << what;
  if (const Tensor* s = got.block_scales()) {
    const Tensor* w = want.block_scales();
    ASSERT_EQ(s->shape(), w->shape()) << what << " scales";
    EXPECT_EQ(std::memcmp(s->raw(), w->raw(), s->nbytes()), 0) << what << " scales";
    EXPECT_EQ(got.block_row0(), want.block_row0()) << what;
    EXPECT_EQ(got.block_col0(), want.block_col0()) << what;
  }
}

TEST(Fp8Weights, ConvertedAtLoadAreTheConversionsOfTheF32Weights) {
  // --weight-dtype converts the rows read from the store (no f32 copy beside them) and each expert's piece
  // where whole 128-row blocks make that the stacked matrix's conversion, else the stack: either way the
  // weights are to_fp8_blocks / to_bf16 of the f32 weights loaded unconverted. Mixtral's 256 intermediate
  // rows at TP 1 and its 128 at TP 2 (gate/up shards of 64 rows: the stack path).
  for (const int64_t inter : {256, 128}) {
    HfTestModel m = mixtral_fp8_test_model(inter);
    test::TempDir dir("fp8_convert_values");
    write_sharded_checkpoint(dir.path(), m.tensors, 256 * 1024);
    std::ofstream(dir.path() / "config.json") << m.config().dump(2);
    const ModelSpec spec = open_model_spec(dir.path());
    const InferenceLayout layout =
        make_layout(inter == 256 ? 1 : 2, 1, false, std::nullopt, static_cast<int>(m.experts));
    auto store = open_store(spec);
    const RankWeights f32 = load_rank_weights(*store, spec, layout, 0, std::nullopt);
    for (const DType dtype : {DType::F8E4M3, DType::BF16}) {
      const RankWeights got = load_rank_weights(*store, spec, layout, 0, dtype);
      auto want = [&](const Tensor& t) {
        return dtype == DType::BF16 ? to_bf16(t, t.category()) : to_fp8_blocks(t, t.category());
      };
      const std::string what = fmt::format("intermediate {} to {}", inter, dtype_name(dtype));
      expect_same_tensor(got.lm_head, want(f32.lm_head), what + " LM head");
      for (size_t l = 0; l < f32.layers.size(); ++l) {
        const LayerWeights& g = got.layers[l];
        const LayerWeights& w = f32.layers[l];
        const std::string layer = fmt::format("{} layer {}", what, l);
        expect_same_tensor(g.attn.wq, want(w.attn.wq), layer + " wq");
        expect_same_tensor(g.attn.wo, want(w.attn.wo), layer + " wo");
        expect_same_tensor(g.experts.w1, want(w.experts.w1), layer + " w1");
        expect_same_tensor(g.experts.w2, want(w.experts.w2), layer + " w2");
      }
    }
  }
}

}  // namespace
}  // namespace expar::infer
