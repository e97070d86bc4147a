// `expar layer`'s function: a small input written with the io writer, run through two EP paths and the local
// reference, outputs read back and compared.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>

#include "common/close.hpp"
#include "common/random_tensor.hpp"
#include "common/temp_dir.hpp"
#include "expar/core/error.hpp"
#include "expar/io/safetensors_file.hpp"
#include "expar/io/safetensors_writer.hpp"
#include "expar/model/layer_tool.hpp"

namespace expar {
namespace {

constexpr int kExperts = 4;
constexpr int64_t kD = 6, kH = 10, kTokens = 11;

using test::randn;

std::map<std::string, Tensor> small_input(bool with_grad_y) {
  std::map<std::string, Tensor> in;
  in["x"] = randn({kTokens, kD}, 1, 1.0f);
  in["gate.weight"] = randn({kExperts, kD}, 2, 0.5f);
  for (int e = 0; e < kExperts; ++e) {
    const std::string p = "experts." + std::to_string(e) + ".";
    in[p + "w1.weight"] = randn({kH, kD}, 10 + 3 * static_cast<uint64_t>(e), 0.4f);
    in[p + "w3.weight"] = randn({kH, kD}, 11 + 3 * static_cast<uint64_t>(e), 0.4f);
    in[p + "w2.weight"] = randn({kD, kH}, 12 + 3 * static_cast<uint64_t>(e), 0.3f);
  }
  if (with_grad_y) in["grad_y"] = randn({kTokens, kD}, 3, 1.0f);
  Tensor split = Tensor::empty({2}, DType::I64);
  split.data<int64_t>()[0] = 8;  // uneven: 8 + 3
  split.data<int64_t>()[1] = 3;
  in["tokens_per_rank"] = split;
  return in;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(LayerTool, BlockAndRowwiseFilesAgreeWithEachOtherAndWithTheLocalReference) {
  const test::TempDir dir("layer_tool");
  const auto input = dir / "in.safetensors";
  write_safetensors(input, small_input(true));

  LayerToolOptions options;
  options.ranks = 2;
  options.ep = 2;
  options.top_k = 2;
  options.path = "block";
  run_layer_tool_file(input, dir / "block.safetensors", options);
  options.path = "rowwise";
  run_layer_tool_file(input, dir / "rowwise.safetensors", options);
  // expar layer --waves 2 --wave-overlap: the same bits as no waves.
  LayerToolOptions waves = options;
  waves.waves = {2, true};
  run_layer_tool_file(input, dir / "rowwise_waves.safetensors", waves);
  // The reference: one rank, the local path, over the same tokens (dropless, so the same routes).
  LayerToolOptions local = options;
  local.ranks = 1;
  local.ep = 1;
  local.path = "local";
  auto in = small_input(true);
  in.erase("tokens_per_rank");
  write_safetensors(dir / "in_one_rank.safetensors", in);
  run_layer_tool_file(dir / "in_one_rank.safetensors", dir / "local.safetensors", local);

  const SafetensorsFile block = SafetensorsFile::open(dir / "block.safetensors");
  const SafetensorsFile rowwise = SafetensorsFile::open(dir / "rowwise.safetensors");
  const SafetensorsFile ref = SafetensorsFile::open(dir / "local.safetensors");
  const SafetensorsFile overlapped = SafetensorsFile::open(dir / "rowwise_waves.safetensors");
  EXPECT_EQ(block.metadata().at("path"), "block");
  EXPECT_EQ(overlapped.metadata().at("waves"), "2 overlapped");
  std::vector<std::string> float_outputs{"y", "grad_x", "topk_weight", "grad.gate.weight"};
  for (int e = 0; e < kExperts; ++e)
    for (const char* w : {"w1", "w2", "w3"})
      float_outputs.push_back("grad.experts." + std::to_string(e) + "." + w + ".weight");
  ASSERT_EQ(block.names(), rowwise.names());
  for (const auto& name : float_outputs) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(block.contains(name));
    const Tensor b = block.read(name), r = rowwise.read(name), l = ref.read(name);
    EXPECT_TRUE(same_bits(b, r)) << "block and rowwise must be bit-identical";
    EXPECT_TRUE(same_bits(overlapped.read(name), r)) << "two overlapped waves must give the no-wave bits";
    // f32 rounding of another summation order: 1e-5 of the element, absolute 1e-5 below 1.
    EXPECT_TRUE(test::close(b, l, test::Tolerance::relative(1e-5, 1.0)));
    double norm = 0;
    for (float v : b.span<float>()) norm += std::abs(v);
    EXPECT_GT(norm, 0.0) << "an all-zero output would hide a broken path";
  }
  EXPECT_TRUE(same_bits(block.read("topk_idx"), ref.read("topk_idx")));
  EXPECT_EQ(block.read("metrics.dropped").data<int64_t>()[0], 0);
  EXPECT_EQ(block.read("metrics.drop_rate").data<double>()[0], 0.0);
}

TEST(LayerTool, CapacityDropsAreReportedAndGradYDefaultsToOnes) {
  auto in = small_input(false);
  LayerToolOptions options;
  options.ranks = 2;
  options.ep = 2;
  options.top_k = 2;
  options.path = "rowwise";
  options.capacity_factor = 0.5;
  options.capacity_policy = "source";
  const auto out = run_layer_tool(in, options);
  const auto block_opts = [&] {
    auto o = options;
    o.path = "block";
    return o;
  }();
  const auto block = run_layer_tool(in, block_opts);
  int64_t dropped_routes = 0;
  for (int32_t v : out.at("route_dropped").span<int32_t>()) dropped_routes += v;
  const int64_t reported =
      out.at("metrics.dropped").data<int64_t>()[0] + out.at("metrics.dropped").data<int64_t>()[1];
  EXPECT_GT(dropped_routes, 0);
  EXPECT_EQ(dropped_routes, reported);
  EXPECT_GT(out.at("metrics.drop_rate").data<double>()[0], 0.0);
  EXPECT_TRUE(same_bits(out.at("route_dropped"), block.at("route_dropped")));
  EXPECT_TRUE(same_bits(out.at("y"), block.at("y")));
  EXPECT_TRUE(same_bits(out.at("grad_x"), block.at("grad_x")));
  // grad_y = ones: the router-weight gradient equals the one with an explicit ones tensor.
  Tensor ones = Tensor::empty({kTokens, kD});
  ones.fill(1.0f);
  in["grad_y"] = ones;
  EXPECT_TRUE(same_bits(run_layer_tool(in, options).at("grad.gate.weight"), out.at("grad.gate.weight")));
}

TEST(LayerTool, BadInputsNameTheProblem) {
  auto in = small_input(true);
  LayerToolOptions options;
  options.ranks = 2;
  options.ep = 2;
  options.path = "block";
  in["tokens_per_rank"].data<int64_t>()[1] = 4;  // 8 + 4 != 11
  try {
    run_layer_tool(in, options);
    ADD_FAILURE() << "a wrong token split must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokens_per_rank"), std::string::npos) << e.what();
  }
  in = small_input(true);
  in.erase("experts.3.w2.weight");
  try {
    run_layer_tool(in, options);
    ADD_FAILURE() << "a missing expert weight must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("experts.3.w2.weight"), std::string::npos) << e.what();
  }
  in = small_input(true);
  options.ep = 3;  // does not divide 2 ranks
  EXPECT_THROW(run_layer_tool(in, options), Error);
}

}  // namespace
}  // namespace expar
