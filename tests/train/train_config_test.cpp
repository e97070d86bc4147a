// A TrainConfig the loop cannot run is an error naming the option, before any work: no SIGFPE (microbatches
// 0), no run that silently trains uphill (a negative learning rate) or with NaN coefficients.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"
#include "expar/train/trainer.hpp"

namespace expar {
namespace {

std::string error_of_run(const std::function<void(TrainConfig&)>& edit) {
  TrainConfig c;
  c.model = ModelConfig::preset("tiny");
  c.steps = 1;
  c.global_batch = 2;
  c.seq_len = 8;
  c.eval_every = 0;
  edit(c);
  static const TokenCorpus corpus = TokenCorpus::from_text(std::string(4096, 'a'));
  try {
    run_ranks(1, [&](Comm& world) { train(c, world, corpus); });
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TrainConfigChecks, ValuesTheLoopCannotUseAreNamed) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    std::function<void(TrainConfig&)> edit;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](TrainConfig& c) { c.microbatches = 0; }, "microbatches (--microbatches)=0 must be at least 1"},
      {[](TrainConfig& c) { c.lr = -1e-3; }, "learning rate (--lr) -0.001 must be a finite number > 0"},
      {[&](TrainConfig& c) { c.clip_norm = nan; }, "gradient clip norm (--clip; 0: off)=nan"},
      {[](TrainConfig& c) { c.warmup = -5; }, "warmup steps (--warmup)=-5 must not be negative"},
      {[&](TrainConfig& c) { c.model.moe.router.aux_loss_coef = nan; },
       "aux loss coefficient (--aux-coef)=nan"},
      {[](TrainConfig& c) { c.model.moe.router.z_loss_coef = -1; }, "z loss coefficient (--z-coef)=-1"},
      {[](TrainConfig& c) { c.seq_len = 1000; }, "exceeds the model's max_seq 64"},
  };
  for (const Case& c : cases) {
    const std::string m = error_of_run(c.edit);
    EXPECT_NE(m.find(c.expected), std::string::npos) << m;
  }
  EXPECT_EQ(error_of_run([](TrainConfig&) {}), "(no error)");
}

}  // namespace
}  // namespace expar
