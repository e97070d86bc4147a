// Activation recomputation of the MoE blocks of the transformer (seed 000 §5.7, Figures 21 and 22): two
// ranks, the rowwise path with the model's shared heap and lease pool, three blocks, and the microbatch
// schedule F1 F2 B2 B1 (two forwards in flight, as under pipeline parallelism). With every block, one
// block or no block recomputed, every parameter gradient and the losses are bit-identical; the pool shows
// one dispatch lease per block and microbatch in flight for the blocks that keep their payload and none for
// the recomputed ones; and the tracker's resident symmetric bytes shrink accordingly.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "expar/comm/launcher.hpp"
#include "expar/core/memory.hpp"
#include "expar/core/rng.hpp"
#include "expar/model/moe_transformer.hpp"

namespace expar {
namespace {

constexpr int kLayers = 3;
constexpr int64_t kBatch = 2, kSeq = 8;

ModelConfig model_config() {
  ModelConfig c = ModelConfig::preset("tiny");
  c.layers = kLayers;
  return c;
}

ModelExecution execution_of(std::vector<int> recompute) {
  ModelExecution e;
  e.moe.path = "rowwise";
  e.recompute_moe_layers = std::move(recompute);
  return e;
}

std::vector<int32_t> bytes_of(int rank, int microbatch, uint64_t stream) {
  std::vector<int32_t> v(static_cast<size_t>(kBatch * kSeq));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<int32_t>(
        random_u32(31, stream * 16 + static_cast<uint64_t>(rank * 4 + microbatch), static_cast<uint64_t>(i)) %
        256);
  return v;
}

struct ModelRun {
  std::vector<std::vector<float>> grads;  // every parameter, in parameters() order
  double loss[2] = {0, 0};
  int leased_after_forwards = 0, high_water = 0, slot_count = 0, scratch_count = 0;
  size_t slot_bytes = 0, pool_resident = 0;
  int64_t symmetric_bytes = 0;  // tracked SymmetricBuffers bytes the model holds after the step
};

ModelRun run_schedule(Comm& world, const std::vector<int>& recompute) {
  const int64_t before = current_tracker().snapshot().current_of(MemCategory::SymmetricBuffers);
  ModelRun r;
  MoeTransformer model(model_config(), execution_of(recompute), world, kBatch * kSeq);
  for (int l = 0; l < kLayers; ++l) {
    const bool listed = std::find(recompute.begin(), recompute.end(), l) != recompute.end();
    EXPECT_EQ(model.recomputes_moe(l), listed) << "block " << l;
  }
  model.init(11);
  model.zero_grads();
  const int64_t normalizer = 2 * kBatch * kSeq;
  MoeTransformer::Pending first = model.forward_train(bytes_of(world.rank(), 1, 1),
                                                      bytes_of(world.rank(), 1, 2), kBatch, kSeq, normalizer);
  MoeTransformer::Pending second = model.forward_train(
      bytes_of(world.rank(), 2, 1), bytes_of(world.rank(), 2, 2), kBatch, kSeq, normalizer);
  const LeasePool* pool = model.lease_pool();
  EXPECT_NE(pool, nullptr) << "rowwise with max_microbatch_tokens shares one pool over the blocks";
  if (pool == nullptr) return r;
  r.leased_after_forwards = pool->leased_count();
  r.loss[1] = model.backward(second).loss;
  r.loss[0] = model.backward(first).loss;
  EXPECT_TRUE(first.done());
  EXPECT_THROW(model.backward(first), Error) << "a second backward of the same microbatch";
  EXPECT_EQ(pool->leased_count(), 0);
  r.high_water = pool->high_water();
  r.slot_count = pool->slot_count();
  r.scratch_count = pool->scratch_count();
  r.slot_bytes = pool->slot_bytes();
  r.pool_resident = pool->resident_bytes();
  r.symmetric_bytes = current_tracker().snapshot().current_of(MemCategory::SymmetricBuffers) - before;
  for (Parameter& p : model.parameters())
    r.grads.emplace_back(p.grad.data<float>(), p.grad.data<float>() + p.grad.numel());
  return r;
}

TEST(MoeTransformerRecompute, F1F2B2B1GradientsAreBitIdenticalAndRecomputedBlocksTakeNoLease) {
  LaunchOptions launch;
  launch.ranks = 2;
  launch.timeout_seconds = 120;
  run_ranks(launch, [](Comm& world) {
    const ModelRun kept = run_schedule(world, {});
    const ModelRun all = run_schedule(world, {0, 1, 2});
    const ModelRun middle = run_schedule(world, {1});
    ASSERT_FALSE(kept.grads.empty());
    for (const ModelRun* r : {&all, &middle}) {
      ASSERT_EQ(r->grads.size(), kept.grads.size());
      for (size_t i = 0; i < kept.grads.size(); ++i)
        EXPECT_EQ(r->grads[i], kept.grads[i]) << "parameter " << i << " rank " << world.rank();
      EXPECT_EQ(r->loss[0], kept.loss[0]);
      EXPECT_EQ(r->loss[1], kept.loss[1]);
    }
    bool any_nonzero = false;
    for (const auto& g : kept.grads)
      for (float v : g) any_nonzero |= v != 0.0f;
    EXPECT_TRUE(any_nonzero);

    // Without recomputation: a leased dispatch slot per block and microbatch in flight (3 x 2), plus the
    // expert-input-gradient lease inside one block's backward; one scratch slot (expert output).
    EXPECT_EQ(kept.leased_after_forwards, kLayers * 2);
    EXPECT_EQ(kept.high_water, kLayers * 2 + 1);
    EXPECT_EQ(kept.slot_count, kLayers * 2 + 1);
    EXPECT_EQ(kept.scratch_count, 1);
    // Every block recomputed: no dispatch lease at all; the only lease is the short gradient one. The
    // payloads use the second (dispatch) scratch slot, shared by every block and microbatch.
    EXPECT_EQ(all.leased_after_forwards, 0);
    EXPECT_EQ(all.high_water, 1);
    EXPECT_EQ(all.slot_count, 1);
    EXPECT_EQ(all.scratch_count, 2);
    // Block 1 recomputed: blocks 0 and 2 keep their leases.
    EXPECT_EQ(middle.leased_after_forwards, 2 * 2);
    EXPECT_EQ(middle.high_water, 2 * 2 + 1);
    EXPECT_EQ(middle.slot_count, 2 * 2 + 1);
    EXPECT_EQ(middle.scratch_count, 2);

    // The memory accounting sees the pool's resident slots and nothing else of the heap.
    for (const ModelRun* r : {&kept, &all, &middle}) {
      EXPECT_EQ(r->pool_resident, r->slot_bytes * static_cast<size_t>(r->slot_count + r->scratch_count));
      EXPECT_EQ(r->symmetric_bytes, static_cast<int64_t>(r->pool_resident));
    }
    EXPECT_EQ(kept.symmetric_bytes - all.symmetric_bytes,
              static_cast<int64_t>(kept.slot_bytes) * ((kLayers * 2 + 1 + 1) - (1 + 2)));
    EXPECT_LT(middle.symmetric_bytes, kept.symmetric_bytes);
    EXPECT_GT(middle.symmetric_bytes, all.symmetric_bytes);
  });
}

TEST(MoeTransformerRecompute, ExecutionRejectsBlocksThatDoNotExistOrRepeat) {
  const ModelConfig model = model_config();
  ModelExecution c = execution_of({0, 3});
  try {
    c.validate(model, 1);
    ADD_FAILURE() << "block 3 of a 3-block model was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block 3"), std::string::npos) << e.what();
  }
  c.recompute_moe_layers = {1, 1};
  EXPECT_THROW(c.validate(model, 1), Error);
  c.recompute_moe_layers = {2, 0};
  EXPECT_NO_THROW(c.validate(model, 1));
  EXPECT_TRUE(c.recomputes_moe(2));
  EXPECT_FALSE(c.recomputes_moe(1));
  c.recompute_every_moe = true;
  EXPECT_TRUE(c.recomputes_moe(1));
}

}  // namespace
}  // namespace expar
