// One placement per MoE layer (issue #36): the engine's two MoE layers moved to different EPLB slot tables
// (each from its own load vector, with replicas) give the single-rank reference's prefill and decode logits
// and greedy tokens, on full, variable and cross-DP EP and with rowwise decode, on the threads backend with
// poisoned buffers (fresh float tensors start as NaN, so a row read before it is written shows). A second
// move in the middle of decoding changes one layer's table only: that layer's placement changes, the other
// keeps its own, and the tokens stay the reference's. Bad tables are refused by name before anything moves.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/expect_error.hpp"
#include "expar/infer/engine.hpp"
#include "expar/topo/expert_balance.hpp"
#include "infer_test_util.hpp"

namespace expar::infer {
namespace {

using namespace testing;

const bool kPoison = [] {
  setenv("EXPAR_POISON", "1", 1);
  return true;
}();

constexpr int kDecodeSteps = 4;

struct Reference {
  fs::path dir;
  ModelConfig config;
  std::vector<int32_t> prompt;
  Tensor prefill_logits;              // [prompt len, V]
  std::vector<int32_t> greedy;        // kDecodeSteps + 1 tokens
  std::vector<Tensor> decode_logits;  // [1, V] after feeding greedy[i]
};

const Reference& reference() {
  static Reference ref = [] {
    Reference r;
    r.dir = test::run_temp_dir("per_layer_placement");
    r.config = test_config();
    r.prompt = random_tokens(21, 9);
    MemoryTracker& host = current_tracker();
    run_ranks(1, [&](Comm& world) {
      auto group = world.split(0, 0, "ep");
      MoeTransformer model(r.config, {}, *group);
      model.init(23);
      write_expar_checkpoint(r.dir, model, 4);
      ReferenceDecode d = reference_decode(model, r.prompt, kDecodeSteps, host);
      r.prefill_logits = std::move(d.prefill_logits);
      r.greedy = std::move(d.greedy);
      r.decode_logits = std::move(d.decode_logits);
    });
    return r;
  }();
  return ref;
}

// EPLB's table for `loads` on `layout`'s partitions and slots.
std::vector<int> eplb_table(const InferenceLayout& layout, std::vector<double> loads) {
  ExpertBalanceInput in;
  in.loads = std::move(loads);
  in.redundant = layout.placement().redundant();
  in.ep_size = layout.placement().ep_size();
  std::vector<int> table;
  for (const PhysicalSlot& s : balance_experts(in).slots) table.push_back(s.expert);
  return table;
}

// Three load vectors whose hot experts differ (rising, falling, one hot expert in the middle).
std::vector<double> loads_of(int kind, int experts) {
  std::vector<double> loads(static_cast<size_t>(experts));
  for (int e = 0; e < experts; ++e)
    loads[static_cast<size_t>(e)] = kind == 0   ? 1.0 + e
                                    : kind == 1 ? static_cast<double>(experts - e)
                                                : (e == experts / 2 ? 50.0 : 1.0);
  return loads;
}

struct Case {
  int tp, dp;
  std::optional<int> ep_degree;
  int redundant;
  DecodeMoe decode = DecodeMoe::AllReduce;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return "tp" + std::to_string(c.tp) + "_dp" + std::to_string(c.dp) +
         (c.ep_degree ? "_ep" + std::to_string(*c.ep_degree) : "") + "_R" + std::to_string(c.redundant) +
         (c.decode == DecodeMoe::Rowwise ? "_rowwise" : "");
}

class PerLayerPlacement : public ::testing::TestWithParam<Case> {};

TEST_P(PerLayerPlacement, LayersWithDifferentTablesMatchTheSingleRankReference) {
  const Reference& ref = reference();
  const Case& c = GetParam();
  const int experts = ref.config.moe.router.num_experts;
  const InferenceLayout layout =
      make_layout(c.tp, c.dp, true, c.ep_degree, experts, PlacementKind::Contiguous, c.redundant);
  const std::vector<int> table0 = eplb_table(layout, loads_of(0, experts));
  const std::vector<int> table1 = eplb_table(layout, loads_of(1, experts));
  const std::vector<int> table1_later = eplb_table(layout, loads_of(2, experts));
  ASSERT_NE(table0, table1);
  ASSERT_NE(table1, table1_later);
  run_ranks(layout.world(), [&](Comm& world) {
    auto store = ExparCheckpointStore::open(ref.dir);
    Engine engine(layout, world,
                  load_rank_weights(*store, expar_weight_names(), store->model(), layout, world.rank()),
                  EngineOptions{c.decode, {}});
    EXPECT_GT(engine.move_experts({{0, table0}, {1, table1}}), 0) << "rank " << world.rank();
    const auto table_of = [&](int layer) {
      std::vector<int> t;
      for (int s = 0; s < engine.placement(layer).num_slots(); ++s)
        t.push_back(engine.placement(layer).slot_expert(s));
      return t;
    };
    EXPECT_EQ(table_of(0), table0);
    EXPECT_EQ(table_of(1), table1);
    const int id = engine.add_sequence(ref.config.max_seq);
    Tensor logits = engine.prefill(std::vector<int>{id}, {ref.prompt});
    EXPECT_TRUE(close(logits, ref.prefill_logits)) << "prefill, rank " << world.rank();
    for (int i = 0; i < kDecodeSteps; ++i) {
      if (i == kDecodeSteps / 2) {
        // Mid-stream: only layer 1 moves; layer 0 keeps its table.
        engine.move_experts({{1, table1_later}});
        EXPECT_EQ(table_of(0), table0);
        EXPECT_EQ(table_of(1), table1_later);
      }
      Tensor out =
          engine.decode(std::vector<int>{id}, std::vector<int32_t>{ref.greedy[static_cast<size_t>(i)]});
      EXPECT_TRUE(close(out, ref.decode_logits[static_cast<size_t>(i)]))
          << "decode step " << i << ", rank " << world.rank();
      EXPECT_EQ(argmax_row(out, 0), ref.greedy[static_cast<size_t>(i) + 1]) << "decode step " << i;
    }
    // Each layer's routing load is counted per logical expert; summed over the layers it is the per-expert
    // total the metrics show.
    const EngineStats& stats = engine.stats();
    ASSERT_EQ(stats.layer_expert_tokens.size(), 2u);
    for (int e = 0; e < experts; ++e)
      EXPECT_EQ(stats.layer_expert_tokens[0][static_cast<size_t>(e)] +
                    stats.layer_expert_tokens[1][static_cast<size_t>(e)],
                stats.expert_tokens[static_cast<size_t>(e)])
          << "expert " << e;
  });
}

INSTANTIATE_TEST_SUITE_P(Infer, PerLayerPlacement,
                         ::testing::Values(Case{4, 1, std::nullopt, 4},  // full EP, 7 slots per rank
                                           Case{4, 1, 2, 4},             // variable EP
                                           Case{2, 2, std::nullopt, 4},  // cross-DP EP
                                           Case{4, 1, std::nullopt, 4, DecodeMoe::Rowwise},
                                           Case{2, 2, std::nullopt, 4, DecodeMoe::Rowwise},
                                           Case{1, 4, 2, 2}),  // partial cross-DP EP
                         case_name);

TEST(PerLayerPlacement, BadTablesAreRefusedBeforeAnythingMoves) {
  const Reference& ref = reference();
  const int experts = ref.config.moe.router.num_experts;
  const InferenceLayout layout = make_layout(2, 1, true, std::nullopt, experts, PlacementKind::Contiguous, 2);
  const std::vector<int> table = eplb_table(layout, loads_of(0, experts));
  run_ranks(layout.world(), [&](Comm& world) {
    auto store = ExparCheckpointStore::open(ref.dir);
    Engine engine(layout, world,
                  load_rank_weights(*store, expar_weight_names(), store->model(), layout, world.rank()));
    const ExpertPlacement before = engine.placement(0);
    expar::testing::expect_error(
        [&] {
          engine.move_experts({{0, table}, {2, table}});
        },
        {"layer 2", "not an MoE layer", "name MoE layers only"});
    expar::testing::expect_error(
        [&] {
          engine.move_experts({{1, table}, {1, table}});
        },
        {"layer 1", "two expert slot tables", "one table per layer"});
    std::vector<int> bad = table;
    bad[0] = experts;  // no such expert
    EXPECT_THROW(engine.move_experts({{0, table}, {1, bad}}), Error);
    for (int s = 0; s < before.num_slots(); ++s)
      EXPECT_EQ(engine.placement(0).slot_expert(s), before.slot_expert(s)) << "slot " << s;
  });
}

}  // namespace
}  // namespace expar::infer
