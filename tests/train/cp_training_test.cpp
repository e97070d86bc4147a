// Context-parallel training (`expar train --cp C`, seed 000 Appendix F) on the threads backend:
//  - the loss curve (and the validation loss) at C = 2 equals C = 1 within 1e-4 per step: W = 2 as 1 x 2,
//    and W = 4 as D2 x C2 with EP folded over the D*C ranks (M_E = 4) on every path of the registry, with
//    microbatches and MoE recomputation;
//  - checkpoints are layout-independent: a save at C = 2 resumes at C = 1 and a save at C = 1 at C = 2,
//    continuing the uninterrupted curve;
//  - the layout printout names the CP and DenseGrad groups;
//  - a sequence length C does not divide, and a world C does not divide, are refused by name.
// Both router losses are on (the tiny preset's coefficients) and the aux-loss curve is compared too: the
// load-balancing loss is a product of statistics over the sequences of one rank's microbatch, so C = 1 is
// the run on as many ranks (its D = C times the CP run's), and the CP routers sum the statistics of each
// C = 1 microbatch over the CP group (MoeTransformer::set_context_parallel's loss batches). DeepSeek's
// sequence-wise form sums each sequence's statistics over the CP group and needs no such batches.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/temp_dir.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/paths/path.hpp"
#include "train/training_runs.hpp"

