#pragma once
// Expert-parallel weight loading (seed 002, "Weight Loading"): a base loader produces this rank's piece of
// ONE expert's matrix (whole, or TP-sharded on the intermediate dimension: gate/up rows, down columns), and
// expert_parallel_weight_loader wraps it to keep only this rank's experts, stacked [E_L, ...]. Base loaders
// copy from zero-copy views of the mapped files, so only the bytes of the rank's experts (and, for a row
// shard, only the shard's rows) are read.
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "expar/core/memory.hpp"
#include "expar/core/tensor.hpp"
#include "expar/model/tensor_store.hpp"

namespace expar {

// A zero-copy 2-D view of global expert e's matrix, in the file's dtype.
using ExpertView = std::function<Tensor(int expert)>;
// Checkpoints with one tensor per expert (ours, Mixtral, Qwen-MoE): name(e) must be 2-D.
ExpertView per_expert_view(const TensorStore& store, std::function<std::string(int)> name);
// Checkpoints with all experts stacked in one tensor [E, a, b] (gpt-oss): expert e is rows [e, e+1), viewed
// [a, b]; a stacked bias [E, b] gives [1, b].
ExpertView stacked_expert_view(const TensorStore& store, std::string name);

// This rank's f32 piece of one expert's matrix.
using ExpertLoader = std::function<Tensor(int expert)>;
// The whole matrix.
ExpertLoader identity_loader(ExpertView view);
// Rows [begin, end) of [a, b]: the gate/up (w1/w3 [h, d]) intermediate shard; transpose gives [b, n].
ExpertLoader rows_loader(ExpertView view, int64_t begin, int64_t end, bool transpose = false);
// Columns offset + stride·j for j in [begin, end) of [a, b]: the down (w2 [d, h]) intermediate shard; stride
// 2 with offset 0/1 picks gpt-oss's interleaved gate/up columns; transpose gives [n, a].
ExpertLoader columns_loader(ExpertView view, int64_t begin, int64_t end, int64_t stride = 1,
                            int64_t offset = 0, bool transpose = false);

// The same as rows_loader and columns_loader (no transpose, stride 1), but an F32, BF16 or F16 expert keeps
// its dtype (the engine multiplies it as stored: core/weight_view.hpp); any other dtype is widened to f32.
ExpertLoader rows_loader_as_stored(ExpertView view, int64_t begin, int64_t end);
ExpertLoader columns_loader_as_stored(ExpertView view, int64_t begin, int64_t end);

// Stacks base(e) for every e of local_experts (in that order): [E_L, ...base shape] in the pieces' dtype,
// charged to MemCategory::ExpertWeights. Every piece must have the same shape and dtype.
Tensor expert_parallel_weight_loader(std::span<const int> local_experts, const ExpertLoader& base);

// Dense helpers: a whole tensor, rows [begin, end) of the first dimension, or columns [begin, end) of a 2-D
// tensor, as one f32 copy (MemCategory::DenseWeights) after which the mapped pages read are given back
// (TensorStore::release_rows), so file pages and copies do not both stay resident. Copied although F32 rows
// of a mapped file could be used in place: every decode step streams these weights whole, and copies of
// 8 MiB and more sit in transparent huge pages (core/host_allocator), which the file's pages are not; with
// the copies `expar generate` decoded faster in every alternated round (docs/performance_history.md, "Huge
// pages and m = 1 products dealt in chunks").
Tensor load_dense(const TensorStore& store, const std::string& name);
Tensor load_rows(const TensorStore& store, const std::string& name, int64_t begin, int64_t end);
Tensor load_columns(const TensorStore& store, const std::string& name, int64_t begin, int64_t end);
// The same as load_rows, map_rows and load_columns, but an F32, BF16 or F16 tensor keeps its dtype (the
// engine multiplies it as stored: core/weight_view.hpp); any other dtype is widened to f32.
Tensor load_rows_as_stored(const TensorStore& store, const std::string& name, int64_t begin, int64_t end);
Tensor load_columns_as_stored(const TensorStore& store, const std::string& name, int64_t begin, int64_t end);
Tensor map_rows_as_stored(const TensorStore& store, const std::string& name, int64_t begin, int64_t end);
// Rows that a step gathers a few of (the embedding table, one row per token): stored as F32 in a mapped
// file they are a view onto the mapping (charged to MemCategory::MappedWeights; the view keeps the mapping
// alive), so only the rows the tokens touch become resident; anything else is load_rows's copy.
Tensor map_rows(const TensorStore& store, const std::string& name, int64_t begin, int64_t end);

}  // namespace expar
