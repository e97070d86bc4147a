// `--precision bf16` in the engine (EngineOptions::precision, core/product_precision.hpp): on tiny BF16, FP8
// and MXFP4 checkpoints the logits of prefill and of two decode steps are those of the same checkpoint at f32
// precision within 2 % of their largest magnitude (each product's activations rounded by at most 2^-9
// relative, through two layers of attention and experts and the LM head; the runs below stay well inside),
// on TP 1, TP 2, TP 2 with EP and TP 4 with EP 2; they are not its bits (the rounding happens) unless every
// weight is held F32, whose products stay f32 (the same bits); greedy tokens are the same wherever the f32
// logits' margin between their best two exceeds twice the largest difference seen; and with serve's batch
// invariance a sequence's decode logits are the same bits alone and in a batch of two.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "common/temp_dir.hpp"
#include "expar/core/matmul.hpp"
#include "expar/infer/engine.hpp"
#include "hf_test_models.hpp"

namespace expar::infer {
namespace {

using namespace testing;

constexpr double kTolerance = 0.02;  // of the largest |logit|

struct Logits {
  Tensor prefill, decode;
  bool narrow = false;  // some weight the products multiply is held narrow (else all are F32)
};

Logits run(const fs::path& dir, const InferenceLayout& layout, const std::vector<int32_t>& prompt,
           ProductPrecision precision) {
  const ModelSpec spec = open_model_spec(dir);
  MemoryTracker& host = current_tracker();
  Logits out;
  run_ranks(layout.world(), [&](Comm& world) {
    auto store = open_store(spec);
    EngineOptions options;
    options.precision = precision;
    Engine engine(layout, world, load_rank_weights(*store, spec, layout, world.rank()), options);
    const int id = engine.add_sequence(32);
    const Tensor prefill = engine.prefill(std::vector<int>{id}, {prompt});
    const Tensor first = engine.decode(std::vector<int>{id}, std::vector<int32_t>{prompt[0]});
    const Tensor second = engine.decode(std::vector<int>{id}, std::vector<int32_t>{prompt[1]});
    if (world.rank() == 0) {
      out.prefill = export_to(host, prefill);
      Tensor decode = Tensor::empty({2, first.dim(1)});
      std::copy_n(first.data<float>(), first.dim(1), decode.data<float>());
      std::copy_n(second.data<float>(), first.dim(1), decode.data<float>() + first.dim(1));
      out.decode = export_to(host, decode);  // made under this rank's tracker, which run_ranks ends
      const LayerWeights& l = engine.weights().layers[0];
      out.narrow = l.experts.mxfp4 != nullptr || l.experts.w1.dtype() != DType::F32 ||
                   l.attn.wq.dtype() != DType::F32 || engine.weights().lm_head.dtype() != DType::F32;
    }
  });
  return out;
}

double max_difference(const Tensor& a, const Tensor& b) {
  double d = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i)
    d = std::max(d, std::fabs(static_cast<double>(a.data<float>()[i]) - b.data<float>()[i]));
  return d;
}

// Each row's arg-max equal wherever want's best two logits are more than `margin` apart; returns the rows
// checked.
int64_t expect_same_greedy_tokens(const Tensor& got, const Tensor& want, double margin,
                                  const std::string& what) {
  int64_t checked = 0;
  const int64_t v = want.dim(1);
  for (int64_t r = 0; r < want.dim(0); ++r) {
    const float* w = want.data<float>() + r * v;
    std::vector<float> sorted(w, w + v);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    if (sorted[0] - sorted[1] <= margin) continue;
    ++checked;
    EXPECT_EQ(argmax_row(got, r), argmax_row(want, r)) << what << " row " << r;
  }
  return checked;
}

struct Checkpoint {
  std::string name;
  fs::path dir;
  int experts;
  int vocab;
};

class Bf16Precision : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir("bf16_precision");
    HfTestModel mixtral = mixtral_fp8_test_model();
    const fs::path bf16 = dir_->path() / "bf16", fp8 = dir_->path() / "fp8", mxfp4 = dir_->path() / "mxfp4";
    for (const fs::path& p : {bf16, fp8, mxfp4}) fs::create_directories(p);
    write_sharded_checkpoint(bf16, bf16_rounded(mixtral.tensors, true), 256 * 1024);
    std::ofstream(bf16 / "config.json") << mixtral.config().dump(2);
    write_sharded_checkpoint(fp8, fp8_quantised(mixtral.tensors).stored, 256 * 1024);
    std::ofstream(fp8 / "config.json") << fp8_config(mixtral.config()).dump(2);
    HfTestModel gpt = gpt_oss_test_model(64, 32);
    write_sharded_checkpoint(mxfp4, quantise_gpt_oss_experts(gpt), 64 * 1024);
    std::ofstream(mxfp4 / "config.json") << mxfp4_config(gpt).dump(2);
    checkpoints_ = {{"bf16", bf16, static_cast<int>(mixtral.experts), static_cast<int>(mixtral.vocab)},
                    {"fp8", fp8, static_cast<int>(mixtral.experts), static_cast<int>(mixtral.vocab)},
                    {"mxfp4", mxfp4, static_cast<int>(gpt.experts), static_cast<int>(gpt.vocab)}};
  }
  static void TearDownTestSuite() { delete dir_; }
  void SetUp() override {
    if (!bf16_native())
      GTEST_SKIP() << "--precision bf16 is refused without BF16 dot products; oneDNN runs "
                   << dnnl_isa_name();
  }
  static test::TempDir* dir_;
  static std::vector<Checkpoint> checkpoints_;
};
test::TempDir* Bf16Precision::dir_ = nullptr;
std::vector<Checkpoint> Bf16Precision::checkpoints_;

