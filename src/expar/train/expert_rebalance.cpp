#include "expar/train/expert_rebalance.hpp"

#include <cstring>

#include "expar/core/error.hpp"
#include "expar/core/timer.hpp"
#include "expar/topo/expert_balance.hpp"

namespace expar {

namespace {

// Where new slot (rank, local) takes its values from: that rank's own old slot of the expert when it had
// one, else the expert's first old slot.
struct Source {
  int rank = 0, local = 0;
};

Source source_of(const ExpertPlacement& old, int expert, int rank) {
  for (int s : old.expert_slots(expert))
    if (old.slot_rank(s) == rank) return {rank, old.slot_local(s)};
  const int first = old.expert_slots(expert).front();
  return {old.slot_rank(first), old.slot_local(first)};
}

}  // namespace

ExpertPlacement balanced_placement(const ExpertPlacement& current, const std::vector<double>& loads) {
  ExpertBalanceInput in;
  in.loads = loads;
  in.redundant = current.redundant();
  in.ep_size = current.ep_size();
  return ExpertPlacement::from_balance(balance_experts(in));
}

double placement_imbalance(const ExpertPlacement& placement, const std::vector<double>& loads) {
  std::vector<double> rank_load(static_cast<size_t>(placement.ep_size()), 0.0);
  for (int s = 0; s < placement.num_slots(); ++s) {
    const int e = placement.slot_expert(s);
    rank_load[static_cast<size_t>(placement.slot_rank(s))] +=
        loads.at(static_cast<size_t>(e)) / placement.replica_count(e);
  }
  return load_imbalance(rank_load);
}

ExpertMove move_experts(MoeTransformer& model, AdamW& optimizer, const ExpertPlacement& next, Comm& ep_mp) {
  const ExpertPlacement old = model.first_moe().placement();
  EXPAR_CHECK(
      next.ep_size() == ep_mp.size() && next.num_slots() == old.num_slots() &&
          next.num_experts() == old.num_experts(),
      "moving experts: the new placement has {} experts in {} slots over {} ranks, the model {} in {} "
      "over {}",
      next.num_experts(), next.num_slots(), next.ep_size(), old.num_experts(), old.num_slots(), ep_mp.size());
  const int me = ep_mp.rank(), ranks = ep_mp.size(), local = old.local_count();
  // Every expert tensor's value and Adam moments, viewed as [S_L, per].
  struct Field {
    float* data;
    int64_t per;
  };
  std::vector<Field> fields;
  int64_t width = 0;
  for (size_t i = 0; i < optimizer.params().size(); ++i) {
    Parameter& p = *optimizer.params()[i];
    if (p.kind != ParamKind::Expert) continue;
    AdamW::State& st = optimizer.state()[i];
    EXPAR_CHECK(st.begin == 0 && st.end == p.value.numel(),
                "moving experts: the Adam state of '{}' is sharded over EP_DP (--shard-optimizer), which "
                "--eplb-interval does not move: drop one of the two",
                p.name);
    const int64_t per = p.value.numel() / local;
    for (Tensor* t : {&p.value, &st.m, &st.v}) fields.push_back({t->data<float>(), per});
    width += 3 * per;
  }
  // The plan, the same on every rank: for each rank's new slots, the rank and old slot they come from.
  std::vector<size_t> send_counts(static_cast<size_t>(ranks), 0), recv_counts(static_cast<size_t>(ranks), 0);
  std::vector<std::vector<int>> send_rows(static_cast<size_t>(ranks));  // my old local slots, per destination
  std::vector<Source> mine(static_cast<size_t>(local));
  ExpertMove move;
  for (int r = 0; r < ranks; ++r)
    for (int l = 0; l < local; ++l) {
      const int e = next.global_expert(r, l);
      const Source src = source_of(old, e, r);
      if (old.slot_expert(next.slot(r, l)) != e) ++move.slots_changed;
      if (r == me) mine[static_cast<size_t>(l)] = src;
      if (src.rank == r) continue;  // kept on its rank
      if (src.rank == me) send_rows[static_cast<size_t>(r)].push_back(src.local);
      if (r == me) recv_counts[static_cast<size_t>(src.rank)] += static_cast<size_t>(width);
    }
  size_t send_total = 0, recv_total = 0;
  for (int r = 0; r < ranks; ++r) {
    send_counts[static_cast<size_t>(r)] =
        send_rows[static_cast<size_t>(r)].size() * static_cast<size_t>(width);
    send_total += send_counts[static_cast<size_t>(r)];
    recv_total += recv_counts[static_cast<size_t>(r)];
  }
  Tensor send = Tensor::empty({static_cast<int64_t>(send_total)}, DType::F32, MemCategory::CommScratch);
  Tensor recv_buffer =
      Tensor::empty({static_cast<int64_t>(recv_total)}, DType::F32, MemCategory::CommScratch);
  float* out = send.data<float>();
  for (int r = 0; r < ranks; ++r)
    for (int l : send_rows[static_cast<size_t>(r)])
      for (const Field& f : fields) {
        std::memcpy(out, f.data + l * f.per, static_cast<size_t>(f.per) * sizeof(float));
        out += f.per;
      }
  ep_mp.all_to_all_v(send.raw(), send_counts, recv_buffer.raw(), recv_counts, DType::F32);
  move.bytes_sent = static_cast<int64_t>(send.nbytes());
  const float* recv = recv_buffer.data<float>();
  // The received rows are in (source rank, my new local slot) order; kept rows come from the old values.
  std::vector<size_t> recv_at(static_cast<size_t>(ranks), 0);
  for (int r = 1; r < ranks; ++r)
    recv_at[static_cast<size_t>(r)] =
        recv_at[static_cast<size_t>(r - 1)] + recv_counts[static_cast<size_t>(r - 1)];
  for (const Field& f : fields) {
    const std::vector<float> before(f.data, f.data + local * f.per);  // kept rows may trade places
    for (int l = 0; l < local; ++l)
      if (mine[static_cast<size_t>(l)].rank == me)
        std::memcpy(f.data + l * f.per, before.data() + mine[static_cast<size_t>(l)].local * f.per,
                    static_cast<size_t>(f.per) * sizeof(float));
  }
  for (int l = 0; l < local; ++l) {
    const Source& src = mine[static_cast<size_t>(l)];
    if (src.rank == me) continue;
    const float* row = recv + recv_at[static_cast<size_t>(src.rank)];
    for (const Field& f : fields) {
      std::memcpy(f.data + l * f.per, row, static_cast<size_t>(f.per) * sizeof(float));
      row += f.per;
    }
    recv_at[static_cast<size_t>(src.rank)] += static_cast<size_t>(width);
  }
  model.set_expert_placement(next);
  return move;
}

void ExpertRebalancer::count(const std::vector<int64_t>& routes) {
  if (interval_ == 0) return;
  if (window_.empty()) window_.assign(routes.size(), 0);
  EXPAR_CHECK(window_.size() == routes.size(), "EPLB window: {} route counts after {}", routes.size(),
              window_.size());
  for (size_t i = 0; i < routes.size(); ++i) window_[i] += routes[i];
}

ExpertMove ExpertRebalancer::rebalance(MoeTransformer& model, AdamW& optimizer, Comm& ep_mp, Comm& world) {
  Timer timer;
  world.all_reduce(window_.data(), window_.size(), DType::I64, ReduceOp::Sum);
  const auto e = static_cast<size_t>(model.config().moe.router.num_experts);
  std::vector<double> loads(e, 0.0);
  for (size_t i = 0; i < window_.size(); ++i) loads[i % e] += static_cast<double>(window_[i]);
  window_.assign(window_.size(), 0);
  const ExpertPlacement current = model.first_moe().placement();
  const ExpertPlacement next = balanced_placement(current, loads);
  ExpertMove move;
  bool same = true;
  for (int s = 0; s < current.num_slots(); ++s) same = same && current.slot_expert(s) == next.slot_expert(s);
  if (!same) {
    move = move_experts(model, optimizer, next, ep_mp);
    ep_mp.all_reduce(&move.bytes_sent, 1, DType::I64, ReduceOp::Sum);
  }
  move.imbalance_before = placement_imbalance(current, loads);
  move.imbalance_after = placement_imbalance(next, loads);
  move.seconds = timer.seconds();
  return move;
}

}  // namespace expar
