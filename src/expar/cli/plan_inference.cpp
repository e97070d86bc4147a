#include "expar/cli/plan_inference.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "expar/cli/layout_options.hpp"
#include "expar/core/error.hpp"
#include "expar/infer/rank_memory_plan.hpp"
#include "expar/model/config_tensor_store.hpp"
#include "expar/model/hf_config.hpp"

namespace expar::cli {

int run_inference_plan(const InferencePlanArgs& a, const JsonOutput& json) {
  EXPAR_CHECK(!a.model.empty(),
              "--kv-tokens {} asks for an inference plan, which reads a checkpoint's tensor headers: pass "
              "--model with the checkpoint directory",
              a.kv_tokens);
  const infer::ModelSpec spec = infer::open_model_spec(a.model);
  const InferenceLayout layout = infer::inference_layout(a.options, spec.config);
  const std::vector<infer::RankMemoryPlan> plans =
      infer::plan_inference_memory(spec, layout, a.kv_tokens, a.options.weight_dtype);
  // A config.json without weights: the plan assumes the storage the config says.
  std::string assumed;
  if (infer::planned_from_config(spec))
    assumed = stored_weights_of_config(read_hf_config_json(spec.dir), (spec.dir / "config.json").string())
                  .description;
  int64_t process = infer::kInferenceReserveBytes;
  for (const infer::RankMemoryPlan& p : plans) process += p.heap_bytes();
  const int64_t available =
      a.options.memory_limit_bytes > 0 ? a.options.memory_limit_bytes : available_host_memory_bytes();
  std::string fit_error;
  try {
    infer::FitRequest fit;
    fit.spec = &spec;
    fit.options = a.options;
    fit.kv_tokens = a.kv_tokens;
    fit.kv_fix = [](int64_t tokens) {
      return std::optional<std::string>(fmt::format("--kv-tokens {}", tokens));
    };
    infer::check_fits_before_loading(fit);
  } catch (const Error& e) {
    fit_error = e.what();
  }
  if (json.table_wanted()) {
    fmt::print("inference plan: '{}' ({}) on TP {} x DP {}, EP {}, KV cache of {} positions per rank\n",
               spec.dir.string(), infer::model_format_name(spec.format), layout.tp(), layout.dp(),
               ep_label(layout.expert_parallel(), layout.ep_degree(), layout.tp(), layout.dp()), a.kv_tokens);
    if (!assumed.empty())
      fmt::print("planned from config.json alone (no weights in the directory), stored as it says: {}\n",
                 assumed);
    fmt::print("{:>5} {:>8} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}\n", "rank", "experts",
               "f32", "bf16", "f16", "fp8", "mxfp4", "mapped", "KV cache", "heap");
    for (const infer::RankMemoryPlan& p : plans) {
      auto held = [&](WeightFormat f) { return format_bytes(p.held_bytes[static_cast<size_t>(f)]); };
      fmt::print("{:>5} {:>8} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}\n", p.rank,
                 layout.rank_info(p.rank).local_experts.size(), held(WeightFormat::F32),
                 held(WeightFormat::BF16), held(WeightFormat::F16), held(WeightFormat::FP8),
                 held(WeightFormat::MXFP4), format_bytes(p.mapped_bytes), format_bytes(p.kv_bytes()),
                 format_bytes(p.heap_bytes()));
    }
    fmt::print("one process (threads) holds {} with {} kept free for activations; {} available: {}\n",
               format_bytes(process), format_bytes(infer::kInferenceReserveBytes), format_bytes(available),
               fit_error.empty() ? "fits" : "does not fit");
    if (!fit_error.empty()) fmt::print("{}\n", fit_error);
  }
  if (json.wanted()) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const infer::RankMemoryPlan& p : plans) {
      nlohmann::json held = nlohmann::json::object();
      for (size_t f = 0; f < infer::kWeightFormatCount; ++f)
        held[std::string(weight_format_name(static_cast<WeightFormat>(f)))] = p.held_bytes[f];
      ranks.push_back({{"rank", p.rank},
                       {"local_experts", layout.rank_info(p.rank).local_experts.size()},
                       {"held_bytes", held},
                       {"dense_bytes", p.dense_bytes},
                       {"expert_bytes", p.expert_bytes},
                       {"mapped_bytes", p.mapped_bytes},
                       {"kv_bytes_per_token", p.kv_bytes_per_token},
                       {"kv_bytes", p.kv_bytes()},
                       {"heap_bytes", p.heap_bytes()}});
    }
    nlohmann::json j{{"model", spec.dir.string()},
                     {"format", infer::model_format_name(spec.format)},
                     {"tp", layout.tp()},
                     {"dp", layout.dp()},
                     {"ep_degree", layout.ep_degree()},
                     {"kv_tokens", a.kv_tokens},
                     {"ranks", ranks},
                     {"reserve_bytes", infer::kInferenceReserveBytes},
                     {"process_bytes", process},
                     {"available_bytes", available},
                     {"fits", fit_error.empty()}};
    if (!fit_error.empty()) j["refusal"] = fit_error;
    j["planned_from"] = assumed.empty() ? "weights" : "config";
    if (!assumed.empty()) j["assumed_storage"] = assumed;
    json.write(j.dump(2));
  }
  return 0;
}

}  // namespace expar::cli
