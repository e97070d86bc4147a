// gpt-oss MXFP4 experts dequantised at load (infer/mxfp4_store.hpp): a random gpt-oss checkpoint whose
// gate_up_proj / down_proj are stored as _blocks / _scales (with quantization_config mxfp4) runs like the
// dense double reference over the weights the blocks encode (decoded here with a table of its own), on one
// rank and on EP / TP layouts.
#include <gtest/gtest.h>

#include "core/expect_error.hpp"
#include "expar/infer/engine.hpp"
#include "expar/infer/mxfp4_store.hpp"
#include "hf_test_models.hpp"

namespace expar::infer {
namespace {

using namespace testing;
using expar::testing::expect_error;

// Quantised form of one stacked matrix [E, in, out]: blocks U8 [E, out, in/32, 16], scales U8 [E, out,
// in/32], random; `dense` receives the [E, in, out] values they encode.
struct Quantised {
  Tensor blocks, scales, dense;
};

Quantised random_mxfp4(int64_t experts, int64_t in, int64_t out, uint64_t stream) {
  static const float kTable[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  const int64_t groups = in / 32;
  Quantised q;
  q.blocks = Tensor::empty({experts, out, groups, 16}, DType::U8);
  q.scales = Tensor::empty({experts, out, groups}, DType::U8);
  q.dense = Tensor::empty({experts, in, out});
  auto* b = static_cast<uint8_t*>(q.blocks.raw());
  auto* s = static_cast<uint8_t*>(q.scales.raw());
  for (int64_t i = 0; i < q.blocks.numel(); ++i)
    b[i] = static_cast<uint8_t>(random_u32(5, stream, 2 * i) & 0xff);
  for (int64_t i = 0; i < q.scales.numel(); ++i)
    s[i] = static_cast<uint8_t>(121 + random_u32(5, stream, 2 * i + 1) % 3);  // 2^-6 .. 2^-4
  float* d = q.dense.data<float>();
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t r = 0; r < out; ++r)
      for (int64_t c = 0; c < in; ++c) {
        const int64_t block = (e * out + r) * groups + c / 32;
        const uint8_t byte = b[block * 16 + (c % 32) / 2];
        const uint8_t code = c % 2 == 0 ? byte & 0x0f : byte >> 4;
        d[(e * in + c) * out + r] = kTable[code] * std::pow(2.0f, static_cast<float>(s[block]) - 127.0f);
      }
  return q;
}

TEST(Mxfp4, Fp4CodesDecodeToTheE2m1Values) {
  EXPECT_EQ(fp4_e2m1_value(0x0), 0.0f);
  EXPECT_EQ(fp4_e2m1_value(0x3), 1.5f);
  EXPECT_EQ(fp4_e2m1_value(0x7), 6.0f);
  EXPECT_EQ(fp4_e2m1_value(0xB), -1.5f);
  EXPECT_EQ(fp4_e2m1_value(0xF), -6.0f);
}

TEST(Mxfp4, QuantisedGptOssExpertsMatchTheDenseReference) {
  HfTestModel m = gpt_oss_test_model(64, 32);
  std::map<std::string, Tensor> file = m.tensors;
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = m.layer(l) + "mlp.experts.";
    const Quantised gu = random_mxfp4(m.experts, m.d, 2 * m.inter, 100 + l);
    const Quantised dn = random_mxfp4(m.experts, m.inter, m.d, 200 + l);
    m.tensors[p + "gate_up_proj"] = gu.dense;  // what the reference computes with
    m.tensors[p + "down_proj"] = dn.dense;
    file.erase(p + "gate_up_proj");
    file.erase(p + "down_proj");
    file[p + "gate_up_proj_blocks"] = gu.blocks;
    file[p + "gate_up_proj_scales"] = gu.scales;
    file[p + "down_proj_blocks"] = dn.blocks;
    file[p + "down_proj_scales"] = dn.scales;
  }
  const fs::path dir = temp_dir("mxfp4");
  write_sharded_checkpoint(dir, file, 64 * 1024);
  nlohmann::json j = m.config();
  j["quantization_config"] = {{"quant_method", "mxfp4"},
                              {"modules_to_not_convert", {"model.layers.*.self_attn", "lm_head"}}};
  std::ofstream(dir / "config.json") << j.dump(2);
  const ModelSpec spec = open_model_spec(dir);
  const std::vector<int32_t> prompt = vocab_tokens(9, 8, m.vocab);
  const Tensor dense = m.dense_logits(prompt);
  MemoryTracker& host = current_tracker();
  Tensor single;
  for (auto [tp, ep_degree] : {std::pair{1, 0}, std::pair{2, 0}, std::pair{4, 2}}) {
    const InferenceLayout layout = make_layout(
        tp, 1, true, ep_degree > 0 ? std::optional(ep_degree) : std::nullopt, spec.config.moe.num_experts);
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
        const InferenceLayout layout = make_layout(1, 1, false, std::nullopt, spec.config.moe.num_experts);
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
