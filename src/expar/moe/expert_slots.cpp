#include "expar/moe/expert_slots.hpp"

#include <cstring>
#include <vector>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"

namespace expar {

namespace {

Shape with_first(const Shape& shape, int64_t first) {
  Shape s = shape;
  s[0] = first;
  return s;
}

}  // namespace

Tensor slot_rows(const ExpertPlacement& placement, int ep_rank, const Tensor& logical, MemCategory category) {
  EXPAR_CHECK(logical.ndim() >= 1 && logical.dim(0) == placement.num_experts(),
              "slot weights: a tensor of {} holds {} experts, expected one entry per logical expert ({})",
              shape_string(logical.shape()), logical.ndim() >= 1 ? logical.dim(0) : 0,
              placement.num_experts());
  const int local = placement.local_count();
  Tensor out = Tensor::empty(with_first(logical.shape(), local), logical.dtype(), category);
  const size_t entry = logical.nbytes() / static_cast<size_t>(placement.num_experts());
  for (int l = 0; l < local; ++l) {
    const int e = placement.global_expert(ep_rank, l);
    std::memcpy(static_cast<std::byte*>(out.raw()) + static_cast<size_t>(l) * entry,
                static_cast<const std::byte*>(logical.raw()) + static_cast<size_t>(e) * entry, entry);
  }
  return out;
}

ExpertWeights slot_expert_weights(const ExpertPlacement& placement, int ep_rank, const ExpertWeights& logical,
                                  MemCategory category) {
  EXPAR_CHECK(!logical.mxfp4,
              "slot weights: MXFP4 experts are stacked by the loader (load the slots' "
              "logical experts, ExpertPlacement::local_experts), not copied from all experts");
  auto copy = [&](const Tensor& t) {
    return t.defined() && t.numel() > 0 ? slot_rows(placement, ep_rank, t, category) : Tensor{};
  };
  ExpertWeights w;
  w.w1 = copy(logical.w1);
  w.w3 = copy(logical.w3);
  w.w2 = copy(logical.w2);
  w.b1 = copy(logical.b1);
  w.b3 = copy(logical.b3);
  w.b2 = copy(logical.b2);
  w.activation = logical.activation;
  return w;
}

Tensor sum_replicas(const ExpertPlacement& placement, std::span<const Tensor> rank_slots) {
  EXPAR_CHECK(rank_slots.size() == static_cast<size_t>(placement.ep_size()),
              "sum of replicas: {} ranks' slot tensors for an EP group of {}", rank_slots.size(),
              placement.ep_size());
  const Tensor& first = rank_slots.front();
  for (const Tensor& t : rank_slots)
    EXPAR_CHECK(t.dtype() == DType::F32 && t.shape() == first.shape() && t.dim(0) == placement.local_count(),
                "sum of replicas: every rank's slot tensor must be f32 {} with {} slots, got {} {}",
                shape_string(first.shape()), placement.local_count(), dtype_name(t.dtype()),
                shape_string(t.shape()));
  const int64_t entry = first.numel() / placement.local_count();
  Tensor out = Tensor::zeros(with_first(first.shape(), placement.num_experts()), DType::F32);
  for (int e = 0; e < placement.num_experts(); ++e) {
    float* dst = out.data<float>() + e * entry;
    const std::vector<int>& slots = placement.expert_slots(e);
    for (size_t i = 0; i < slots.size(); ++i) {
      const Tensor& t = rank_slots[static_cast<size_t>(placement.slot_rank(slots[i]))];
      const float* src = t.data<float>() + placement.slot_local(slots[i]) * entry;
      if (i == 0)
        std::memcpy(dst, src, static_cast<size_t>(entry) * sizeof(float));
      else
        for (int64_t j = 0; j < entry; ++j) dst[j] += src[j];
    }
  }
  return out;
}

ExpertWeights sum_replica_grads(const ExpertPlacement& placement, std::span<const ExpertWeights> rank_grads) {
  auto sum = [&](Tensor ExpertWeights::*which) {
    std::vector<Tensor> parts;
    for (const ExpertWeights& g : rank_grads) parts.push_back(g.*which);
    if (parts.empty() || !parts.front().defined() || parts.front().numel() == 0) return Tensor{};
    return sum_replicas(placement, parts);
  };
  ExpertWeights out;
  out.w1 = sum(&ExpertWeights::w1);
  out.w3 = sum(&ExpertWeights::w3);
  out.w2 = sum(&ExpertWeights::w2);
  out.b1 = sum(&ExpertWeights::b1);
  out.b3 = sum(&ExpertWeights::b3);
  out.b2 = sum(&ExpertWeights::b2);
  if (!rank_grads.empty()) out.activation = rank_grads.front().activation;
  return out;
}

std::vector<bool> first_replica_slots(const ExpertPlacement& placement, int ep_rank) {
  std::vector<bool> first;
  for (int slot : placement.local_slots(ep_rank))
    first.push_back(placement.expert_slots(placement.slot_expert(slot)).front() == slot);
  return first;
}

std::vector<int> first_replica_experts(const ExpertPlacement& placement, int ep_rank) {
  const std::vector<bool> first = first_replica_slots(placement, ep_rank);
  std::vector<int> experts;
  for (int l = 0; l < placement.local_count(); ++l)
    if (first[static_cast<size_t>(l)]) experts.push_back(placement.global_expert(ep_rank, l));
  return experts;
}

}  // namespace expar
