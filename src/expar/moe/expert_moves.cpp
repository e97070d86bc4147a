#include "expar/moe/expert_moves.hpp"

#include <cstring>
#include <vector>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"

namespace expar {

namespace {

// Where each of a rank's new slots comes from: its own old local slot, or (rank, old local slot) elsewhere.
struct SlotSource {
  int rank = 0;   // the EP rank that sends it (this rank for a local copy)
  int local = 0;  // its local slot under `from` on that rank
};

SlotSource source_of(const ExpertPlacement& from, const ExpertPlacement& to, int dst, int local) {
  const int e = to.global_expert(dst, local);
  for (int l = 0; l < from.local_count(); ++l)
    if (from.global_expert(dst, l) == e) return {dst, l};
  const std::vector<int>& replicas = from.expert_slots(e);
  const int slot = replicas[static_cast<size_t>((dst + local) % static_cast<int>(replicas.size()))];
  return {from.slot_rank(slot), from.slot_local(slot)};
}

struct MovePlan {
  int me = 0, ranks = 1, slots = 0;
  std::vector<SlotSource> mine;              // [S_L]: the sources of this rank's new slots
  std::vector<std::vector<int>> send_local;  // [dst]: old local slots this rank sends, in dst's slot order
  std::vector<int> receive_count;            // [src]: slots this rank receives from src
};

MovePlan make_plan(const ExpertPlacement& from, const ExpertPlacement& to, int me) {
  MovePlan p;
  p.me = me;
  p.ranks = to.ep_size();
  p.slots = to.local_count();
  p.send_local.resize(static_cast<size_t>(p.ranks));
  p.receive_count.assign(static_cast<size_t>(p.ranks), 0);
  for (int dst = 0; dst < p.ranks; ++dst)
    for (int l = 0; l < p.slots; ++l) {
      const SlotSource s = source_of(from, to, dst, l);
      if (dst == me) p.mine.push_back(s);
      if (s.rank == dst) continue;  // a local copy
      if (s.rank == me) p.send_local[static_cast<size_t>(dst)].push_back(s.local);
      if (dst == me) ++p.receive_count[static_cast<size_t>(s.rank)];
    }
  return p;
}

// The tensor [S_L, ...] of the new slots from `held` [S_L, ...]: entry l is the source's entry (one
// all-to-all of bytes over the group; every rank calls it for the same tensors in the same order).
Tensor move_rows(const Tensor& held, const MovePlan& p, Comm& group, ExpertMoveStats& stats) {
  EXPAR_ASSERT(held.ndim() >= 1 && held.dim(0) == p.slots,
               "expert move: a slot tensor of {} does not hold the {} slots of a rank",
               shape_string(held.shape()), p.slots);
  const size_t entry = held.nbytes() / static_cast<size_t>(p.slots);
  const auto* src = static_cast<const std::byte*>(held.raw());
  std::vector<size_t> send_counts(static_cast<size_t>(p.ranks)), recv_counts(static_cast<size_t>(p.ranks));
  std::vector<std::byte> send, recv;
  for (int dst = 0; dst < p.ranks; ++dst) {
    for (int l : p.send_local[static_cast<size_t>(dst)])
      send.insert(send.end(), src + static_cast<size_t>(l) * entry, src + static_cast<size_t>(l + 1) * entry);
    send_counts[static_cast<size_t>(dst)] = p.send_local[static_cast<size_t>(dst)].size() * entry;
  }
  std::vector<size_t> recv_offset(static_cast<size_t>(p.ranks), 0);
  size_t total = 0;
  for (int s = 0; s < p.ranks; ++s) {
    recv_offset[static_cast<size_t>(s)] = total;
    recv_counts[static_cast<size_t>(s)] =
        static_cast<size_t>(p.receive_count[static_cast<size_t>(s)]) * entry;
    total += recv_counts[static_cast<size_t>(s)];
  }
  recv.resize(total);
  group.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, DType::U8);
  Tensor out = Tensor::empty(held.shape(), held.dtype(), MemCategory::ExpertWeights);
  auto* dst = static_cast<std::byte*>(out.raw());
  std::vector<size_t> taken(static_cast<size_t>(p.ranks), 0);
  for (int l = 0; l < p.slots; ++l) {
    const SlotSource& s = p.mine[static_cast<size_t>(l)];
    const std::byte* from = s.rank == p.me ? src + static_cast<size_t>(s.local) * entry
                                           : recv.data() + recv_offset[static_cast<size_t>(s.rank)] +
                                                 taken[static_cast<size_t>(s.rank)]++ * entry;
    std::memcpy(dst + static_cast<size_t>(l) * entry, from, entry);
  }
  stats.bytes_received += static_cast<int64_t>(total);
  return out;
}

// A matrix stack with its block scales (FP8: the grid's rows are the slots' blocks, stacked like them).
Tensor move_weight(const Tensor& held, const MovePlan& p, Comm& group, ExpertMoveStats& stats) {
  if (!held.defined() || held.numel() == 0) return held;
  Tensor moved = move_rows(held, p, group, stats);
  if (const Tensor* scales = held.block_scales()) {
    EXPAR_ASSERT(scales->dim(0) % p.slots == 0 && held.block_row0() == 0,
                 "expert move: an FP8 stack's scale grid of {} rows does not split over its {} slots",
                 scales->dim(0), p.slots);
    Tensor grid = move_rows(*scales, p, group, stats);
    moved = moved.with_block_scales(std::move(grid), 0, held.block_col0());
  }
  return moved;
}

}  // namespace

