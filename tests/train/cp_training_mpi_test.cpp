// Context-parallel training under Open MPI (processes; the all-gather of keys and values and the
// reduce-scatter of their gradients over MPI collectives): on W = 2, 3, 4 processes, C = W (every rank holds
// one chunk of every sequence, EP over all W chunks) gives the loss curve of C = 1 on the same processes
// within 1e-4 per step, with the load-balancing and z losses on (the routers sum each C = 1 microbatch's
// statistics over the CP group; docs/training.md), the aux-loss curve included.
#include <gtest/gtest.h>

#include "comm/mpi_test_main.hpp"
#include "expar/train/trainer.hpp"

namespace expar {
namespace {

using expar::testing::mpi_world;

TrainConfig config(int cp, int ep) {
  TrainConfig c;
  c.model = ModelConfig::preset("tiny");
  c.model.moe.router.aux_loss_coef = 0.1;  // ten times the preset's: its gradient moves the curve
  c.model.moe.router.num_experts = 12;     // M_E = W = 2, 3, 4
  c.cp = cp;
  c.ep = ep;
  c.execution.moe.path = "rowwise";
  c.steps = 4;
  c.global_batch = 12;  // divisible by D = 1 .. 4
  c.seq_len = 24;       // divisible by C = 2, 3, 4
  c.warmup = 1;
  c.lr = 5e-3;
  c.eval_every = 0;
  c.eval_sequences = 12;  // the same validation sequences for D = 1 .. 4
  return c;
}

TEST(CpTrainingMpi, EveryRankAChunkGivesTheWholeSequenceCurve) {
  static const TokenCorpus corpus = [] {
    std::string text;
    for (int i = 0; i < 120; ++i) text += "And the evening and the morning were the first day. ";
    return TokenCorpus::from_text(text);
  }();
  const int w = mpi_world().size();
  const TrainSummary base = train(config(1, w), mpi_world(), corpus);
  const TrainSummary cp = train(config(w, w), mpi_world(), corpus);
  ASSERT_EQ(base.steps.size(), 4u);
  ASSERT_EQ(cp.steps.size(), base.steps.size());
  for (size_t i = 0; i < base.steps.size(); ++i) {
    EXPECT_NEAR(cp.steps[i].loss, base.steps[i].loss, 1e-4 * base.steps[i].loss)
        << "C=" << w << " step " << i;
    EXPECT_NEAR(cp.steps[i].aux_loss, base.steps[i].aux_loss, 1e-4 * base.steps[i].aux_loss)
        << "C=" << w << " step " << i;
    EXPECT_NEAR(cp.steps[i].grad_norm, base.steps[i].grad_norm, 1e-3 * base.steps[i].grad_norm)
        << "C=" << w << " step " << i;
  }
  EXPECT_NEAR(cp.final_val_loss, base.final_val_loss, 1e-4 * base.final_val_loss);
}

}  // namespace
}  // namespace expar

int main(int argc, char** argv) {
  return expar::testing::mpi_test_main(argc, argv);
}
