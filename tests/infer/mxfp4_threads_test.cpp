// gpt-oss MXFP4 experts dequantised at load (infer/mxfp4_store.hpp): a random gpt-oss checkpoint whose
// gate_up_proj / down_proj are stored as _blocks / _scales (with quantization_config mxfp4) runs like the
// dense double reference over the weights the blocks encode (decoded here with a table of its own), on one
// rank and on EP / TP layouts.
#include <gtest/gtest.h>

#include "core/expect_error.hpp"
#include "expar/core/convert.hpp"
#include "expar/infer/engine.hpp"
#include "expar/infer/mxfp4_store.hpp"
#include "hf_test_models.hpp"

namespace expar::infer {
namespace {

using namespace testing;
using expar::testing::expect_error;

TEST(Mxfp4, Fp4CodesDecodeToTheE2m1Values) {
  EXPECT_EQ(e2m1_to_f32(0x0), 0.0f);
  EXPECT_EQ(e2m1_to_f32(0x3), 1.5f);
  EXPECT_EQ(e2m1_to_f32(0x7), 6.0f);
  EXPECT_EQ(e2m1_to_f32(0xB), -1.5f);
  EXPECT_EQ(e2m1_to_f32(0xF), -6.0f);
}

TEST(Mxfp4, QuantisedGptOssExpertsMatchTheDenseReference) {
  HfTestModel m = gpt_oss_test_model(64, 32);
  std::map<std::string, Tensor> file = quantise_gpt_oss_experts(m);
  const fs::path dir = test::run_temp_dir("mxfp4");
  write_sharded_checkpoint(dir, file, 64 * 1024);
  std::ofstream(dir / "config.json") << mxfp4_config(m).dump(2);
  const ModelSpec spec = open_model_spec(dir);
  const std::vector<int32_t> prompt = vocab_tokens(9, 8, m.vocab);
  const Tensor dense = m.dense_logits(prompt);
  MemoryTracker& host = current_tracker();
  Tensor single;
  for (auto [tp, ep_degree] : {std::pair{1, 0}, std::pair{2, 0}, std::pair{4, 2}}) {
    const InferenceLayout layout =
        make_layout(tp, 1, true, ep_degree > 0 ? std::optional(ep_degree) : std::nullopt,
                    spec.config.moe.router.num_experts);
    run_ranks(layout.world(), [&](Comm& world) {
      auto store = open_store(spec);
      Engine engine(layout, world, load_rank_weights(*store, spec, layout, world.rank()));
      const int id = engine.add_sequence(16);
      const Tensor logits = engine.prefill(std::vector<int>{id}, {prompt});
      EXPECT_TRUE(close(logits, dense, 1e-4)) << "TP " << tp << " rank " << world.rank();
      if (tp == 1) single = export_to(host, logits);
      if (tp > 1) {
        EXPECT_TRUE(close(logits, single)) << "TP " << tp << " rank " << world.rank();
      }
    });
  }
  // The experts matter: the reference with the blocks decoded wrongly (nibbles swapped) differs.
  HfTestModel swapped = m;
  for (int l = 0; l < m.layers; ++l) {
    Tensor& g = swapped.tensors[m.layer(l) + "mlp.experts.gate_up_proj"];
    g = g.clone();
    float* v = g.data<float>();
    for (int64_t e = 0; e < m.experts; ++e)
      for (int64_t c = 0; c + 1 < m.d; c += 2)
        for (int64_t r = 0; r < 2 * m.inter; ++r)
          std::swap(v[(e * m.d + c) * 2 * m.inter + r], v[(e * m.d + c + 1) * 2 * m.inter + r]);
  }
  EXPECT_FALSE(close(swapped.dense_logits(prompt), dense, 1e-3));
  // Blocks of the wrong shape are refused by name.
  file[m.layer(0) + "mlp.experts.down_proj_scales"] = Tensor::zeros({m.experts, m.d, 2}, DType::U8);
  write_sharded_checkpoint(dir, file, 64 * 1024);
  expect_error(
      [&] {
        const InferenceLayout layout =
            make_layout(1, 1, false, std::nullopt, spec.config.moe.router.num_experts);
        run_ranks(1, [&](Comm& world) {
          auto store = open_store(spec);
          load_rank_weights(*store, spec, layout, world.rank());
        });
      },
      {"down_proj_scales", "MXFP4"});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace expar::infer
