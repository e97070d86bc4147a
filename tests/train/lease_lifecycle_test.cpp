// The rowwise lease pool through train() (seed 000 §5.1, §5.7): the dry-run step sizes it and it is then
// frozen; its slots hold the capacity policy's rows, not the dropless bound, so that with a capacity factor
// resident symmetric memory stays the same as M_E grows (M_E = 1, 2, 4) while dropless runs grow by their
// stated bound; what the trainer reports (TrainSummary::leases, the memory tracker) is what is allocated.
// And, through the model: a frozen pool refuses a microbatch more than the dry run had in flight, naming
// that microbatch and flags that exist. Also the payload precision through train(): block and rowwise give
// bit-identical curves at reduced precision, which stays close to the f32 curve without equalling it. And
// `expar plan` (train/plan_buffers.hpp) states the same slots and bytes as the trainer allocates.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"
#include "expar/model/moe_transformer.hpp"
#include "expar/train/plan_buffers.hpp"
#include "expar/train/trainer.hpp"

namespace expar {
namespace {

constexpr int kRanks = 4;

const TokenCorpus& corpus() {
  static const TokenCorpus c = [] {
    std::string text;
    for (int i = 0; i < 100; ++i) text += "And the evening and the morning were the first day. ";
    return TokenCorpus::from_text(text);
  }();
  return c;
}

TrainConfig config_of(int ep, const std::string& path, const CapacityPolicy& capacity) {
  TrainConfig c;
  c.model = ModelConfig::preset("tiny");  // 2 blocks, d = 32, E = 8, top-2
  c.execution.moe.capacity = capacity;
  c.ep = ep;
  c.execution.moe.path = path;
  c.steps = 3;
  c.global_batch = 8;
  c.seq_len = 16;
  c.warmup = 1;
  c.lr = 5e-3;
  c.eval_every = 0;
  c.eval_sequences = 4;
  return c;
}

struct TrainRun {
  std::vector<StepRecord> steps;  // rank 0's
  std::vector<LeasePoolSummary> leases;
  std::vector<int64_t> symmetric_current, symmetric_peak;
};

TrainRun run(const TrainConfig& cfg, int ranks_per_node = 0) {
  TrainRun r;
  r.leases.resize(kRanks);
  r.symmetric_current.resize(kRanks);
  r.symmetric_peak.resize(kRanks);
  std::mutex m;
  LaunchOptions o;
  o.ranks = kRanks;
  o.timeout_seconds = 120;
  o.ranks_per_node = ranks_per_node;
  run_ranks(o, [&](Comm& world) {
    TrainSummary s = train(cfg, world, corpus());
    std::lock_guard lock(m);
    const auto rank = static_cast<size_t>(world.rank());
    if (rank == 0) r.steps = s.steps;
    r.leases[rank] = s.leases;
    r.symmetric_current[rank] = s.memory.current_of(MemCategory::SymmetricBuffers);
    r.symmetric_peak[rank] = s.memory.peak_of(MemCategory::SymmetricBuffers);
  });
  return r;
}

TEST(LeaseLifecycle, DryRunSizesThePoolByTheCapacityPolicyAndFreezesIt) {
  // T = 2 sequences x 16 bytes per rank (training microbatch; the validation forward has 1 sequence).
  const int64_t t = 2 * 16, k = 2, d = 32;
  const CapacityPolicy source = CapacityPolicy::with(CapacityRule::Source, 1.0);
  std::vector<size_t> with_cf;
  for (int ep : {1, 2, 4}) {
    for (bool dropless : {true, false}) {
      SCOPED_TRACE(fmt::format("M_E={} {}", ep, dropless ? "dropless" : "source cf=1"));
      const TrainRun r = run(config_of(ep, "rowwise", dropless ? CapacityPolicy::dropless() : source));
      ASSERT_EQ(r.steps.size(), 3u);
      // Dropless: the bound M_E*T*min(K, E_L); source cf=1: M_E*ceil(T*K/M_E), the same for every M_E here.
      const int64_t e_local = 8 / ep;
      const int64_t rows = dropless ? ep * t * std::min(k, e_local) : ep * ((t * k + ep - 1) / ep);
      for (int rank = 0; rank < kRanks; ++rank) {
        const LeasePoolSummary& l = r.leases[static_cast<size_t>(rank)];
        ASSERT_TRUE(l.present);
        EXPECT_TRUE(l.frozen) << "the pool is frozen after the dry-run step";
        EXPECT_EQ(l.capacity_rows, rows);
        EXPECT_EQ(l.slot_bytes, static_cast<size_t>(rows * d) * sizeof(float));
        // One dispatch lease per block held until its backward, plus the input-gradient lease; one scratch
        // slot (expert outputs); everything given back.
        EXPECT_EQ(l.slots, 3);
        EXPECT_EQ(l.high_water, 3);
        EXPECT_EQ(l.scratch_slots, 1);
        EXPECT_EQ(l.leased_at_end, 0);
        EXPECT_EQ(l.resident_bytes, 4 * l.slot_bytes);
        // The memory tracker (what the trainer's tables print) holds exactly the pool's slots, and it never
        // held more: the pool did not grow after the dry run.
        EXPECT_EQ(r.symmetric_current[static_cast<size_t>(rank)], static_cast<int64_t>(l.resident_bytes));
        EXPECT_EQ(r.symmetric_peak[static_cast<size_t>(rank)], static_cast<int64_t>(l.resident_bytes));
      }
      if (!dropless) with_cf.push_back(r.leases[0].resident_bytes);
    }
  }
  // seed 000 §5.1: capacity-sized buffers stay ~T*K per rank as M_E grows.
  ASSERT_EQ(with_cf.size(), 3u);
  EXPECT_EQ(with_cf[0], with_cf[1]);
  EXPECT_EQ(with_cf[1], with_cf[2]);
}

// The aggregated path takes the model's shared pool as rowwise does (PathTraits::shared_heap): the same
// slots (a dispatch lease per block, the input-gradient lease, the expert-output scratch), plus one pack
// buffer per block on the shared heap, and curves bit-identical to block's, on one node and on two emulated
// nodes (rows then cross nodes through the pack buffers).
TEST(LeaseLifecycle, AggregatedSharesTheModelsPoolAndMatchesBlock) {
  const int64_t row_bytes = 32 * sizeof(float);  // d = 32, f32
  for (int per_node : {0, 2}) {
    SCOPED_TRACE(per_node == 0 ? "one node" : "2 nodes x 2 ranks");
    const TrainConfig cfg = config_of(4, "aggregated", CapacityPolicy::dropless());
    const TrainRun r = run(cfg, per_node);
    const TrainRun block = run(config_of(4, "block", CapacityPolicy::dropless()), per_node);
    ASSERT_EQ(r.steps.size(), 3u);
    ASSERT_EQ(block.steps.size(), 3u);
    for (size_t i = 0; i < r.steps.size(); ++i) {
      EXPECT_EQ(r.steps[i].loss, block.steps[i].loss) << "step " << i;
      EXPECT_EQ(r.steps[i].grad_norm, block.steps[i].grad_norm) << "step " << i;
    }
    for (int rank = 0; rank < kRanks; ++rank) {
      const LeasePoolSummary& l = r.leases[static_cast<size_t>(rank)];
      ASSERT_TRUE(l.present) << "the model made the shared pool for aggregated";
      EXPECT_TRUE(l.frozen);
      EXPECT_EQ(l.slots, 3);
      EXPECT_EQ(l.high_water, 3);
      EXPECT_EQ(l.scratch_slots, 1);
      EXPECT_EQ(l.leased_at_end, 0);
      EXPECT_EQ(l.resident_bytes, 4 * l.slot_bytes);
      // Beside the pool: the 2 blocks' pack buffers. On one node nothing crosses a node, so each holds the
      // minimum of one row.
      const int64_t packs =
          r.symmetric_peak[static_cast<size_t>(rank)] - static_cast<int64_t>(l.resident_bytes);
      if (per_node == 0)
        EXPECT_EQ(packs, 2 * row_bytes);
      else
        EXPECT_GT(packs, 2 * row_bytes);
      EXPECT_EQ(r.symmetric_current[static_cast<size_t>(rank)], r.symmetric_peak[static_cast<size_t>(rank)]);
    }
  }
}

// Through the model: after a dry-run step with one microbatch in flight, a schedule with two in flight
// (F0 F1 B1 B0) needs more slots than the frozen pool has; the refusal names the microbatch that asked
// (lease tags carry MoeTransformer::set_microbatch) and the flags that size the dry run.
TEST(LeaseLifecycle, FrozenPoolRefusesAMicrobatchMoreInFlightNamingIt) {
  std::mutex m;
  std::vector<std::string> messages;
  run_ranks(2, [&](Comm& world) {
    ModelExecution rowwise;
    rowwise.moe.path = "rowwise";
    const int64_t batch = 1, seq = 8;
    MoeTransformer model(ModelConfig::preset("tiny"), rowwise, world, batch * seq);
    model.init(7);
    std::vector<int32_t> tokens(batch * seq), targets(batch * seq);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>((i * 7 + static_cast<size_t>(world.rank())) % 256);
      targets[i] = static_cast<int32_t>((i * 5 + 3) % 256);
    }
    model.set_microbatch(0);
    model.forward_backward(tokens, targets, batch, seq, batch * seq);  // the dry run: 2 blocks + 1 gradient
    model.freeze_leases();
    MoeTransformer::Pending first;
    std::string message;
    try {
      model.set_microbatch(0);
      first = model.forward_train(tokens, targets, batch, seq, batch * seq);
      model.set_microbatch(1);
      MoeTransformer::Pending second = model.forward_train(tokens, targets, batch, seq, batch * seq);
    } catch (const Error& e) {
      message = e.what();
    }
    std::lock_guard lock(m);
    messages.push_back(message);
  });
  ASSERT_EQ(messages.size(), 2u);
  for (const std::string& message : messages) {
    EXPECT_NE(message.find("frozen with 3 slots"), std::string::npos) << message;
    EXPECT_NE(message.find("block 1 microbatch 1"), std::string::npos) << message;
    EXPECT_NE(message.find("--microbatches"), std::string::npos) << message;
  }
}

TEST(PayloadPrecisionTraining, BlockAndRowwiseStayBitIdenticalAndCloseToF32) {
  const PayloadPrecision mixed{PayloadFormat::MXFP8, PayloadFormat::BF16, PayloadFormat::BF16,
                               PayloadFormat::BF16};
  auto with = [&](const std::string& path, const PayloadPrecision& p) {
    TrainConfig c = config_of(2, path, CapacityPolicy::dropless());
    c.steps = 8;
    c.execution.moe.precision = p;
    return run(c).steps;
  };
  const auto f32 = with("rowwise", {});
  const auto block = with("block", mixed);
  const auto rowwise = with("rowwise", mixed);
  ASSERT_EQ(block.size(), 8u);
  ASSERT_EQ(rowwise.size(), 8u);
  bool differs = false;
  for (size_t i = 0; i < block.size(); ++i) {
    EXPECT_EQ(block[i].loss, rowwise[i].loss) << "step " << i;
    EXPECT_EQ(block[i].grad_norm, rowwise[i].grad_norm) << "step " << i;
    EXPECT_NEAR(rowwise[i].loss, f32[i].loss, 0.02 * f32[i].loss) << "step " << i;
    differs = differs || rowwise[i].loss != f32[i].loss;
  }
  EXPECT_TRUE(differs) << "a reduced-precision payload must change the curve";
  EXPECT_LT(rowwise.back().loss, rowwise.front().loss) << "it still learns";
}

// `expar plan` states the symmetric buffers the trainer allocates (train/plan_buffers.hpp): for M_E = 1, 2,
// 4, dropless and with a capacity factor, and with every block recomputed, the plan's slot rows, slot bytes,
// slot counts and resident bytes equal what train()'s pool holds and what the memory tracker saw.
// The plan's model: the tiny preset, 4 ranks, T = 2 sequences x 16 tokens per rank (config_of).
PlanConfig tiny_plan_config() {
  const ModelConfig tiny = ModelConfig::preset("tiny");
  PlanConfig pc;
  pc.model.name = "tiny";
  pc.model.layers = tiny.layers;
  pc.model.d_model = static_cast<int>(tiny.model_dim);
  pc.model.vocab = tiny.vocab;
  pc.model.heads = static_cast<int>(tiny.heads);
  pc.model.kv_heads = static_cast<int>(tiny.kv_heads);
  pc.model.head_dim = static_cast<int>(tiny.head_dim);
  pc.model.num_experts = tiny.moe.router.num_experts;
  pc.model.top_k = tiny.moe.router.top_k;
  pc.model.expert_hidden = static_cast<int>(tiny.moe.hidden_dim);
  pc.world = kRanks;
  pc.tokens_per_rank = 2 * 16;  // config_of: batch 8 over 4 dense ranks, 16 bytes each, 1 microbatch
  return pc;
}

TEST(LeaseLifecycle, PlanStatesWhatTheTrainerAllocates) {
  PlanConfig pc = tiny_plan_config();
  struct Variant {
    const char* name;
    double cf;
    bool recompute;
  };
  for (int ep : {1, 2, 4})
    for (const Variant& v : {Variant{"dropless", 0.0, false}, Variant{"source cf=1", 1.0, false},
                             Variant{"source cf=1, recomputed", 1.0, true}}) {
      SCOPED_TRACE(fmt::format("M_E={} {}", ep, v.name));
      TrainConfig tc =
          config_of(ep, "rowwise",
                    v.cf > 0 ? CapacityPolicy::with(CapacityRule::Source, v.cf) : CapacityPolicy::dropless());
      tc.steps = 2;
      tc.execution.recompute_every_moe = v.recompute;
      const TrainRun r = run(tc);
      pc.ep_mp = ep;
      pc.capacity_factor = v.cf;
      pc.capacity_policy = "source";
      PlanBufferOptions buffers;
      buffers.recompute_moe = v.recompute;
      const Plan plan = plan_training(pc, buffers);
      ASSERT_EQ(plan.stages.size(), 1u);
      const StagePlan& s = plan.stages[0];
      for (int rank = 0; rank < kRanks; ++rank) {
        const LeasePoolSummary& l = r.leases[static_cast<size_t>(rank)];
        ASSERT_TRUE(l.present);
        EXPECT_EQ(plan.capacity_rows, l.capacity_rows);
        EXPECT_EQ(plan.slot_bytes, static_cast<int64_t>(l.slot_bytes));
        EXPECT_EQ(s.symmetric_leased_slots, l.slots);
        EXPECT_EQ(s.symmetric_scratch_slots, l.scratch_slots);
        EXPECT_EQ(s.symmetric_bytes, static_cast<int64_t>(l.resident_bytes));
        EXPECT_EQ(s.symmetric_bytes, r.symmetric_peak[static_cast<size_t>(rank)]);
      }
    }
}

// `expar plan --path aggregated`: the same pool plus one pack buffer per MoE layer. With the EP group in one
// node (M_E = 2, 4 on one node) nothing is packed, and the plan's symmetric bytes equal what the trainer's
// memory tracker saw exactly; on 2 emulated nodes x 2 ranks the routes size the packs, and the plan states
// the most they can reach (less under a capacity rule): the trainer's packs lie above the one-node figure
// and within the plan's.
TEST(LeaseLifecycle, PlanStatesTheAggregatedPathsPackBuffers) {
  PlanConfig pc = tiny_plan_config();
  const int64_t t = pc.tokens_per_rank, k = 2, row_bytes = 32 * sizeof(float), blocks = 2;
  struct Variant {
    int ep, ranks_per_node;
    double cf;  // 0: dropless, else source cf
  };
  for (const Variant& v : {Variant{2, 0, 0}, Variant{4, 0, 0}, Variant{4, 2, 0}, Variant{4, 2, 1.0}}) {
    SCOPED_TRACE(fmt::format("M_E={} {} {}", v.ep, v.ranks_per_node == 0 ? "one node" : "2 nodes x 2 ranks",
                             v.cf > 0 ? "source cf=1" : "dropless"));
    TrainConfig tc =
        config_of(v.ep, "aggregated",
                  v.cf > 0 ? CapacityPolicy::with(CapacityRule::Source, v.cf) : CapacityPolicy::dropless());
    tc.steps = 2;
    const TrainRun r = run(tc, v.ranks_per_node);
    pc.ep_mp = v.ep;
    pc.capacity_factor = v.cf;
    pc.capacity_policy = "source";
    PlanBufferOptions buffers;
    buffers.path = "aggregated";
    buffers.ranks_per_node = v.ranks_per_node == 0 ? kRanks : v.ranks_per_node;
    const Plan plan = plan_training(pc, buffers);
    ASSERT_EQ(plan.stages.size(), 1u);
    const StagePlan& s = plan.stages[0];
    const bool one_node = v.ranks_per_node == 0;
    EXPECT_EQ(plan.pack_exact, one_node);
    // 2 nodes: a proxy serves the one member of the other node with its index, T*min(K, 4 experts) rows,
    // or under source cf=1 at most B = ceil(T*K/M_E) rows into each of its node's 2 ranks.
    const int64_t bound = v.cf > 0 ? 2 * ((t * k + 3) / 4) : t * k;
    EXPECT_EQ(plan.pack_bound_rows, one_node ? 0 : bound);
    for (int rank = 0; rank < kRanks; ++rank) {
      const LeasePoolSummary& l = r.leases[static_cast<size_t>(rank)];
      ASSERT_TRUE(l.present);
      const int64_t peak = r.symmetric_peak[static_cast<size_t>(rank)];
      const int64_t packs = peak - static_cast<int64_t>(l.resident_bytes);
      EXPECT_EQ(s.symmetric_bytes - s.symmetric_pack_bytes, static_cast<int64_t>(l.resident_bytes));
      if (one_node) {
        EXPECT_EQ(s.symmetric_pack_bytes, blocks * row_bytes);
        EXPECT_EQ(s.symmetric_bytes, peak);
      } else {
        // At most every power of two from one row (128 B) to bit_ceil(bound rows x 128 B) per block (the
        // bounds are powers of two rows here).
        EXPECT_EQ(s.symmetric_pack_bytes, blocks * (2 * bound * row_bytes - row_bytes));
        EXPECT_GT(packs, blocks * row_bytes);
        EXPECT_LE(packs, s.symmetric_pack_bytes);
        EXPECT_LE(peak, s.symmetric_bytes);
      }
    }
  }
}

// The plan refuses what it cannot size, naming the values.
TEST(LeaseLifecycle, PlanRefusesAnotherPathAndAnAggregatedGroupAcrossPartialNodes) {
  PlanConfig pc = tiny_plan_config();
  pc.ep_mp = 4;
  PlanBufferOptions buffers;
  buffers.path = "block";
  EXPECT_THROW(
      {
        try {
          plan_training(pc, buffers);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("--path block"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  buffers.path = "aggregated";
  buffers.ranks_per_node = 3;
  EXPECT_THROW(
      {
        try {
          plan_training(pc, buffers);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("--ranks-per-node 3 with --ep 4"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
}

}  // namespace
}  // namespace expar
