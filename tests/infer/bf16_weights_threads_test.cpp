// A BF16 checkpoint in the engine: the embedding, the LM head, the attention projections and the experts are
// held as BF16 (half the bytes of f32) and multiplied as stored (core/weight_view.hpp), the shared expert
// too; norms, router and gates are widened at load. Against the same checkpoint written in F32 with the BF16
// values: decode's logits are the same bits (one-row products give the f32 product's bits), prefill's
// every-row logits within 1e-5 (the LM head in tiles), on one rank, TP 2 and TP 4 with EP: Mixtral, Qwen3-MoE
// with tied embeddings, Qwen-MoE with a gated shared expert.
#include <gtest/gtest.h>

#include "common/temp_dir.hpp"
#include "expar/infer/engine.hpp"
#include "hf_test_models.hpp"

namespace expar::infer {
namespace {

using namespace testing;

struct Logits {
  Tensor prefill, decode;
  bool shared_expert = false;  // rank 0 holds a shared expert shard
};

Logits run(const fs::path& dir, const InferenceLayout& layout, const std::vector<int32_t>& prompt, bool bf16,
           std::optional<DType> weight_dtype = std::nullopt) {
  const ModelSpec spec = open_model_spec(dir);
  MemoryTracker& host = current_tracker();
  Logits out;
  run_ranks(layout.world(), [&](Comm& world) {
    auto store = open_store(spec);
    Engine engine(layout, world, load_rank_weights(*store, spec, layout, world.rank(), weight_dtype));
    const DType held = bf16 ? DType::BF16 : DType::F32;
    EXPECT_EQ(engine.weights().lm_head.dtype(), held);
    // Converted at load: only the weights the products multiply (the embedding is gathered, and stays in
    // the file where it is not the LM head).
    EXPECT_EQ(engine.weights().embed.dtype(),
              weight_dtype && !spec.features.tied_embeddings ? DType::F32 : held);
    const LayerWeights& l0 = engine.weights().layers[0];
    for (const Tensor* t :
         {&l0.attn.wq, &l0.attn.wk, &l0.attn.wv, &l0.attn.wo, &l0.experts.w1, &l0.experts.w3, &l0.experts.w2})
      if (present(*t)) {
        EXPECT_EQ(t->dtype(), held);
      }
    const int id = engine.add_sequence(32);
    const Tensor prefill = engine.prefill(std::vector<int>{id}, {prompt});
    Tensor decode = engine.decode(std::vector<int>{id}, std::vector<int32_t>{prompt[0]});
    const Tensor second = engine.decode(std::vector<int>{id}, std::vector<int32_t>{prompt[1]});
    if (world.rank() == 0) {
      out.shared_expert = present(l0.shared_w1);
      out.prefill = export_to(host, prefill);
      out.decode = export_to(host, second);
    }
  });
  return out;
}

void expect_bits_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << what;
}

TEST(Bf16Weights, TheEngineMultipliesThemAsStored) {
  for (const char* family : {"mixtral", "tied qwen3_moe", "qwen2_moe"}) {
    const std::string f = family;
    HfTestModel m = f == "mixtral"     ? mixtral_test_model()
                    : f == "qwen2_moe" ? qwen_test_model()
                                       : tied_qwen3_moe_test_model();
    test::TempDir dir("bf16_weights");
    const fs::path f32_dir = dir.path() / "f32", bf16_dir = dir.path() / "bf16";
    fs::create_directories(f32_dir);
    fs::create_directories(bf16_dir);
    write_sharded_checkpoint(f32_dir, bf16_rounded(m.tensors, false), 64 * 1024);
    write_sharded_checkpoint(bf16_dir, bf16_rounded(m.tensors, true), 64 * 1024);
    std::ofstream(f32_dir / "config.json") << m.config().dump(2);
    std::ofstream(bf16_dir / "config.json") << m.config().dump(2);
    const std::vector<int32_t> prompt = vocab_tokens(5, 7, m.vocab);
    for (auto [tp, ep_degree] : {std::pair{1, 0}, std::pair{2, 0}, std::pair{4, 2}}) {
      const InferenceLayout layout = make_layout(
          tp, 1, true, ep_degree > 0 ? std::optional(ep_degree) : std::nullopt, static_cast<int>(m.experts));
      const std::string what = fmt::format("{} TP {} EP {}", family, tp, ep_degree);
      const Logits want = run(f32_dir, layout, prompt, false);
      const Logits got = run(bf16_dir, layout, prompt, true);
      EXPECT_EQ(got.shared_expert, f == "qwen2_moe") << what;
      EXPECT_TRUE(close(got.prefill, want.prefill, 1e-5)) << what;
      expect_bits_equal(got.decode, want.decode, what + " decode");
      // The F32 checkpoint converted at load (--weight-dtype bf16): held as BF16, and as its values are
      // BF16's, the same bits as the BF16 checkpoint's.
      const Logits converted = run(f32_dir, layout, prompt, true, DType::BF16);
      expect_bits_equal(converted.prefill, got.prefill, what + " converted prefill");
      expect_bits_equal(converted.decode, got.decode, what + " converted decode");
    }
  }
}

}  // namespace
}  // namespace expar::infer