ExpertWeights move_expert_slots(const ExpertPlacement& from, const ExpertPlacement& to,
                                const ExpertWeights& held, Comm& ep_group, ExpertMoveStats* stats) {
  EXPAR_CHECK(
      from.num_experts() == to.num_experts() && from.ep_size() == to.ep_size() &&
          from.num_slots() == to.num_slots() && to.ep_size() == ep_group.size(),
      "expert move: from {} experts in {} slots over {} ranks to {} in {} over {}, on a group of {}: the "
      "placements must differ only in where the slots are",
      from.num_experts(), from.num_slots(), from.ep_size(), to.num_experts(), to.num_slots(), to.ep_size(),
      ep_group.size());
  EXPAR_CHECK(
      !held.bf16_products(),
      "expert move: experts with BF16 product copies (training) are refreshed from their masters, not "
      "moved");
  const MovePlan plan = make_plan(from, to, ep_group.rank());
  ExpertMoveStats local;
  ExpertWeights w;
  w.activation = held.activation;
  w.w1 = move_weight(held.w1, plan, ep_group, local);
  w.w3 = move_weight(held.w3, plan, ep_group, local);
  w.w2 = move_weight(held.w2, plan, ep_group, local);
  w.b1 = move_weight(held.b1, plan, ep_group, local);
  w.b3 = move_weight(held.b3, plan, ep_group, local);
  w.b2 = move_weight(held.b2, plan, ep_group, local);
  if (held.mxfp4) {
    const Mxfp4Experts& m = *held.mxfp4;
    w.mxfp4 = std::make_shared<const Mxfp4Experts>(Mxfp4Experts{
        move_rows(m.gate_up_blocks, plan, ep_group, local),
        move_rows(m.gate_up_scales, plan, ep_group, local), move_rows(m.down_blocks, plan, ep_group, local),
        move_rows(m.down_scales, plan, ep_group, local), m.i0, m.i1});
  }
  for (const SlotSource& s : plan.mine) local.slots_received += s.rank != plan.me ? 1 : 0;
  if (stats) {
    stats->bytes_received += local.bytes_received;
    stats->slots_received += local.slots_received;
  }
  return w;
}

}  // namespace expar
