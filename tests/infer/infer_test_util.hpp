#pragma once
// Helpers for the inference tests: a small random MoE transformer written as an expar checkpoint (the
// trainer's format: dense.safetensors, experts-<m>.safetensors, manifest.json) and single-rank references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/close.hpp"
#include "common/temp_dir.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/memory.hpp"
#include "expar/core/rng.hpp"
#include "expar/infer/generate.hpp"
#include "expar/io/safetensors_writer.hpp"
#include "expar/model/model_config_json.hpp"
#include "expar/model/moe_transformer.hpp"
#include "expar/topo/inference_layout.hpp"

namespace expar::infer::testing {

namespace fs = std::filesystem;

// A layout of the inference engine (seed 002) from its knobs.
inline InferenceLayout make_layout(int tp, int dp, bool ep, std::optional<int> ep_degree, int num_experts,
                                   PlacementKind placement = PlacementKind::Contiguous,
                                   int redundant_experts = 0) {
  GenerateOptions o;
  o.tp = tp;
  o.dp = dp;
  o.enable_expert_parallel = ep;
  o.ep_degree = ep_degree;
  o.placement = placement;
  o.redundant_experts = redundant_experts;
  ModelConfig c;
  c.moe.router.num_experts = num_experts;
  return inference_layout(o, c);
}

// Heads divisible by TP 1..4, experts by every full-EP degree of TP 1..4 x DP 1..2, intermediate by every
// EP_TP size.
inline ModelConfig test_config() {
  ModelConfig c = ModelConfig::preset("tiny");
  c.model_dim = 48;
  c.layers = 2;
  c.heads = 12;
  c.kv_heads = 12;
  c.head_dim = 8;
  c.max_seq = 32;
  c.shared_expert_hidden = 12;
  c.moe.router.num_experts = 24;
  c.moe.router.top_k = 3;
  c.moe.hidden_dim = 12;
  c.moe.router.renormalize = true;
  c.moe.router.aux_loss_coef = 0.0;
  c.moe.router.z_loss_coef = 0.0;
  return c;
}

// Writes model's weights as an expar checkpoint with experts split over `expert_files` files (contiguous).
inline void write_expar_checkpoint(const fs::path& dir, MoeTransformer& model, int expert_files) {
  const ModelConfig& c = model.config();
  std::map<std::string, Tensor> dense;
  std::vector<std::map<std::string, Tensor>> experts(static_cast<size_t>(expert_files));
  const int per_file = c.moe.router.num_experts / expert_files;
  for (Parameter& p : model.parameters()) {
    if (p.kind != ParamKind::Expert) {
      dense[p.name] = p.value;
      continue;
    }
    const auto dot = p.name.rfind('.');
    for (int e = 0; e < c.moe.router.num_experts; ++e) {
      Shape s(p.value.shape().begin() + 1, p.value.shape().end());
      experts[static_cast<size_t>(e / per_file)][p.name.substr(0, dot) + "." + std::to_string(e) +
                                                 p.name.substr(dot)] = p.value.rows(e, e + 1).reshape(s);
    }
  }
  // Auxiliary-loss-free balancing's selection bias is no parameter: saved beside them, as training does.
  for (int l = 0; l < c.layers; ++l) {
    const Tensor& bias = model.moe(l).params().score_bias;
    if (bias.defined() && bias.numel() > 0) dense["layers." + std::to_string(l) + ".moe.score_bias"] = bias;
  }
  write_safetensors(dir / "dense.safetensors", dense);
  nlohmann::json files = nlohmann::json::object();
  for (int m = 0; m < expert_files; ++m) {
    const std::string name = "experts-" + std::to_string(m) + ".safetensors";
    write_safetensors(dir / name, experts[static_cast<size_t>(m)]);
    std::vector<int> ids;
    for (int e = m * per_file; e < (m + 1) * per_file; ++e) ids.push_back(e);
    files[name] = ids;
  }
  nlohmann::json model_json = model_config_to_json(c);
  nlohmann::json manifest{{"format", "expar-checkpoint-1"},
                          {"step", 0},
                          {"seed", 0},
                          {"world", 1},
                          {"ep", expert_files},
                          {"placement", "contiguous"},
                          {"model", model_json},
                          {"dense_file", "dense.safetensors"},
                          {"expert_files", files}};
  std::ofstream(dir / "manifest.json") << manifest.dump(2) << "\n";
}

// A random test_config() model (initialised from `seed`) written as an expar checkpoint with its experts in
// `expert_files` files, in a fresh directory of this run tagged `tag`.
inline fs::path write_test_checkpoint(std::string_view tag, uint64_t seed, int expert_files) {
  fs::path dir = test::run_temp_dir(tag);
  run_ranks(1, [&](Comm& world) {
    auto group = world.split(0, 0, "ep");
    MoeTransformer model(test_config(), {}, *group);
    model.init(seed);
    write_expar_checkpoint(dir, model, expert_files);
  });
  return dir;
}

// A rank's tensors are charged to its tracker, which ends with run_ranks: what a rank hands back to the test
// thread is cloned under the test thread's tracker (`host`, read with current_tracker() before run_ranks).
inline Tensor export_to(MemoryTracker& host, const Tensor& t) {
  TrackerBinding bind(host);
  return t.clone();
}

// The single-rank reference of greedy decoding: the model's logits over `prompt`, then `steps` greedy tokens,
// each step recomputing the whole sequence (no cache), every tensor cloned under `host` (export_to).
struct ReferenceDecode {
  Tensor prefill_logits;              // [prompt len, V]
  std::vector<int32_t> greedy;        // steps + 1 tokens: the prefill's, then one per step
  std::vector<Tensor> decode_logits;  // [1, V] after feeding greedy[i]
};
inline ReferenceDecode reference_decode(MoeTransformer& model, std::vector<int32_t> seq, int steps,
                                        MemoryTracker& host) {
  ReferenceDecode r;
  Tensor logits = model.logits(seq, 1, static_cast<int64_t>(seq.size()));
  r.prefill_logits = export_to(host, logits);
  for (int i = 0; i <= steps; ++i) {
    r.greedy.push_back(argmax_row(logits, logits.dim(0) - 1));
    if (i == steps) break;
    seq.push_back(r.greedy.back());
    logits = model.logits(seq, 1, static_cast<int64_t>(seq.size()));
    r.decode_logits.push_back(export_to(host, logits.rows(logits.dim(0) - 1, logits.dim(0))));
  }
  return r;
}

inline std::vector<int32_t> random_tokens(uint64_t stream, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = static_cast<int32_t>(random_u32(77, stream, static_cast<uint64_t>(i)) % 256);
  return v;
}

// Logits and weights against their references: max |a - b| <= rtol * max |b| over the whole tensor (every
// element judged on the tensor's scale; rtol 0: the same values).
inline ::testing::AssertionResult close(const Tensor& a, const Tensor& b, double rtol = 1e-5) {
  return test::close(a, b, test::Tolerance::relative_to_largest(rtol));
}

}  // namespace expar::infer::testing
