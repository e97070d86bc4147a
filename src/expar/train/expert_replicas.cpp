#include "expar/train/expert_replicas.hpp"

#include <cstring>
#include <string>

#include "expar/core/error.hpp"
#include "expar/topo/expert_balance.hpp"
#include "expar/topo/training_layout.hpp"

namespace expar {

namespace {

bool layout_accepts(int world, int ep, int cp, int slots) {
  TrainingLayoutConfig lc{world, ep, cp};
  lc.num_experts = slots;
  return !training_layout_refusal(lc);
}

}  // namespace

void check_redundant_experts(int num_experts, int redundant, int ep, int world, int cp) {
  EXPAR_CHECK(redundant >= 0, "--redundant-experts {} must not be negative: pass 0 (no replicas) or more",
              redundant);
  const int slots = num_experts + redundant;
  if (slots % ep == 0 || !layout_accepts(world, ep, cp, 0)) return;
  // The nearest R on either side that M_E divides, and the M_E that divide these slots.
  const int up = redundant + (ep - slots % ep), down = redundant - slots % ep;
  const std::string values = down >= 0 ? fmt::format("{} or {}", down, up) : fmt::format("{}", up);
  std::vector<int> eps;
  for (int m = 1; m <= world; ++m)
    if (layout_accepts(world, m, cp, slots)) eps.push_back(m);
  fail(
      "--redundant-experts {} gives S = {} experts + {} = {} expert slots, which the EP_MP degree M_E={} "
      "(--ep) does not divide: every rank holds S/M_E slots; pass --redundant-experts {} (E + R a multiple "
      "of {}){}",
      redundant, num_experts, redundant, slots, ep, values, ep,
      eps.empty() ? std::string() : fmt::format(", or --ep in {{{}}}", fmt::join(eps, ",")));
}

std::vector<int> training_expert_slots(int num_experts, int redundant, int ep_size) {
  if (redundant == 0) return {};
  ExpertBalanceInput in;
  in.loads.assign(static_cast<size_t>(num_experts), 1.0);
  in.redundant = redundant;
  in.ep_size = ep_size;
  const ExpertBalance balance = balance_experts(in);
  std::vector<int> table;
  for (const PhysicalSlot& s : balance.slots) table.push_back(s.expert);
  return table;
}

void sum_replica_gradients(std::span<Parameter* const> params, const ExpertPlacement& placement,
                           Comm& ep_mp) {
  if (!placement.has_replicas()) return;
  EXPAR_CHECK(ep_mp.size() == placement.ep_size(),
              "replica gradients: the EP_MP group has {} ranks but the placement spans {}", ep_mp.size(),
              placement.ep_size());
  // The slots of replicated experts in ascending order: slots are rank-major, so each rank's are one
  // contiguous run of it, which is how all_gather_v lays out what the ranks send.
  const int me = ep_mp.rank(), local = placement.local_count();
  std::vector<int> gathered_row(static_cast<size_t>(placement.num_slots()), -1);
  std::vector<size_t> rank_rows(static_cast<size_t>(placement.ep_size()), 0);
  int rows = 0;
  for (int s = 0; s < placement.num_slots(); ++s)
    if (placement.replica_count(placement.slot_expert(s)) > 1) {
      gathered_row[static_cast<size_t>(s)] = rows++;
      ++rank_rows[static_cast<size_t>(placement.slot_rank(s))];
    }
  for (Parameter* p : params) {
    if (p->kind != ParamKind::Expert) continue;
    EXPAR_CHECK(p->grad.dtype() == DType::F32 && p->grad.ndim() >= 1 && p->grad.dim(0) == local,
                "replica gradients: '{}' is {} {}, not f32 with {} local slots", p->name,
                dtype_name(p->grad.dtype()), shape_string(p->grad.shape()), local);
    const int64_t per = p->grad.numel() / local;
    const auto row_bytes = static_cast<size_t>(per) * sizeof(float);
    float* grad = p->grad.data<float>();
    Tensor send = Tensor::empty({static_cast<int64_t>(rank_rows[static_cast<size_t>(me)]) * per}, DType::F32,
                                MemCategory::CommScratch);
    Tensor all = Tensor::empty({rows * per}, DType::F32, MemCategory::CommScratch);
    size_t sent = 0;
    for (int l = 0; l < local; ++l)
      if (gathered_row[static_cast<size_t>(placement.slot(me, l))] >= 0)
        std::memcpy(send.data<float>() + static_cast<int64_t>(sent++) * per, grad + l * per, row_bytes);
    std::vector<size_t> counts;
    for (size_t n : rank_rows) counts.push_back(n * static_cast<size_t>(per));
    ep_mp.all_gather_v(send.raw(), static_cast<size_t>(send.numel()), all.raw(), counts, DType::F32);
    for (int l = 0; l < local; ++l) {
      const std::vector<int>& slots = placement.expert_slots(placement.global_expert(me, l));
      if (slots.size() == 1) continue;
      float* dst = grad + l * per;
      for (size_t i = 0; i < slots.size(); ++i) {
        const float* src = all.data<float>() + gathered_row[static_cast<size_t>(slots[i])] * per;
        if (i == 0)
          std::memcpy(dst, src, row_bytes);
        else
          for (int64_t j = 0; j < per; ++j) dst[j] += src[j];
      }
    }
  }
}

}  // namespace expar