namespace expar {
namespace {

TrainConfig config(int cp, int ep, const std::string& path, int steps) {
  TrainConfig c = testing::small_config(ep, path, steps);
  EXPECT_GT(c.model.moe.router.aux_loss_coef, 0.0);
  EXPECT_GT(c.model.moe.router.z_loss_coef, 0.0);
  c.cp = cp;
  return c;
}

using testing::run_training;
using testing::TrainingRun;

void expect_same_curve(const std::vector<StepRecord>& curve, const std::vector<StepRecord>& base,
                       const std::string& what, size_t offset = 0) {
  ASSERT_EQ(curve.size() + offset, base.size()) << what;
  for (size_t i = 0; i < curve.size(); ++i) {
    const StepRecord& b = base[i + offset];
    EXPECT_NEAR(curve[i].loss, b.loss, 1e-4 * b.loss) << what << " step " << i + offset;
    EXPECT_NEAR(curve[i].aux_loss, b.aux_loss, 1e-4 * b.aux_loss) << what << " step " << i + offset;
    EXPECT_NEAR(curve[i].z_loss, b.z_loss, 1e-4 * b.z_loss) << what << " step " << i + offset;
    EXPECT_NEAR(curve[i].grad_norm, b.grad_norm, 1e-3 * b.grad_norm) << what << " step " << i + offset;
    if (b.val_loss >= 0) {
      EXPECT_NEAR(curve[i].val_loss, b.val_loss, 1e-4 * b.val_loss) << what;
    }
  }
}

TEST(CpTraining, TwoChunksGiveTheLossCurveOfWholeSequences) {
  const int steps = 6;
  const TrainingRun base = run_training(2, config(1, 2, "rowwise", steps));
  ASSERT_EQ(base.steps.size(), static_cast<size_t>(steps));
  EXPECT_LT(base.steps.back().loss, base.steps.front().loss);  // it learns
  ASSERT_GE(base.steps.back().val_loss, 0.0);
  const TrainingRun cp =
      run_training(2, config(2, 2, "rowwise", steps));  // D = 1, C = 2: EP over the two chunks
  expect_same_curve(cp.steps, base.steps, "W=2 C=2 M_E=2");
  const TrainingRun local = run_training(2, config(2, 1, "local", steps));
  expect_same_curve(local.steps, base.steps, "W=2 C=2 M_E=1 local");
}

// A strong load-balancing loss (coefficient 1, 100 times the preset's) so that its gradient moves the
// loss curve itself: per-chunk statistics would change the training loss and gradient norm, not only the
// reported aux loss.
TEST(CpTraining, TheLoadBalancingLossSeesWholeSequences) {
  const int steps = 6;
  auto strong = [&](int cp, int ep, const std::string& path) {
    TrainConfig c = config(cp, ep, path, steps);
    c.model.moe.router.aux_loss_coef = 1.0;
    return c;
  };
  const TrainingRun base = run_training(2, strong(1, 2, "rowwise"));
  expect_same_curve(run_training(2, strong(2, 2, "rowwise")).steps, base.steps, "W=2 C=2 aux 1");
  TrainConfig accumulated = strong(2, 4, "block");  // D2 x C2, M_E = 4, with 2 microbatches
  accumulated.microbatches = 2;
  const TrainingRun base_accumulated = [&] {
    TrainConfig c = strong(1, 2, "rowwise");
    c.microbatches = 2;
    return run_training(4, c);
  }();
  expect_same_curve(run_training(4, accumulated).steps, base_accumulated.steps, "W=4 D2 C2 2 mb aux 1");
}

// DeepSeek's sequence-wise load-balancing loss (RouterConfig::aux_loss_kind Sequence), strong as above: each
// sequence's statistics are summed over the CP group, so C = 2 gives the curve of whole sequences; and a
// batch that is not whole C = 1 microbatches (3 sequences on W = 2) trains, since the loss is per sequence.
TEST(CpTraining, TheSequenceWiseLoadBalancingLossSeesWholeSequences) {
  const int steps = 6;
  auto strong = [&](int cp) {
    TrainConfig c = config(cp, 2, "rowwise", steps);
    c.model.moe.router.aux_loss_coef = 1.0;
    c.model.moe.router.aux_loss_kind = AuxLossKind::Sequence;
    return c;
  };
  const TrainingRun base = run_training(2, strong(1));
  expect_same_curve(run_training(2, strong(2)).steps, base.steps, "W=2 C=2 sequence-wise aux 1");
  TrainConfig odd = strong(2);
  odd.global_batch = 3;
  odd.steps = 1;
  EXPECT_EQ(run_training(2, odd).steps.size(), 1u);
}

TEST(CpTraining, EpFoldedOverDTimesCOnEveryPathGivesTheSameCurve) {
  const int steps = 5;
  const TrainingRun base = run_training(4, config(1, 2, "rowwise", steps));
  for (const std::string& path : path_names()) {
    if (path == "local" || path_traits(path).decode_form) continue;         // M_E = 1; decode only
    const TrainingRun folded = run_training(4, config(2, 4, path, steps));  // D2 x C2, M_E = 4 = D*C, D_E = 1
    expect_same_curve(folded.steps, base.steps, "W=4 D2 C2 M_E=4 " + path);
  }
  TrainConfig composed = config(2, 2, "rowwise", steps);  // M_E = 2: EP_MP {0,1}: one CP group
  composed.microbatches = 2;
  composed.execution.recompute_every_moe = true;
  const TrainingRun with_both = run_training(4, composed);
  TrainConfig composed_base = config(1, 2, "rowwise", steps);
  composed_base.microbatches = 2;
  expect_same_curve(with_both.steps, run_training(4, composed_base).steps,
                    "W=4 D2 C2 M_E=2, 2 microbatches, recomputed MoE");
  EXPECT_NE(
      with_both.layout.find("CP groups (chunks of the same sequences; gather keys and values): {0,1} {2,3}"),
      std::string::npos)
      << with_both.layout;
  EXPECT_NE(with_both.layout.find("DenseGrad group (reduce dense gradients over D*C): {0,1,2,3}"),
            std::string::npos)
      << with_both.layout;
  EXPECT_NE(with_both.layout.find("rank 3: (DP 1, CP 1) (EP_DP 1, EP_MP 1)"), std::string::npos)
      << with_both.layout;
}

TEST(CpTraining, CheckpointsResumeAcrossCpDegrees) {
  const test::TempDir temp("cp_resume");
  const auto dir = temp / "checkpoint";
  const int steps = 6, stop = 3;
  const TrainingRun full = run_training(2, config(1, 2, "rowwise", steps));
  for (const auto& [save_cp, resume_cp] : {std::pair{2, 1}, std::pair{1, 2}}) {
    std::filesystem::remove_all(dir);
    TrainConfig first = config(save_cp, 2, "rowwise", steps);
    first.stop_after = stop;
    first.checkpoint_dir = dir.string();
    const TrainingRun head = run_training(2, first);
    const std::string what =
        "saved at C=" + std::to_string(save_cp) + ", resumed at C=" + std::to_string(resume_cp);
    expect_same_curve(head.steps, {full.steps.begin(), full.steps.begin() + stop}, what + " (head)");
    TrainConfig second = config(resume_cp, 2, "rowwise", steps);
    second.resume_from = dir.string();
    const TrainingRun tail = run_training(2, second);
    expect_same_curve(tail.steps, full.steps, what, stop);
  }
}

std::string error_of(int ranks, const TrainConfig& cfg) {
  try {
    run_training(ranks, cfg);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CpTraining, RefusesASplitThatDoesNotDivide) {
  TrainConfig odd = config(2, 1, "local", 1);
  odd.seq_len = 15;
  const std::string seq = error_of(2, odd);
  EXPECT_NE(
      seq.find("sequence length (--seq-len) 15 is not divisible by the context-parallel degree C=2 (--cp)"),
      std::string::npos)
      << seq;
  // Only the C that also divide the 2 ranks are suggested; each suggestion trains.
  EXPECT_NE(seq.find("choose --seq-len a multiple of 2 (up to max_seq 64), or set --cp 1"), std::string::npos)
      << seq;
  TrainConfig fixed = odd;
  fixed.seq_len = 16;
  EXPECT_EQ(run_training(2, fixed).steps.size(), 1u);
  fixed = odd;
  fixed.cp = 1;
  EXPECT_EQ(run_training(2, fixed).steps.size(), 1u);
  const std::string world = error_of(3, config(2, 1, "local", 1));
  EXPECT_NE(world.find("world size W=3 is not divisible by C*TP*PP=2*1*1=2"), std::string::npos) << world;
  // A C = 1 rank's microbatch would be 3/2 sequences: no C = 1 run for the load-balancing loss to equal.
  TrainConfig half = config(2, 1, "local", 1);
  half.global_batch = 3;
  const std::string aux = error_of(2, half);
  EXPECT_NE(aux.find("global batch 3 is not divisible by ranks 2 x microbatches 1: with --cp 2 the "
                     "load-balancing loss (--aux-coef 0.01)"),
            std::string::npos)
      << aux;
  EXPECT_NE(aux.find("choose --batch a multiple of 2, or --aux-coef 0"), std::string::npos) << aux;
  half.model.moe.router.aux_loss_coef = 0.0;  // the z-loss alone is a mean over tokens: it trains
  EXPECT_EQ(run_training(2, half).steps.size(), 1u);
  const std::string ep = error_of(2, config(2, 4, "rowwise", 1));
  EXPECT_NE(ep.find("EP_MP degree M_E=4 does not divide the D*C*TP=1*2*1=2 ranks"), std::string::npos) << ep;
}

}  // namespace
}  // namespace expar
