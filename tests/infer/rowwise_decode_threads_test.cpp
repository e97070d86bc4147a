// Rowwise decode (EngineOptions::decode_moe = Rowwise) against the all-reduce decode of seed 002, on our
// checkpoints and Hugging Face Qwen-MoE (shared expert with its gate) and gpt-oss (expert biases, clamped
// SwiGLU) checkpoints: every full-EP layout of TP 1..4 x DP 1..2 (and a round-robin placement) gives the same
// prefill logits, decode logits within 1e-5 relative and identical greedy tokens. Replica 0 decodes three
// sequences and replica 1 one, then a step decodes only one sequence per replica, so with TP >= 2 some ranks
// own no token (T < TP), and the replicas of a cross-DP EP world contribute different row counts. The
// rowwise engine's TP group sees the rowwise collectives (an all-gather per layer, no MoE all-reduce), and a
// layout with intermediate-sharded experts is refused with the rule and the fix.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <mutex>

#include "expar/infer/engine.hpp"
#include "expar/infer/generate.hpp"
#include "hf_test_models.hpp"

namespace expar::infer {
namespace {

using namespace testing;

constexpr int kDecodeSteps = 4;

struct Checkpoint {
  fs::path dir;
  ModelSpec spec;
};

const Checkpoint& expar_checkpoint() {
  static Checkpoint c = [] {
    Checkpoint r;
    r.dir = test::run_temp_dir("rowwise_ours");
    run_ranks(1, [&](Comm& world) {
      auto group = world.split(0, 0, "ep");
      MoeTransformer model(test_config(), {}, *group);
      model.init(23);
      write_expar_checkpoint(r.dir, model, 4);
    });
    r.spec = open_model_spec(r.dir);
    return r;
  }();
  return c;
}

Checkpoint hf_checkpoint(HfTestModel model, const std::string& name) {
  Checkpoint r;
  r.dir = test::run_temp_dir(name);
  model.write(r.dir);
  r.spec = open_model_spec(r.dir);
  return r;
}

const Checkpoint& qwen_checkpoint() {
  static Checkpoint c = hf_checkpoint(qwen_test_model(true), "rowwise_qwen");
  return c;
}

const Checkpoint& gpt_oss_checkpoint() {
  static Checkpoint c = hf_checkpoint(gpt_oss_test_model(), "rowwise_gpt_oss");
  return c;
}

const Checkpoint& checkpoint(ModelFormat format) {
  switch (format) {
    case ModelFormat::QwenMoe:
      return qwen_checkpoint();
    case ModelFormat::GptOss:
      return gpt_oss_checkpoint();
    default:
      return expar_checkpoint();
  }
}

// Prompts of replica `rep`: three sequences on replica 0, one on replica 1.
std::vector<std::vector<int32_t>> prompts_of(int rep, int vocab) {
  if (rep == 0) return {vocab_tokens(11, 5, vocab), vocab_tokens(12, 3, vocab), vocab_tokens(13, 6, vocab)};
  return {vocab_tokens(14, 4, vocab)};
}

// What one engine produced on one rank: the logits of every step and the greedy tokens it fed back.
struct DecodeRun {
  std::vector<Tensor> logits;  // prefill, kDecodeSteps decode steps, then the one-sequence step
  std::vector<std::vector<int32_t>> fed;
};

DecodeRun greedy_run(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                     const ModelConfig& config, MemoryTracker& host) {
  DecodeRun run;
  std::vector<int> ids;
  for (size_t s = 0; s < prompts.size(); ++s) ids.push_back(engine.add_sequence(config.max_seq));
  Tensor logits = engine.prefill(ids, prompts);
  run.logits.push_back(export_to(host, logits));
  // The last row of each sequence's prompt.
  std::vector<int32_t> next;
  int64_t row = -1;
  for (const auto& p : prompts) {
    row += static_cast<int64_t>(p.size());
    next.push_back(argmax_row(logits, row));
  }
  for (int step = 0; step <= kDecodeSteps; ++step) {
    // The last step decodes only the first sequence: T = 1 on a replica that has a sequence.
    const bool single = step == kDecodeSteps;
    std::vector<int> step_ids = single && !ids.empty() ? std::vector<int>{ids[0]} : ids;
    std::vector<int32_t> step_tokens = single && !next.empty() ? std::vector<int32_t>{next[0]} : next;
    run.fed.push_back(step_tokens);
    logits = engine.decode(step_ids, step_tokens);
    run.logits.push_back(export_to(host, logits));
    next.clear();
    for (int64_t r = 0; r < logits.dim(0); ++r) next.push_back(argmax_row(logits, r));
  }
  return run;
}

struct RowwiseCase {
  ModelFormat format;
  int tp, dp;
  PlacementKind placement = PlacementKind::Contiguous;
};

std::string case_name(const ::testing::TestParamInfo<RowwiseCase>& info) {
  const RowwiseCase& c = info.param;
  std::string f = c.format == ModelFormat::Expar     ? "ours"
                  : c.format == ModelFormat::QwenMoe ? "qwen"
                                                     : "gptoss";
  return f + "_TP" + std::to_string(c.tp) + "_DP" + std::to_string(c.dp) +
         (c.placement == PlacementKind::RoundRobin ? "_rr" : "");
}

class RowwiseDecode : public ::testing::TestWithParam<RowwiseCase> {};

TEST_P(RowwiseDecode, MatchesTheAllReduceDecode) {
  const RowwiseCase& p = GetParam();
  const Checkpoint& ck = checkpoint(p.format);
  const ModelConfig& config = ck.spec.config;
  // Full EP: ep_degree = TP*DP (EP enabled with ep_degree unset), experts whole on every rank.
  const InferenceLayout layout =
      make_layout(p.tp, p.dp, true, std::nullopt, config.moe.router.num_experts, p.placement);
  MemoryTracker& host = current_tracker();
  std::mutex mutex;
  std::vector<DecodeRun> allreduce(static_cast<size_t>(layout.world())), rowwise(allreduce.size());
  run_ranks(layout.world(), [&](Comm& world) {
    auto store = open_store(ck.spec);
    Engine a(layout, world, load_rank_weights(*store, ck.spec, layout, world.rank()));
    Engine b(layout, world, load_rank_weights(*store, ck.spec, layout, world.rank()),
             EngineOptions{DecodeMoe::Rowwise, {}});
    EXPECT_EQ(b.options().decode_moe, DecodeMoe::Rowwise);
    const auto prompts = prompts_of(a.dp_rank(), config.vocab);
    DecodeRun ra = greedy_run(a, prompts, config, host);
    b.tp_group().reset_stats();
    b.dp_group().reset_stats();
    DecodeRun rb = greedy_run(b, prompts, config, host);
    std::lock_guard lock(mutex);
    allreduce[static_cast<size_t>(world.rank())] = std::move(ra);
    rowwise[static_cast<size_t>(world.rank())] = std::move(rb);
  });
  for (int rank = 0; rank < layout.world(); ++rank) {
    const DecodeRun& ra = allreduce[static_cast<size_t>(rank)];
    const DecodeRun& rb = rowwise[static_cast<size_t>(rank)];
    ASSERT_EQ(ra.logits.size(), rb.logits.size());
    // Prefill does not depend on the decode mode: the same code, the same bits.
    ASSERT_EQ(ra.logits[0].shape(), rb.logits[0].shape());
    EXPECT_EQ(std::memcmp(ra.logits[0].raw(), rb.logits[0].raw(), ra.logits[0].nbytes()), 0)
        << "rank " << rank;
    for (size_t s = 1; s < ra.logits.size(); ++s)
      EXPECT_TRUE(close(rb.logits[s], ra.logits[s])) << "rank " << rank << " decode step " << s - 1;
    EXPECT_EQ(ra.fed, rb.fed) << "rank " << rank << ": greedy tokens differ";
  }
  // Replica 0 decoded three sequences (and replica 1 one): real work, not only padding.
  EXPECT_EQ(allreduce[0].fed.size(), static_cast<size_t>(kDecodeSteps + 1));
  EXPECT_EQ(allreduce[0].fed[0].size(), 3u);
}

std::vector<RowwiseCase> rowwise_cases() {
  std::vector<RowwiseCase> v;
  for (ModelFormat f : {ModelFormat::Expar, ModelFormat::QwenMoe, ModelFormat::GptOss})
    for (int tp = 1; tp <= 4; ++tp)
      for (int dp = 1; dp <= 2; ++dp) {
        if (f != ModelFormat::Expar && tp == 3) continue;  // keeps the sanitizer runs short
        v.push_back({f, tp, dp});
      }
  v.push_back({ModelFormat::Expar, 4, 1, PlacementKind::RoundRobin});
  v.push_back({ModelFormat::GptOss, 2, 2, PlacementKind::RoundRobin});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Layouts, RowwiseDecode, ::testing::ValuesIn(rowwise_cases()), case_name);

// Per decode step and layer the rowwise engine's TP group runs the attention all-reduce, the shared
// expert's reduce-scatter and the all-gather of the slices, and nothing runs on the DP group; the all-reduce
// engine runs two all-reduces (attention, MoE) per layer. Both add, once per step, the all-reduce of the
// vocabulary-parallel embedding and the all-gather of the LM head's logits slices.
TEST(RowwiseDecodeCollectives, PerDecodeStep) {
  const Checkpoint& ck = expar_checkpoint();
  const ModelConfig& config = ck.spec.config;
  const InferenceLayout layout = make_layout(2, 2, true, std::nullopt, config.moe.router.num_experts);
  const int layers = config.layers;
  run_ranks(layout.world(), [&](Comm& world) {
    auto store = open_store(ck.spec);
    for (DecodeMoe mode : {DecodeMoe::AllReduce, DecodeMoe::Rowwise}) {
      Engine engine(layout, world, load_rank_weights(*store, ck.spec, layout, world.rank()),
                    EngineOptions{mode, {}});
      const int id = engine.add_sequence(8);
      engine.prefill(std::vector<int>{id}, {{1, 2, 3}});
      engine.tp_group().reset_stats();
      engine.dp_group().reset_stats();
      engine.decode(std::vector<int>{id}, std::vector<int32_t>{4});
      const CommStats tp = engine.tp_group().stats(), dp = engine.dp_group().stats();
      if (mode == DecodeMoe::Rowwise) {
        EXPECT_EQ(tp.all_reduce, layers + 1);
        EXPECT_EQ(tp.all_gather_v, layers + 1);
        EXPECT_EQ(tp.reduce_scatter_v, layers);  // the shared expert (test_config has one)
        EXPECT_EQ(dp.all_gather_v + dp.reduce_scatter_v, 0);
      } else {
        EXPECT_EQ(tp.all_reduce, 2 * layers + 1);
        EXPECT_EQ(tp.all_gather_v, 1);
        EXPECT_EQ(dp.all_gather_v, layers);
        EXPECT_EQ(dp.reduce_scatter_v, layers);
      }
    }
  });
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RowwiseDecodeErrors, RefusesIntermediateShardedExpertsWithTheRuleAndTheFix) {
  const Checkpoint& ck = expar_checkpoint();
  const int experts = ck.spec.config.moe.router.num_experts;
  // Variable EP: TP 4 with ep_degree 2 shards every expert over 2 ranks.
  const InferenceLayout variable = make_layout(4, 1, true, 2, experts);
  std::string msg = error_of([&] { check_decode_moe(variable, DecodeMoe::Rowwise); });
  EXPECT_NE(msg.find("rowwise decode needs every expert whole on one rank"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ep_degree 2 shards each expert's intermediate dimension over 2 ranks"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("ep_degree 4 (or unset), or decode with allreduce"), std::string::npos) << msg;
  // No EP with TP 2: both ranks hold every expert's half.
  const InferenceLayout no_ep = make_layout(2, 1, false, std::nullopt, experts);
  msg = error_of([&] { check_decode_moe(no_ep, DecodeMoe::Rowwise); });
  EXPECT_NE(msg.find("with no EP shards each expert's intermediate dimension over 2 ranks"),
            std::string::npos)
      << msg;
  // The all-reduce decode takes both; a single rank and full EP take rowwise.
  EXPECT_NO_THROW(check_decode_moe(variable, DecodeMoe::AllReduce));
  EXPECT_NO_THROW(check_decode_moe(make_layout(1, 1, false, std::nullopt, experts), DecodeMoe::Rowwise));
  EXPECT_NO_THROW(check_decode_moe(make_layout(2, 2, true, std::nullopt, experts), DecodeMoe::Rowwise));
  // The engine refuses before any collective, on every rank.
  msg = error_of([&] {
    run_ranks(variable.world(), [&](Comm& world) {
      auto store = open_store(ck.spec);
      Engine e(variable, world, load_rank_weights(*store, ck.spec, variable, world.rank()),
               EngineOptions{DecodeMoe::Rowwise, {}});
    });
  });
  EXPECT_NE(msg.find("rowwise decode needs every expert whole"), std::string::npos) << msg;
  // And so does generate (what `expar generate --decode-moe rowwise` calls).
  GenerateOptions o;
  o.tp = 4;
  o.enable_expert_parallel = true;
  o.ep_degree = 2;
  o.decode_moe = DecodeMoe::Rowwise;
  msg = error_of([&] { generate(o, ck.dir.string(), {1, 2, 3}, 2); });
  EXPECT_NE(msg.find("rowwise decode needs every expert whole"), std::string::npos) << msg;
  msg = error_of([] { decode_moe_from_name("all-reduce"); });
  EXPECT_NE(msg.find("decode MoE mode 'all-reduce' is unknown: choose one of allreduce, rowwise"),
            std::string::npos)
      << msg;
  EXPECT_EQ(decode_moe_from_name("rowwise"), DecodeMoe::Rowwise);
  EXPECT_EQ(decode_moe_name(DecodeMoe::AllReduce), "allreduce");
}

// generate() (behind `expar generate --decode-moe`) gives the same tokens either way.
TEST(RowwiseDecodeGenerate, SameTokensAsAllReduce) {
  const Checkpoint& ck = gpt_oss_checkpoint();
  GenerateOptions o;
  o.tp = 2;
  o.dp = 2;
  o.enable_expert_parallel = true;
  const std::vector<int32_t> prompt = vocab_tokens(21, 5, ck.spec.config.vocab);
  const GenerateResult a = generate(o, ck.dir.string(), prompt, 6);
  o.decode_moe = DecodeMoe::Rowwise;
  const GenerateResult b = generate(o, ck.dir.string(), prompt, 6);
  EXPECT_EQ(a.tokens.size(), 6u);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_GT(b.decode_tokens_per_s, 0.0);
}

}  // namespace
}  // namespace expar::infer