TEST_F(Bf16Precision, LogitsAreTheF32PrecisionsWithinTheirToleranceOnEveryLayout) {
  for (const Checkpoint& c : checkpoints_) {
    const std::vector<int32_t> prompt = vocab_tokens(5, 7, c.vocab);
    int64_t greedy_rows = 0;
    for (auto [tp, ep, ep_degree] :
         {std::tuple{1, false, 0}, std::tuple{2, false, 0}, std::tuple{2, true, 0}, std::tuple{4, true, 2}}) {
      const InferenceLayout layout =
          make_layout(tp, 1, ep, ep_degree > 0 ? std::optional(ep_degree) : std::nullopt, c.experts);
      const std::string what = fmt::format("{} TP {} EP {}", c.name, tp, layout.ep_degree());
      const Logits want = run(c.dir, layout, prompt, ProductPrecision::F32);
      const Logits got = run(c.dir, layout, prompt, ProductPrecision::BF16);
      EXPECT_TRUE(close(got.prefill, want.prefill, kTolerance)) << what << " prefill";
      EXPECT_TRUE(close(got.decode, want.decode, kTolerance)) << what << " decode";
      // Where every weight is F32 (gpt-oss's MXFP4 experts widened at load where a shard cuts a block) the
      // products stay f32: the same bits.
      EXPECT_EQ(std::memcmp(got.decode.raw(), want.decode.raw(), got.decode.nbytes()) == 0, !got.narrow)
          << what << (got.narrow ? ": BF16 precision gave f32's bits" : ": F32 weights' products changed");
      const double margin =
          2 * std::max(max_difference(got.prefill, want.prefill), max_difference(got.decode, want.decode));
      greedy_rows += expect_same_greedy_tokens(got.prefill, want.prefill, margin, what + " prefill");
      greedy_rows += expect_same_greedy_tokens(got.decode, want.decode, margin, what + " decode");
    }
    EXPECT_GT(greedy_rows, 0) << c.name << ": no row's margin allowed a greedy check";
  }
}

TEST_F(Bf16Precision, ADecodeRowsBitsDoNotDependOnItsBatchUnderBatchInvariance) {
  for (const Checkpoint& c : checkpoints_) {
    const std::vector<int32_t> a = vocab_tokens(6, 5, c.vocab), b = vocab_tokens(7, 9, c.vocab);
    const InferenceLayout layout = make_layout(2, 1, true, std::nullopt, c.experts);
    const ModelSpec spec = open_model_spec(c.dir);
    MemoryTracker& host = current_tracker();
    Tensor alone, batched;
    for (const bool batch : {false, true})
      run_ranks(layout.world(), [&](Comm& world) {
        set_matmul_min_rows(batch_invariant_rows());
        auto store = open_store(spec);
        EngineOptions options;
        options.precision = ProductPrecision::BF16;
        Engine engine(layout, world, load_rank_weights(*store, spec, layout, world.rank()), options);
        std::vector<int> ids{engine.add_sequence(32)};
        engine.prefill(ids, {a});
        std::vector<int32_t> next{a[0]};
        if (batch) {
          ids.push_back(engine.add_sequence(32));
          engine.prefill(std::vector<int>{ids[1]}, {b});
          next.push_back(b[0]);
        }
        const Tensor logits = engine.decode(ids, next);
        if (world.rank() == 0) (batch ? batched : alone) = export_to(host, logits);
        set_matmul_min_rows(0);
      });
    ASSERT_EQ(batched.dim(0), 2);
    EXPECT_EQ(std::memcmp(alone.raw(), batched.raw(), alone.nbytes()), 0)
        << c.name << ": the first sequence's decode logits changed with its batch";
  }
}

}  // namespace
}  // namespace expar::infer
