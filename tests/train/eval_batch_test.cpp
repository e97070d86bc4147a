// A validation batch larger than a training microbatch: the rowwise path's shared lease pool is sized for the
// larger of the two (it once was sized for the microbatch only, and the final evaluation failed with "needs N
// bytes per symmetric slot but the shared lease pool has slots of M bytes"). Rowwise and block must also
// agree on the validation loss bit for bit, as they do on training losses.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "expar/comm/launcher.hpp"
#include "expar/train/trainer.hpp"

namespace expar {
namespace {

const TokenCorpus& corpus() {
  static const TokenCorpus c = [] {
    std::string text;
    for (int i = 0; i < 200; ++i) text += "And the evening and the morning were the first day. ";
    return TokenCorpus::from_text(text);
  }();
  return c;
}

TrainSummary run(const std::string& path) {
  TrainConfig c;
  c.model = ModelConfig::preset("tiny");
  c.ep = 2;
  c.execution.moe.path = path;
  c.steps = 2;
  c.global_batch = 4;  // 2 sequences per rank, 2 microbatches: 1 sequence per forward
  c.microbatches = 2;
  c.seq_len = 32;
  c.eval_every = 1;
  c.eval_sequences = 16;  // 8 sequences per rank: 8x the training microbatch
  TrainSummary rank0;
  LaunchOptions o;
  o.ranks = 2;
  o.timeout_seconds = 120;
  run_ranks(o, [&](Comm& world) {
    TrainSummary s = train(c, world, corpus());
    if (world.rank() == 0) rank0 = s;
  });
  return rank0;
}

TEST(TrainEvalBatch, ValidationLargerThanAMicrobatchRunsOnRowwiseAndMatchesBlock) {
  const TrainSummary rowwise = run("rowwise");
  const TrainSummary block = run("block");
  ASSERT_EQ(rowwise.steps.size(), 2u);
  ASSERT_EQ(block.steps.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(std::isfinite(rowwise.steps[i].val_loss)) << i;
    EXPECT_GT(rowwise.steps[i].val_loss, 0.0) << i;
    EXPECT_EQ(rowwise.steps[i].val_loss, block.steps[i].val_loss) << "step " << i;
    EXPECT_EQ(rowwise.steps[i].loss, block.steps[i].loss) << "step " << i;
  }
}

}  // namespace
}  // namespace expar
