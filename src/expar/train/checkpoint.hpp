#pragma once
// Checkpoints: a directory of safetensors files plus a JSON manifest.
//   dense.safetensors            every dense parameter (and its Adam moments), written once by world rank 0
//   experts-<m>.safetensors      the routed experts owned by EP_MP rank m, one tensor per global expert
//                                ("layers.L.moe.experts.<e>.w1" [h, d], ...), written once per EP_DP group
//                                (by its member with ep_dp coordinate 0)
//   manifest.json                model config, layout, step, seed, which file holds which expert
// Every tensor is stored under its global name, so loading reshards to any layout: a rank reads the dense
// file and, from the expert files, only the rows of its own experts (zero-copy through mmap).
#include <string>

#include "expar/comm/comm.hpp"
#include "expar/model/moe_transformer.hpp"
#include "expar/train/adamw.hpp"

namespace expar {

struct CheckpointInfo {
  int64_t step = 0;  // optimizer steps completed
  uint64_t seed = 0;
  ModelConfig model;
  int ep = 1;
  int world = 1;
};

// Collective over `world`. ep_mp / ep_dp are this rank's expert groups; `optimizer` may be null.
void save_checkpoint(const std::string& dir, const CheckpointInfo& info, MoeTransformer& model,
                     AdamW* optimizer, Comm& world, Comm& ep_mp, Comm& ep_dp);

// Reads manifest.json (model config, step, ...). Throws expar::Error naming the directory if it is missing.
CheckpointInfo read_checkpoint_info(const std::string& dir);

// Loads weights (and the optimizer state when `optimizer` is not null) into `model`, whatever the layout it
// was saved with. Not collective: each rank reads what it needs.
void load_checkpoint(const std::string& dir, MoeTransformer& model, AdamW* optimizer);

}  // namespace expar
