#include "expar/cli/layout_options.hpp"

#include <fmt/format.h>

#include <cmath>

#include "expar/cli/option_checks.hpp"
#include "expar/core/product_precision.hpp"
#include "expar/infer/engine.hpp"
#include "expar/infer/rank_weights.hpp"
#include "expar/topo/placement.hpp"

namespace expar::cli {

void add_layout_options(CLI::App* cmd, LayoutArgs& a, bool with_decode_moe) {
  cmd->add_option("--tp", a.tp, "Tensor-parallel degree (ranks per DP replica)")
      ->capture_default_str()
      ->check(integer_in(1, 256));
  cmd->add_option("--dp", a.dp, "Data-parallel replicas")->capture_default_str()->check(integer_in(1, 256));
  cmd->add_flag("--enable-expert-parallel", a.enable_expert_parallel,
                "MoE layers assign whole experts to ranks (EP, seed 002); default: every expert sharded on "
                "the intermediate dimension over TP");
  cmd->add_option(
         "--ep", a.ep,
         "EP degree (0: TP*DP with --enable-expert-parallel, else 1; > 1 needs "
         "--enable-expert-parallel; < TP: variable EP+TP; g*TP with g dividing DP: EP groups of g DP "
         "replicas)")
      ->capture_default_str()
      ->check(integer_in(0, 65536));
  cmd->add_option("--placement", a.placement, "Expert placement: " + choices(placement_names()))
      ->capture_default_str()
      ->check(one_of(placement_names()));
  cmd->add_option("--redundant-experts", a.redundant_experts,
                  "R extra expert slots (S = experts + R, a multiple of the EP degree) holding replicas of "
                  "experts, placed by DeepSeek's EPLB policy (needs --enable-expert-parallel)")
      ->capture_default_str()
      ->check(integer_in(0, 1 << 20));
  if (with_decode_moe)
    cmd->add_option("--decode-moe", a.decode_moe,
                    "Decode MoE pattern: " + choices(infer::decode_moe_names()) +
                        " (allreduce: every rank runs its experts on every token, seed 002; rowwise: rows to "
                        "their experts' owners, whole experts only: ep_degree a multiple of TP)")
        ->capture_default_str()
        ->check(one_of(infer::decode_moe_names()));
  cmd->add_option("--threads", a.threads, "Compute threads per rank (0: cores / ranks)")
      ->capture_default_str()
      ->check(integer_in(0, 1024));
  cmd->add_flag("--oversubscribe", a.oversubscribe, "Allow ranks x threads above the cores");
  cmd->add_option("--memory-limit-gib", a.memory_limit_gib,
                  "Memory this process may hold (weights, KV cache, 1 GiB for the rest), checked before "
                  "loading (0: what the machine has available)")
      ->capture_default_str()
      ->check(finite_in(0, 1 << 24));
  cmd->add_option("--weight-dtype", a.weight_dtype,
                  "Convert the F32 weights the products multiply at load: " +
                      choices(infer::weight_dtype_names()) + " (default: every weight as stored)")
      ->check(one_of(infer::weight_dtype_names()));
  // train's flag and meaning (BF16 operands, f32 accumulation); here over the weights as held.
  cmd->add_option("--precision", a.precision,
                  "The products: " + choices(product_precision_names()) +
                      " (bf16: activations rounded to BF16 for the products over BF16, F16, FP8 and MXFP4 "
                      "weights, the weights' values exact, f32 sums; BF16 weights on the CPU's BF16 dot "
                      "products; F32 weights keep f32 products: --weight-dtype bf16 makes them BF16; refused "
                      "on CPUs without BF16 dot products)")
      ->capture_default_str()
      ->check(one_of(product_precision_names()));
}

infer::GenerateOptions engine_options(const LayoutArgs& a) {
  infer::GenerateOptions o;
  o.tp = a.tp;
  o.dp = a.dp;
  o.enable_expert_parallel = a.enable_expert_parallel;
  if (a.ep > 0) o.ep_degree = a.ep;
  o.placement = placement_from_name(a.placement);
  o.redundant_experts = a.redundant_experts;
  o.decode_moe = infer::decode_moe_from_name(a.decode_moe);
  o.compute_threads = threads_per_rank(a.threads, a.tp * a.dp, a.oversubscribe);
  o.memory_limit_bytes = std::llround(a.memory_limit_gib * 0x1p30);
  if (!a.weight_dtype.empty()) o.weight_dtype = infer::weight_dtype_from_name(a.weight_dtype);
  o.precision = product_precision_from_name(a.precision);
  check_product_precision(o.precision);
  return o;
}

std::string ep_label(bool expert_parallel, int ep_degree, int tp, int dp) {
  if (!expert_parallel) return "off";
  if (ep_degree == 1)
    return tp == 1 ? "1 (each DP replica holds every expert)"
                   : "1 (each DP replica holds every expert, sharded over TP)";
  if (ep_degree < tp) return fmt::format("{} (variable: EP+TP)", ep_degree);
  if (ep_degree == tp * dp) return fmt::format("{} (full)", ep_degree);
  if (ep_degree == tp) return fmt::format("{} (full inside each DP replica)", ep_degree);
  return fmt::format("{} (partial cross-DP: EP groups of {} DP replicas)", ep_degree, ep_degree / tp);
}

}  // namespace expar::cli
