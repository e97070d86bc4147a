// Engine::prefill's PrefillLogits: LastRow computes the LM head for the last new row of each sequence only,
// and gives exactly those rows of AllRows' logits; the embedding and LM head are vocabulary-parallel over TP.
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>

#include "expar/core/matmul.hpp"
#include "expar/infer/engine.hpp"
#include "infer_test_util.hpp"

namespace expar::infer {
namespace {

namespace fs = std::filesystem;
using testing::make_layout;
using testing::random_tokens;
using testing::test_config;

const fs::path& checkpoint() {
  static const fs::path dir = testing::write_test_checkpoint("prefill_logits", 5, 2);
  return dir;
}

struct Case {
  int tp, dp;
};

class PrefillLogitsLayouts : public ::testing::TestWithParam<Case> {};

TEST_P(PrefillLogitsLayouts, LastRowIsTheLastRowOfEachSequence) {
  const ModelConfig config = test_config();
  const InferenceLayout layout =
      make_layout(GetParam().tp, GetParam().dp, true, std::nullopt, config.moe.router.num_experts);
  const std::vector<std::vector<int32_t>> prompts{random_tokens(1, 7), random_tokens(2, 1),
                                                  random_tokens(3, 12)};
  run_ranks(layout.world(), [&](Comm& world) {
    // Both calls see row counts with the same bits (multiples of batch_invariant_rows() after padding):
    // equal, not close.
    set_matmul_min_rows(batch_invariant_rows());
    auto store = ExparCheckpointStore::open(checkpoint());
    Engine engine(layout, world,
                  load_rank_weights(*store, expar_weight_names(), store->model(), layout, world.rank()));
    // This TP rank's vocabulary slice (256 tokens over TP 3: 85, 85, 86).
    const int tp = layout.tp(), t = layout.rank_info(world.rank()).tp_rank;
    EXPECT_EQ(engine.weights().vocab_begin, config.vocab * t / tp);
    EXPECT_EQ(engine.weights().embed.dim(0), config.vocab * (t + 1) / tp - config.vocab * t / tp);
    EXPECT_EQ(engine.weights().lm_head.dim(0), engine.weights().embed.dim(0));
    std::vector<int> all_ids, last_ids;
    for (size_t s = 0; s < prompts.size(); ++s) {
      all_ids.push_back(engine.add_sequence(config.max_seq));
      last_ids.push_back(engine.add_sequence(config.max_seq));
    }
    const Tensor all = engine.prefill(all_ids, prompts, PrefillLogits::AllRows);
    const Tensor last = engine.prefill(last_ids, prompts, PrefillLogits::LastRow);
    ASSERT_EQ(all.shape(), (Shape{20, config.vocab}));
    ASSERT_EQ(last.shape(), (Shape{3, config.vocab}));
    int64_t end = 0;
    for (size_t s = 0; s < prompts.size(); ++s) {
      end += static_cast<int64_t>(prompts[s].size());
      EXPECT_EQ(std::memcmp(last.data<float>() + static_cast<int64_t>(s) * config.vocab,
                            all.data<float>() + (end - 1) * config.vocab, sizeof(float) * config.vocab),
                0)
          << "sequence " << s << ", rank " << world.rank();
    }
    // The sequences continue alike: LastRow filled the same KV cache.
    const Tensor a = engine.decode(all_ids, std::vector<int32_t>{4, 5, 6});
    const Tensor b = engine.decode(last_ids, std::vector<int32_t>{4, 5, 6});
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
  });
}

INSTANTIATE_TEST_SUITE_P(Infer, PrefillLogitsLayouts,
                         ::testing::Values(Case{1, 1}, Case{2, 1}, Case{3, 1}, Case{2, 2}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return "TP" + std::to_string(info.param.tp) + "_DP" +
                                  std::to_string(info.param.dp);
                         });

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PrefillLogits, RefusesAnEmptySequenceForLastRowAndTokensOutsideTheVocabulary) {
  const ModelConfig config = test_config();
  const InferenceLayout layout = make_layout(2, 1, true, std::nullopt, config.moe.router.num_experts);
  std::mutex mutex;
  std::vector<std::string> empty, outside;
  run_ranks(layout.world(), [&](Comm& world) {
    auto store = ExparCheckpointStore::open(checkpoint());
    Engine engine(layout, world,
                  load_rank_weights(*store, expar_weight_names(), store->model(), layout, world.rank()));
    const int id = engine.add_sequence(8);
    // Both checks run before any collective, on every rank alike.
    const std::string e1 =
        error_of([&] { engine.prefill(std::vector<int>{id}, {{}}, PrefillLogits::LastRow); });
    const std::string e2 = error_of([&] { engine.prefill(std::vector<int>{id}, {{1, 256}}); });
    std::lock_guard lock(mutex);
    empty.push_back(e1);
    outside.push_back(e2);
  });
  for (const std::string& e : empty)
    EXPECT_NE(e.find("adds no tokens but its last row"), std::string::npos) << e;
  for (const std::string& e : outside)
    EXPECT_NE(e.find("token 256 is outside the vocabulary [0, 256)"), std::string::npos) << e;
}

}  // namespace
}  // namespace expar::infer
