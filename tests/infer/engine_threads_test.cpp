// The inference engine against the single-rank reference (MoeTransformer::logits with path "local"):
// every layout of TP 1..4 x {no EP, full EP, variable EP} x DP {1, 2}, contiguous and round-robin placement,
// gives the reference's prefill and decode logits within 1e-5 relative and the same greedy tokens, also with
// redundant experts (issue #36: replicas on full, variable and cross-DP EP, rowwise decode); partial
// cross-DP EP (EP groups of some DP replicas, each its own copy of the experts) and EP inside each replica
// with DP > 1, with and without replicas; a DP replica with no tokens runs the dummy step while its peer
// decodes; the collective pattern of each phase is the one seed 002 lists; a saved score bias routes as in
// training.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <mutex>
#include <set>

#include "expar/core/error.hpp"
#include "expar/infer/engine.hpp"
#include "expar/infer/generate.hpp"
#include "expar/io/durable_file.hpp"
#include "infer_test_util.hpp"
#include "recording_comm.hpp"

namespace expar::infer {
namespace {

using namespace testing;

constexpr int kReplicas = 4, kSeqsPerReplica = 2, kDecodeSteps = 4;

struct Reference {
  fs::path dir;
  ModelConfig config;
  // [replica][sequence]
  std::vector<std::vector<std::vector<int32_t>>> prompts;
  std::vector<std::vector<Tensor>> prefill_logits;              // [prompt len, V]
  std::vector<std::vector<std::vector<int32_t>>> greedy;        // kDecodeSteps + 1 tokens
  std::vector<std::vector<std::vector<Tensor>>> decode_logits;  // logits [1, V] after feeding greedy[i]
};

const Reference& reference() {
  static Reference ref = [] {
    Reference r;
    r.dir = test::run_temp_dir("engine");
    r.config = test_config();
    r.prompts = {{random_tokens(1, 7), random_tokens(2, 4)},
                 {random_tokens(3, 5), random_tokens(4, 9)},
                 {random_tokens(5, 6), random_tokens(6, 3)},
                 {random_tokens(7, 8), random_tokens(8, 5)}};
    MemoryTracker& host = current_tracker();
    run_ranks(1, [&](Comm& world) {
      auto group = world.split(0, 0, "ep");
      MoeTransformer model(r.config, {}, *group);
      model.init(11);
      write_expar_checkpoint(r.dir, model, 4);
      for (int rep = 0; rep < kReplicas; ++rep) {
        r.prefill_logits.emplace_back();
        r.greedy.emplace_back();
        r.decode_logits.emplace_back();
        for (int s = 0; s < kSeqsPerReplica; ++s) {
          ReferenceDecode d = reference_decode(model, r.prompts[rep][s], kDecodeSteps, host);
          r.prefill_logits[rep].push_back(std::move(d.prefill_logits));
          r.greedy[rep].push_back(std::move(d.greedy));
          r.decode_logits[rep].push_back(std::move(d.decode_logits));
        }
      }
    });
    return r;
  }();
  return ref;
}

struct LayoutCase {
  int tp, dp;
  bool ep;
  std::optional<int> ep_degree;
  PlacementKind placement = PlacementKind::Contiguous;
  int redundant = 0;  // --redundant-experts
  DecodeMoe decode = DecodeMoe::AllReduce;
};

std::string case_name(const ::testing::TestParamInfo<LayoutCase>& info) {
  const LayoutCase& c = info.param;
  std::string mode = !c.ep ? "noEP" : c.ep_degree ? "EP" + std::to_string(*c.ep_degree) : "fullEP";
  return "TP" + std::to_string(c.tp) + "_DP" + std::to_string(c.dp) + "_" + mode +
         (c.placement == PlacementKind::RoundRobin ? "_rr" : "") +
         (c.redundant > 0 ? "_R" + std::to_string(c.redundant) : "") +
         (c.decode == DecodeMoe::Rowwise ? "_rowwise" : "");
}

InferenceLayout make_layout(const LayoutCase& c, int num_experts) {
  return testing::make_layout(c.tp, c.dp, c.ep, c.ep_degree, num_experts, c.placement, c.redundant);
}

class EngineLayouts : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(EngineLayouts, PrefillAndDecodeMatchTheSingleRankReference) {
  const Reference& ref = reference();
  const InferenceLayout layout = make_layout(GetParam(), ref.config.moe.router.num_experts);
  run_ranks(layout.world(), [&](Comm& world) {
    auto store = ExparCheckpointStore::open(ref.dir);
    Engine engine(layout, world,
                  load_rank_weights(*store, expar_weight_names(), store->model(), layout, world.rank()),
                  EngineOptions{GetParam().decode, {}});
    // A rank maps only the expert files holding its experts (4 files of 6 experts each).
    std::set<int> files;
    for (int e : engine.weights().local_experts) files.insert(e / 6);
    EXPECT_EQ(store->files_opened(), 1 + files.size()) << "rank " << world.rank();
    const int rep = engine.dp_rank();
    std::vector<int> ids;
    for (int s = 0; s < kSeqsPerReplica; ++s) ids.push_back(engine.add_sequence(ref.config.max_seq));
    Tensor logits = engine.prefill(ids, ref.prompts[rep]);
    int64_t row = 0;
    for (int s = 0; s < kSeqsPerReplica; ++s) {
      const Tensor& want = ref.prefill_logits[rep][s];
      EXPECT_TRUE(close(logits.rows(row, row + want.dim(0)), want))
          << "prefill, rank " << world.rank() << " sequence " << s;
      row += want.dim(0);
      EXPECT_EQ(argmax_row(logits, row - 1), ref.greedy[rep][s][0]);
    }
    for (int i = 0; i < kDecodeSteps; ++i) {
      std::vector<int32_t> next;
      for (int s = 0; s < kSeqsPerReplica; ++s) next.push_back(ref.greedy[rep][s][i]);
      Tensor out = engine.decode(ids, next);
      ASSERT_EQ(out.dim(0), kSeqsPerReplica);
      for (int s = 0; s < kSeqsPerReplica; ++s) {
        EXPECT_TRUE(close(out.rows(s, s + 1), ref.decode_logits[rep][s][i]))
            << "decode step " << i << ", rank " << world.rank() << " sequence " << s;
        EXPECT_EQ(argmax_row(out, s), ref.greedy[rep][s][i + 1]) << "greedy token, decode step " << i;
      }
    }
  });
}

std::vector<LayoutCase> all_layouts() {
  std::vector<LayoutCase> v;
  for (int dp = 1; dp <= 2; ++dp)
    for (int tp = 1; tp <= 4; ++tp) {
      v.push_back({tp, dp, false, std::nullopt});
      v.push_back({tp, dp, true, std::nullopt});  // full EP: ep_degree = TP * DP
    }
  v.push_back({4, 1, true, 2});  // variable EP: EP_TP {0,1},{2,3}, EP {0,2},{1,3}
  v.push_back({2, 1, true, 1});  // EP enabled with one partition: experts TP-sharded over the group
  v.push_back({4, 1, true, std::nullopt, PlacementKind::RoundRobin});
  v.push_back({4, 1, true, 2, PlacementKind::RoundRobin});
  v.push_back({2, 2, true, std::nullopt, PlacementKind::RoundRobin});
  // Redundant experts (24 experts): replicas of the EPLB placement for a uniform load, whose routes the
  // replica rule deals over them.
  v.push_back({2, 1, true, std::nullopt, PlacementKind::Contiguous, 2});  // full EP, 13 slots per rank
  v.push_back({4, 1, true, std::nullopt, PlacementKind::Contiguous, 8});  // full EP, 8 per rank
  v.push_back({4, 1, true, 2, PlacementKind::Contiguous, 6});             // variable EP
  v.push_back({2, 2, true, std::nullopt, PlacementKind::Contiguous, 4});  // cross-DP EP
  v.push_back({4, 1, true, std::nullopt, PlacementKind::Contiguous, 4, DecodeMoe::Rowwise});
  v.push_back({2, 2, true, std::nullopt, PlacementKind::Contiguous, 4, DecodeMoe::Rowwise});
  // Partial cross-DP EP (ep_degree = g * TP, g < DP): EP groups of g replicas, each its own copy of the
  // experts; and EP inside each replica with DP > 1 (ep_degree dividing TP: no tokens cross replicas).
  v.push_back({1, 4, true, 2});  // EP groups {0,1}, {2,3}
  v.push_back({2, 4, true, 4});  // EP groups {0..3}, {4..7}
  v.push_back({2, 2, true, 2});  // full EP inside each replica
  v.push_back({4, 2, true, 2});  // variable EP inside each replica
  v.push_back({1, 4, true, 2, PlacementKind::RoundRobin});
  v.push_back({1, 4, true, 2, PlacementKind::Contiguous, 2});  // 26 slots, 13 per rank
  v.push_back({2, 4, true, 4, PlacementKind::Contiguous, 4});  // 28 slots, 7 per rank
  v.push_back({4, 2, true, 2, PlacementKind::Contiguous, 2});
  v.push_back({2, 4, true, 4, PlacementKind::Contiguous, 4, DecodeMoe::Rowwise});
  v.push_back({1, 4, true, 2, PlacementKind::Contiguous, 0, DecodeMoe::Rowwise});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Infer, EngineLayouts, ::testing::ValuesIn(all_layouts()), case_name);

// Seed 002's DP padding: replica 1 has no request; it runs zero-token steps that take part in every
// collective, and replica 0 still gets the reference's tokens.
TEST(Engine, IdleDpReplicaRunsDummyStepsWhileItsPeerDecodes) {
  const Reference& ref = reference();
  for (const LayoutCase& c : {LayoutCase{2, 2, true, std::nullopt}, LayoutCase{1, 4, true, 2}}) {
    const InferenceLayout layout = make_layout(c, ref.config.moe.router.num_experts);
    SCOPED_TRACE(fmt::format("TP {} DP {} EP {}", c.tp, c.dp, layout.ep_degree()));
    std::mutex mutex;
    std::vector<std::vector<int32_t>> got(static_cast<size_t>(layout.world()));
    run_ranks(layout.world(), [&](Comm& world) {
      auto store = ExparCheckpointStore::open(ref.dir);
      Engine engine(layout, world,
                    load_rank_weights(*store, expar_weight_names(), store->model(), layout, world.rank()));
      const bool serving = engine.dp_rank() == 0;
      auto tokens =
          greedy_generate(engine, serving ? ref.prompts[0][0] : std::vector<int32_t>{}, kDecodeSteps + 1);
      std::lock_guard lock(mutex);
      got[static_cast<size_t>(world.rank())] = tokens;
      EXPECT_EQ(engine.stats().decode_tokens, serving ? kDecodeSteps : 0);
    });
    for (int r = 0; r < layout.world(); ++r)
      EXPECT_EQ(got[static_cast<size_t>(r)], r < c.tp ? ref.greedy[0][0] : std::vector<int32_t>{})
          << "rank " << r;
  }
}

// Seed 002's step lists, as the sequence of one rank's collectives over its TP and DP groups (and, with
// cross-DP EP, the world as the EP group). Per layer, prefill: attention all-gather (undo SP) and
// reduce-scatter over TP; the MoE block on moe/'s agrs path: the route counts exchanged over the map's
// sources (TP, or the whole EP group with cross-DP EP), the packed rows all-gathered over TP and with
// cross-DP EP over DP, the experts, a reduce-scatter over DP, then the reduce-scatter over TP back to SP; and
// a final all-gather before the LM head. Decode: attention all-reduce over TP; MoE with cross-DP EP the
// route counts and an all-gather over DP first, the all-reduce over TP, with cross-DP EP a reduce-scatter
// over DP last (without it the replica's tokens are one source: nothing is exchanged before the experts).
// "DP" is the replicas of the rank's EP group: with partial cross-DP EP the same steps over fewer replicas.
// The vocabulary-parallel embedding and LM head add, around the layers, the embedding's sum (a
// reduce-scatter onto the SP rows in prefill, an all-reduce in decode) and the all-gather of the logits'
// vocabulary slices. Variable EP (ep_degree < TP) keeps the same single full-TP collectives: summing over the
// whole TP group adds the TP partial products and the EP contributions in one go.
std::vector<std::string> seed_002_steps(bool prefill, bool cross_dp, int layers) {
  std::vector<std::string> steps{prefill ? "tp reduce_scatter_v" : "tp all_reduce"};
  for (int l = 0; l < layers; ++l) {
    if (prefill) {
      steps.insert(steps.end(), {"tp all_gather_v", "tp reduce_scatter_v"});
      steps.push_back(cross_dp ? "ep all_gather" : "tp all_gather");
      steps.push_back("tp all_gather_v");
      if (cross_dp) steps.insert(steps.end(), {"dp all_gather_v", "dp reduce_scatter_v"});
      steps.push_back("tp reduce_scatter_v");
    } else {
      steps.push_back("tp all_reduce");
      if (cross_dp) steps.insert(steps.end(), {"dp all_gather", "dp all_gather_v"});
      steps.push_back("tp all_reduce");
      if (cross_dp) steps.push_back("dp reduce_scatter_v");
    }
  }
  if (prefill) steps.push_back("tp all_gather_v");
  steps.push_back("tp all_gather_v");  // the logits' vocabulary slices
  return steps;
}

TEST(Engine, CollectivePatternPerPhase) {
  const Reference& ref = reference();
  const int layers = ref.config.layers;
  for (const LayoutCase& c :
       {LayoutCase{4, 1, true, std::nullopt}, LayoutCase{2, 2, true, std::nullopt}, LayoutCase{4, 1, true, 2},
        LayoutCase{2, 1, false, std::nullopt}, LayoutCase{2, 4, true, 4}, LayoutCase{2, 2, true, 2}}) {
    const InferenceLayout layout = make_layout(c, ref.config.moe.router.num_experts);
    SCOPED_TRACE(fmt::format("TP {} DP {} EP {} (ep_tp_size {})", c.tp, c.dp, layout.ep_degree(),
                             layout.ep_tp_size()));
    const bool cross = layout.cross_dp_ep();
    EXPECT_EQ(cross, c.dp > 1 && layout.ep_degree() > c.tp);
    EXPECT_EQ(layout.ep_dp_size(), cross ? layout.ep_degree() / c.tp : 1);
    std::mutex mutex;
    std::vector<std::vector<std::string>> prefill(static_cast<size_t>(layout.world())),
        decode(static_cast<size_t>(layout.world()));
    run_ranks(layout.world(), [&](Comm& world) {
      auto log = std::make_shared<std::vector<std::string>>();
      expar::testing::RecordingComm recording(world, "world", log);
      auto store = ExparCheckpointStore::open(ref.dir);
      Engine engine(layout, recording,
                    load_rank_weights(*store, expar_weight_names(), store->model(), layout, world.rank()));
      const int id = engine.add_sequence(16);
      log->clear();
      engine.prefill(std::vector<int>{id}, {ref.prompts[engine.dp_rank()][0]});
      std::vector<std::string> after_prefill = *log;
      log->clear();
      engine.decode(std::vector<int>{id}, std::vector<int32_t>{1});
      std::lock_guard lock(mutex);
      prefill[static_cast<size_t>(world.rank())] = std::move(after_prefill);
      decode[static_cast<size_t>(world.rank())] = *log;
    });
    for (int r = 0; r < layout.world(); ++r) {
      EXPECT_EQ(prefill[static_cast<size_t>(r)], seed_002_steps(true, cross, layers))
          << "prefill, rank " << r;
      EXPECT_EQ(decode[static_cast<size_t>(r)], seed_002_steps(false, cross, layers)) << "decode, rank " << r;
    }
  }
}

// EngineStats::expert_weight_reads, per layer: one decode step of one token reads the weights of its K
// experts once in the replica, each on the ranks holding it: the sum over the replica's ranks is K times
// the ranks that share one expert (ep_tp_size), in every layer.
TEST(Engine, CountsTheExpertWeightsEachLayerReads) {
  const Reference& ref = reference();
  const int layers = ref.config.layers, k = ref.config.moe.router.top_k;
  for (const LayoutCase& c : {LayoutCase{1, 1, false, std::nullopt}, LayoutCase{2, 1, false, std::nullopt},
                              LayoutCase{4, 1, true, std::nullopt}, LayoutCase{4, 1, true, 2}}) {
    const InferenceLayout layout = make_layout(c, ref.config.moe.router.num_experts);
    SCOPED_TRACE(fmt::format("TP {} EP {} (ep_tp_size {})", c.tp, layout.ep_degree(), layout.ep_tp_size()));
    std::mutex mutex;
    std::vector<int64_t> sum(static_cast<size_t>(layers), 0);
    run_ranks(layout.world(), [&](Comm& world) {
      auto store = ExparCheckpointStore::open(ref.dir);
      Engine engine(layout, world,
                    load_rank_weights(*store, expar_weight_names(), store->model(), layout, world.rank()));
      const int id = engine.add_sequence(16);
      engine.prefill(std::vector<int>{id}, {ref.prompts[0][0]});
      const std::vector<int64_t> before = engine.stats().expert_weight_reads;
      engine.decode(std::vector<int>{id}, std::vector<int32_t>{1});
      const std::vector<int64_t>& after = engine.stats().expert_weight_reads;
      std::lock_guard lock(mutex);
      ASSERT_EQ(after.size(), static_cast<size_t>(layers));
      for (size_t l = 0; l < after.size(); ++l) sum[l] += after[l] - before[l];
    });
    for (int l = 0; l < layers; ++l)
      EXPECT_EQ(sum[static_cast<size_t>(l)], int64_t{k} * layout.ep_tp_size()) << "layer " << l;
  }
}

// Grouped key/value heads with TP above the key/value head count: each rank keeps the one key/value head its
// query heads use.
TEST(Engine, ReplicatesKeyValueHeadsWhenTpExceedsThem) {
  const fs::path dir = test::run_temp_dir("gqa");
  ModelConfig config = test_config();
  config.heads = 8;
  config.kv_heads = 2;
  std::vector<int32_t> prompt = random_tokens(9, 6);
  Tensor want;
  MemoryTracker& host = current_tracker();
  run_ranks(1, [&](Comm& world) {
    auto group = world.split(0, 0, "ep");
    MoeTransformer model(config, {}, *group);
    model.init(3);
    write_expar_checkpoint(dir, model, 1);
    want = export_to(host, model.logits(prompt, 1, 6));
  });
  const InferenceLayout layout = make_layout({4, 1, true, std::nullopt}, config.moe.router.num_experts);
  run_ranks(4, [&](Comm& world) {
    auto store = ExparCheckpointStore::open(dir);
    RankWeights w = load_rank_weights(*store, expar_weight_names(), store->model(), layout, world.rank());
    EXPECT_EQ(w.local_attn.n_heads, 2);
    EXPECT_EQ(w.local_attn.n_kv_heads, 1);
    Engine engine(layout, world, std::move(w));
    const int id = engine.add_sequence(8);
    EXPECT_TRUE(close(engine.prefill(std::vector<int>{id}, {prompt}), want));
  });
  fs::remove_all(dir);
}

TEST(Engine, GenerateLoadsTheCheckpointAndMatchesTheReference) {
  const Reference& ref = reference();
  GenerateOptions o;
  o.tp = 2;
  o.dp = 2;
  o.enable_expert_parallel = true;
  GenerateResult r = generate(o, ref.dir.string(), ref.prompts[0][1], kDecodeSteps + 1);
  EXPECT_EQ(r.tokens, ref.greedy[0][1]);
  EXPECT_GT(r.prefill_tokens_per_s, 0.0);
  EXPECT_GT(r.decode_tokens_per_s, 0.0);
  o.redundant_experts = 4;  // 28 slots, 7 per rank: what `expar generate --redundant-experts 4` runs
  EXPECT_EQ(generate(o, ref.dir.string(), ref.prompts[0][1], kDecodeSteps + 1).tokens, ref.greedy[0][1]);
}

// Auxiliary-loss-free balancing's selection bias (train --score-bias-rate): the engine routes with the saved
// bias as the training model does, on TP 1 and on TP 2 with full EP; a bias large enough to change the routes
// (the logits without it differ). A store that holds the bias while its manifest does not name it is
// refused, naming the tensor.
TEST(Engine, RoutesWithTheSavedScoreBias) {
  const fs::path dir = test::run_temp_dir("engine_score_bias");
  ModelConfig config = test_config();
  config.moe.use_score_bias = true;
  const std::vector<int32_t> prompt = random_tokens(5, 9);
  Tensor want, unbiased;
  MemoryTracker& host = current_tracker();
  run_ranks(1, [&](Comm& world) {
    auto group = world.split(0, 0, "ep");
    MoeTransformer model(config, {}, *group);
    model.init(11);
    for (int l = 0; l < config.layers; ++l)
      fill_normal(model.moe(l).params().score_bias, 5, static_cast<uint64_t>(l), 0.5f);
    write_expar_checkpoint(dir, model, 4);
    want = export_to(host, model.logits(prompt, 1, static_cast<int64_t>(prompt.size())));
    for (int l = 0; l < config.layers; ++l)
      for (float& v : model.moe(l).params().score_bias.span<float>()) v = 0.0f;
    unbiased = export_to(host, model.logits(prompt, 1, static_cast<int64_t>(prompt.size())));
  });
  EXPECT_FALSE(close(want, unbiased)) << "the bias changes no route: the test would not see it ignored";
  for (const LayoutCase& c : {LayoutCase{1, 1, false, std::nullopt}, LayoutCase{2, 1, true, std::nullopt}}) {
    const InferenceLayout layout = make_layout(c, config.moe.router.num_experts);
    run_ranks(layout.world(), [&](Comm& world) {
      auto store = ExparCheckpointStore::open(dir);
      ASSERT_TRUE(store->model().moe.use_score_bias) << "the manifest names the bias";
      Engine engine(layout, world,
                    load_rank_weights(*store, expar_weight_names(), store->model(), layout, world.rank()));
      const std::vector<int> ids = {engine.add_sequence(config.max_seq)};
      Tensor logits = engine.prefill(ids, {prompt});
      EXPECT_TRUE(close(logits, want)) << "TP " << c.tp << (c.ep ? " EP" : "") << ", rank " << world.rank();
    });
  }
  // The manifest without the key: the bias in the store is refused by name.
  nlohmann::json manifest = nlohmann::json::parse(read_text_file(dir / "manifest.json"));
  manifest["model"].erase("score_bias");
  std::ofstream(dir / "manifest.json") << manifest.dump(2) << "\n";
  auto store = ExparCheckpointStore::open(dir);
  const InferenceLayout one =
      make_layout(LayoutCase{1, 1, false, std::nullopt}, config.moe.router.num_experts);
  std::string message = "(no error)";
  try {
    load_rank_weights(*store, expar_weight_names(), store->model(), one, 0);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("holds 'layers.0.moe.score_bias' but its model config has no score bias"),
            std::string::npos)
      << message;
  fs::remove_all(dir);
}

TEST(Engine, RejectsALayoutThatDoesNotFitTheModel) {
  const Reference& ref = reference();
  auto store = ExparCheckpointStore::open(ref.dir);
  InferenceConfig ic;
  ic.tp = 4;
  ic.num_experts = 16;  // the model has 24
  EXPECT_THROW(load_rank_weights(*store, expar_weight_names(), store->model(), InferenceLayout(ic), 0),
               Error);
  ic.num_experts = 24;
  ModelConfig wrong_dim = store->model();
  wrong_dim.head_dim = 4;  // the checkpoint's Wq is [96, 48]
  try {
    load_rank_weights(*store, expar_weight_names(), wrong_dim, InferenceLayout(ic), 0);
    FAIL() << "a config whose head_dim does not match the weights must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[96, 48]"), std::string::npos) << e.what();
  }
  ModelConfig c = store->model();
  c.heads = 10;  // not divisible by TP = 4
  try {
    load_rank_weights(*store, expar_weight_names(), c, InferenceLayout(ic), 0);
    FAIL() << "heads=10 with TP=4 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("heads=10"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace expar::infer
