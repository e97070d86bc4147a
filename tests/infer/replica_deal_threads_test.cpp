// Batch-1 decode with redundant experts (issue #36): the engine keeps one replica deal per MoE layer, so a
// replicated expert's routes go to its replicas in turn from step to step, not to its first replica every
// step. On every EP form the engine decodes with (agrs over one source, variable EP, cross-DP EP, partial
// cross-DP EP, rowwise decode) each DP replica decodes one sequence for many steps, with replicas (EPLB's
// table for a uniform load) and without, on the same layout: the greedy tokens are the same and the decode
// logits agree within 1e-5 relative (the engine tests' comparison: which rank computes a route changes the
// order of the sum over ranks), and in every copy of the experts each replicated expert's decode rows split
// within 1 per MoE layer over its replicas (rows counted per rank, not timed).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "expar/infer/engine.hpp"
#include "infer_test_util.hpp"

namespace expar::infer {
namespace {

using namespace testing;

constexpr int kDecodeSteps = 24, kPromptTokens = 4;

const fs::path& checkpoint() {
  static const fs::path dir = write_test_checkpoint("replica_deal", 31, 4);
  return dir;
}

struct DealCase {
  int tp, dp;
  std::optional<int> ep_degree;  // unset: full EP (TP * DP)
  int redundant;
  DecodeMoe decode = DecodeMoe::AllReduce;
};

std::string case_name(const ::testing::TestParamInfo<DealCase>& info) {
  const DealCase& c = info.param;
  return "TP" + std::to_string(c.tp) + "_DP" + std::to_string(c.dp) + "_" +
         (c.ep_degree ? "EP" + std::to_string(*c.ep_degree) : "fullEP") + "_R" + std::to_string(c.redundant) +
         (c.decode == DecodeMoe::Rowwise ? "_rowwise" : "");
}

struct DecodeRun {
  std::vector<std::vector<int32_t>> tokens;  // [replica] greedy tokens, from the prefill on
  std::vector<std::vector<Tensor>> logits;   // [replica][decode step] logits [1, V]
  // [world rank] rows each logical expert computed on the rank during the decode steps (all layers)
  std::vector<std::vector<int64_t>> decode_rows;
};

DecodeRun decode_run(const InferenceLayout& layout, DecodeMoe decode) {
  DecodeRun run;
  run.tokens.resize(static_cast<size_t>(layout.dp()));
  run.logits.resize(static_cast<size_t>(layout.dp()));
  run.decode_rows.resize(static_cast<size_t>(layout.world()));
  MemoryTracker& host = current_tracker();
  std::mutex mutex;
  run_ranks(layout.world(), [&](Comm& world) {
    auto store = ExparCheckpointStore::open(checkpoint());
    Engine engine(layout, world,
                  load_rank_weights(*store, expar_weight_names(), store->model(), layout, world.rank()),
                  EngineOptions{decode, {}});
    const int rep = engine.dp_rank();
    const std::vector<int> ids = {engine.add_sequence(store->model().max_seq)};
    Tensor logits = engine.prefill(ids, {random_tokens(40 + static_cast<uint64_t>(rep), kPromptTokens)});
    std::vector<int32_t> tokens = {argmax_row(logits, logits.dim(0) - 1)};
    const std::vector<int64_t> before = engine.stats().expert_tokens;
    std::vector<Tensor> steps;
    for (int i = 0; i < kDecodeSteps; ++i) {
      logits = engine.decode(ids, std::vector<int32_t>{tokens.back()});
      steps.push_back(export_to(host, logits));
      tokens.push_back(argmax_row(logits, 0));
    }
    std::vector<int64_t> rows = engine.stats().expert_tokens;
    for (size_t e = 0; e < rows.size(); ++e) rows[e] -= before[e];
    std::lock_guard lock(mutex);
    run.decode_rows[static_cast<size_t>(world.rank())] = rows;
    if (world.rank() % layout.tp() == 0) {
      run.tokens[static_cast<size_t>(rep)] = tokens;
      run.logits[static_cast<size_t>(rep)] = std::move(steps);
    }
  });
  return run;
}

class ReplicaDealDecode : public ::testing::TestWithParam<DealCase> {};

TEST_P(ReplicaDealDecode, BatchOneDecodeSpreadsOverReplicasAndKeepsTheTokens) {
  const DealCase& c = GetParam();
  const ModelConfig config = test_config();
  const int experts = config.moe.router.num_experts;
  const InferenceLayout with =
      make_layout(c.tp, c.dp, true, c.ep_degree, experts, PlacementKind::Contiguous, c.redundant);
  const InferenceLayout without = make_layout(c.tp, c.dp, true, c.ep_degree, experts);
  ASSERT_TRUE(with.placement().has_replicas());
  const DecodeRun got = decode_run(with, c.decode);
  const DecodeRun want = decode_run(without, c.decode);
  for (int rep = 0; rep < c.dp; ++rep) {
    EXPECT_EQ(got.tokens[static_cast<size_t>(rep)], want.tokens[static_cast<size_t>(rep)])
        << "replica " << rep;
    for (int i = 0; i < kDecodeSteps; ++i)
      EXPECT_TRUE(close(got.logits[static_cast<size_t>(rep)][static_cast<size_t>(i)],
                        want.logits[static_cast<size_t>(rep)][static_cast<size_t>(i)]))
          << "replica " << rep << ", decode step " << i;
  }
  // Rows per (copy of the experts, partition, logical expert): one rank of each partition counts them (the
  // ranks of a variable-EP partition compute the same rows on their intermediate shards).
  std::map<std::pair<int, int>, std::vector<int64_t>> rows;
  for (int r = 0; r < with.world(); ++r) {
    const InferenceRankInfo info = with.rank_info(r);
    if (info.ep_tp_rank == 0)
      rows[{info.expert_copy, info.ep_rank}] = got.decode_rows[static_cast<size_t>(r)];
  }
  const ExpertPlacement& placement = with.placement();
  int64_t largest = 0;
  for (int copy = 0; copy < with.expert_copies(); ++copy)
    for (int e = 0; e < experts; ++e) {
      if (placement.replica_count(e) == 1) continue;
      std::set<int> partitions;
      std::vector<int64_t> per_replica;
      for (int slot : placement.expert_slots(e)) {
        partitions.insert(placement.slot_rank(slot));
        per_replica.push_back(rows.at({copy, placement.slot_rank(slot)})[static_cast<size_t>(e)]);
      }
      ASSERT_EQ(partitions.size(), per_replica.size()) << "expert " << e << "'s replicas share a partition";
      const auto [lo, hi] = std::minmax_element(per_replica.begin(), per_replica.end());
      EXPECT_LE(*hi - *lo, config.layers) << "copy " << copy << ", expert " << e;
      int64_t total = 0;
      for (int64_t n : per_replica) total += n;
      largest = std::max(largest, total);
    }
  // Some replicated expert computed more decode rows than there are layers: on one replica they would fail
  // the split above.
  EXPECT_GT(largest, config.layers);
}

INSTANTIATE_TEST_SUITE_P(Infer, ReplicaDealDecode,
                         ::testing::Values(DealCase{4, 1, std::nullopt, 8},  // agrs, the replica one source
                                           DealCase{4, 1, 2, 6},             // variable EP
                                           DealCase{2, 2, std::nullopt, 4},  // cross-DP EP
                                           DealCase{2, 4, 4, 4},             // partial cross-DP EP
                                           DealCase{1, 4, 2, 2},             // partial, TP 1
                                           DealCase{4, 1, std::nullopt, 4, DecodeMoe::Rowwise},
                                           DealCase{2, 2, std::nullopt, 4, DecodeMoe::Rowwise}),
                         case_name);

}  // namespace
}  // namespace expar::infer
