#pragma once
// `expar layer`: one MoE layer, forward and backward, from tensors in a safetensors file, with every output
// and gradient written to another: the tool to check expar's paths against any other framework.
//
// Input tensors (f32 unless noted; Hugging Face Mixtral naming):
//   x                     [N, d]   all ranks' tokens stacked rank-major
//   gate.weight           [E, d]   router
//   experts.{e}.w1.weight [h, d]   gate projection
//   experts.{e}.w3.weight [h, d]   up projection
//   experts.{e}.w2.weight [d, h]   down projection
//   grad_y                [N, d]   optional (ones when absent)
//   tokens_per_rank       I64 [ranks], optional (an equal split when absent)
// Output tensors:
//   y, grad_x [N, d]; grad.gate.weight and grad.experts.{e}.w{1,2,3}.weight (the gradient of the sum over
//   all ranks' tokens: router gradients summed over every rank, expert gradients over the EP_DP replicas
//   that hold the expert, as data parallelism would); topk_idx I32 [N, K]; topk_weight [N, K];
//   route_dropped I32 [N, K] (1 where the capacity policy dropped the route); metrics.dropped I64 [ranks];
//   metrics.drop_rate F64 [1] (mean over ranks of dropped / (T_r·K)); metrics.utilisation F64 [1] (max over
//   EP groups of received rows / capacity rows).
// The ranks are threads (run_ranks); EP groups are the EP_MP groups of the training layout (ranks, ep).
#include <filesystem>
#include <map>
#include <string>

#include "expar/core/tensor.hpp"
#include "expar/moe/payload_precision.hpp"
#include "expar/moe/waves.hpp"

namespace expar {

struct LayerToolOptions {
  int ranks = 1;
  int ep = 1;              // M_E; D_E = ranks / ep
  int ranks_per_node = 0;  // emulated nodes (LaunchOptions::ranks_per_node; 0: one node)
  std::string path = "local";
  int top_k = 2;
  std::string score = "softmax";  // softmax | sigmoid
  bool renormalize = false;
  double capacity_factor = 0.0;            // 0: dropless
  std::string capacity_policy = "source";  // source | rank | expert (with a capacity factor)
  PayloadPrecision precision;              // of the four row movements (block, rowwise, aggregated)
  WaveConfig waves;                        // the experts' wave schedule (block and rowwise)
};

// In memory: inputs by name -> outputs by name. Throws expar::Error for missing or misshapen tensors.
std::map<std::string, Tensor> run_layer_tool(const std::map<std::string, Tensor>& inputs,
                                             const LayerToolOptions& options);

// Reads `input`, runs, writes `output` (safetensors, with the options as metadata).
void run_layer_tool_file(const std::filesystem::path& input, const std::filesystem::path& output,
                         const LayerToolOptions& options);

}  // namespace expar
