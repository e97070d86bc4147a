// Moving expert slots between the ranks of an EP group (moe/expert_moves.hpp, issue #36's rebalancing): after
// the move every rank holds, byte for byte, the slot weights the new placement gives it from the logical
// experts (moe/expert_slots.hpp's slot_rows, an independent construction), in f32, BF16 and block-scaled FP8
// (codes and scale grid) with biases, for a move to a placement with replicas and one that only reorders the
// experts; the bytes received are those of the slots that came from other ranks.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "expar/comm/launcher.hpp"
#include "expar/core/rng.hpp"
#include "expar/core/tensor_convert.hpp"
#include "expar/moe/expert_moves.hpp"
#include "expar/moe/expert_slots.hpp"
#include "expar/topo/expert_balance.hpp"

namespace expar {
namespace {

constexpr int kExperts = 6, kRanks = 3, kHidden = 128, kModel = 128;

ExpertPlacement balanced(std::vector<double> loads, int redundant) {
  ExpertBalanceInput in;
  in.loads = std::move(loads);
  in.redundant = redundant;
  in.ep_size = kRanks;
  return ExpertPlacement::from_balance(balance_experts(in));
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Rank `rank`'s FP8 stack under `p`: the slots' codes and their block rows of the logical grid.
Tensor fp8_slots(const ExpertPlacement& p, int rank, const Tensor& codes, const Tensor& grid) {
  Tensor c = slot_rows(p, rank, codes);
  Tensor g = slot_rows(p, rank, grid.reshape({kExperts, kHidden / 128, grid.dim(1)}));
  return c.with_block_scales(g.reshape({p.local_count() * kHidden / 128, grid.dim(1)}));
}

void check_move(const ExpertPlacement& from, const ExpertPlacement& to) {
  Tensor w1 = Tensor::empty({kExperts, kHidden, kModel}), w2 = Tensor::empty({kExperts, kModel, kHidden});
  Tensor b2 = Tensor::empty({kExperts, kModel});
  fill_normal(w1, 1, 0, 1.0f);
  fill_normal(w2, 1, 1, 1.0f);
  fill_normal(b2, 1, 2, 1.0f);
  ExpertWeights logical{w1, w1, w2, {}, {}, b2};
  ExpertWeights logical_bf16{to_bf16(w1, MemCategory::ExpertWeights), to_bf16(w1, MemCategory::ExpertWeights),
                             to_bf16(w2, MemCategory::ExpertWeights)};
  const Tensor fp8 = to_fp8_blocks(w1.reshape({kExperts * kHidden, kModel}), MemCategory::ExpertWeights);
  const Tensor codes = fp8.reshape({kExperts, kHidden, kModel});
  const Tensor& grid = *fp8.block_scales();
  run_ranks(kRanks, [&](Comm& world) {
    const int r = world.rank();
    ExpertMoveStats stats;
    const ExpertWeights moved = move_expert_slots(from, to, slot_expert_weights(from, r, logical), world, &stats);
    const ExpertWeights want = slot_expert_weights(to, r, logical);
    EXPECT_TRUE(same_bytes(moved.w1, want.w1)) << "rank " << r;
    EXPECT_TRUE(same_bytes(moved.w3, want.w3)) << "rank " << r;
    EXPECT_TRUE(same_bytes(moved.w2, want.w2)) << "rank " << r;
    EXPECT_TRUE(same_bytes(moved.b2, want.b2)) << "rank " << r;
    EXPECT_FALSE(moved.b1.defined() && moved.b1.numel() > 0);
    // Received: each slot that no old slot of this rank held, at its bytes (w1, w3, w2, b2).
    int remote = 0;
    const std::vector<int> before = from.local_experts(r);
    for (int e : to.local_experts(r)) remote += std::find(before.begin(), before.end(), e) == before.end();
    EXPECT_EQ(stats.slots_received, remote) << "rank " << r;
    EXPECT_EQ(stats.bytes_received, static_cast<int64_t>(remote) * (3 * kHidden * kModel + kModel) * 4);

    const ExpertWeights bf16 =
        move_expert_slots(from, to, slot_expert_weights(from, r, logical_bf16), world, nullptr);
    EXPECT_TRUE(same_bytes(bf16.w1, slot_rows(to, r, logical_bf16.w1))) << "rank " << r;
    EXPECT_TRUE(same_bytes(bf16.w2, slot_rows(to, r, logical_bf16.w2))) << "rank " << r;

    ExpertWeights held_fp8{fp8_slots(from, r, codes, grid), fp8_slots(from, r, codes, grid),
                           slot_rows(from, r, w2)};
    const ExpertWeights f = move_expert_slots(from, to, held_fp8, world, nullptr);
    const Tensor want_fp8 = fp8_slots(to, r, codes, grid);
    EXPECT_TRUE(same_bytes(f.w1, want_fp8)) << "rank " << r;
    ASSERT_NE(f.w1.block_scales(), nullptr);
    EXPECT_TRUE(same_bytes(*f.w1.block_scales(), *want_fp8.block_scales())) << "rank " << r;
  });
}

TEST(ExpertMoves, ReplicasOfTheHotExpertsMoveIn) {
  const ExpertPlacement from = balanced(std::vector<double>(kExperts, 1.0), 3);
  const ExpertPlacement to = balanced({60, 30, 20, 15, 12, 10}, 3);  // Zipf-like: expert 0 gets replicas
  ASSERT_GT(to.replica_count(0), from.replica_count(0));
  check_move(from, to);
}

TEST(ExpertMoves, APlacementWithoutReplicasReordersTheExperts) {
  const ExpertPlacement from(kExperts, kRanks);
  const ExpertPlacement to = balanced({60, 30, 20, 15, 12, 10}, 0);
  ASSERT_NE(to.local_experts(0), from.local_experts(0));
  check_move(from, to);
}

TEST(ExpertMoves, PlacementsOfAnotherShapeAreRefused) {
  const ExpertPlacement from = balanced(std::vector<double>(kExperts, 1.0), 3);
  const ExpertPlacement to = balanced(std::vector<double>(kExperts, 1.0), 0);
  run_ranks(kRanks, [&](Comm& world) {
    Tensor w = Tensor::zeros({from.local_count(), 4, 4});
    EXPECT_THROW(move_expert_slots(from, to, ExpertWeights{w, w, w}, world), Error);
  });
}

}  // namespace
}  // namespace expar
