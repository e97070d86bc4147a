// gpt-oss MXFP4 experts: a random gpt-oss checkpoint whose gate_up_proj / down_proj are stored as _blocks /
// _scales (with quantization_config mxfp4) runs like the dense double reference over the weights the blocks
// encode (decoded here with a table of its own), on one rank and on EP / TP layouts: held as MXFP4 and
// multiplied as stored where a rank's shard covers whole blocks, dequantised at load
// (model/mxfp4_store.hpp) where it does not.
#include <gtest/gtest.h>

#include "core/expect_error.hpp"
#include "expar/core/convert.hpp"
#include "expar/infer/engine.hpp"
#include "expar/model/mxfp4_store.hpp"
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
      // Held as stored where the rank's intermediate shard covers whole 32-value blocks (inter 32: whole
      // experts), widened to f32 where it does not (TP 4 with EP 2: shards of 16).
      EXPECT_EQ(engine.weights().layers[0].experts.mxfp4 != nullptr, ep_degree == 0) << "TP " << tp;
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

TEST(Mxfp4, HeldAsStoredDecodesTheBitsOfTheDequantisedCheckpoint) {
  // The same experts written dequantised (F32, gpt-oss's dense layout) and as MXFP4: one-row products read
  // the blocks to the exact values, so decode's logits are the same bits; prefill's within 1e-5.
  // An intermediate of 64: whole experts with EP, and TP 2 without EP holds a shard of 32 rows of each.
  HfTestModel m = gpt_oss_test_model(64, 64);
  std::map<std::string, Tensor> quantised = quantise_gpt_oss_experts(m);
  const fs::path dir = test::run_temp_dir("mxfp4_as_stored");
  const fs::path q_dir = dir / "mxfp4", f_dir = dir / "f32";
  fs::create_directories(q_dir);
  fs::create_directories(f_dir);
  write_sharded_checkpoint(q_dir, quantised, 64 * 1024);
  std::ofstream(q_dir / "config.json") << mxfp4_config(m).dump(2);
  m.write(f_dir);
  const std::vector<int32_t> prompt = vocab_tokens(11, 9, m.vocab);
  MemoryTracker& host = current_tracker();
  for (const auto& [tp, ep] : {std::pair{1, true}, std::pair{2, true}, std::pair{2, false}}) {
    const InferenceLayout layout = make_layout(tp, 1, ep, std::nullopt, static_cast<int>(m.experts));
    Tensor prefill[2], decode[2];
    int64_t expert_bytes[2] = {0, 0};
    for (int q = 0; q < 2; ++q) {
      const ModelSpec spec = open_model_spec(q ? q_dir : f_dir);
      run_ranks(layout.world(), [&](Comm& world) {
        auto store = open_store(spec);
        Engine engine(layout, world, load_rank_weights(*store, spec, layout, world.rank()));
        const int id = engine.add_sequence(16);
        const Tensor p = engine.prefill(std::vector<int>{id}, {prompt});
        engine.decode(std::vector<int>{id}, std::vector<int32_t>{prompt[0]});
        const Tensor d = engine.decode(std::vector<int>{id}, std::vector<int32_t>{prompt[1]});
        if (world.rank() == 0) {
          prefill[q] = export_to(host, p);
          decode[q] = export_to(host, d);
          expert_bytes[q] = engine.weights().layers[0].experts.bytes();
          EXPECT_EQ(engine.weights().layers[0].experts.mxfp4 != nullptr, q == 1);
        }
      });
    }
    EXPECT_TRUE(close(prefill[1], prefill[0], 1e-5)) << "TP " << tp << " EP " << ep;
    ASSERT_EQ(decode[1].shape(), decode[0].shape());
    EXPECT_EQ(std::memcmp(decode[1].raw(), decode[0].raw(), decode[0].nbytes()), 0)
        << "TP " << tp << " EP " << ep;
    // Held as stored: about a seventh of the f32 bytes (4.25 bits a weight against 32, the f32 biases aside).
    EXPECT_LT(expert_bytes[1] * 5, expert_bytes[0]) << expert_bytes[1] << " against " << expert_bytes[0];
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace expar::infer
