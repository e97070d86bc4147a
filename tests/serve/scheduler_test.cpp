// The scheduler alone (no engine): admission by context and KV budget, first-come-first-served waiting,
// prompt chunks at fixed offsets, decode before prefill, the step's phase, cancellation and DP spreading.
#include "expar/serve/scheduler.hpp"

#include <gtest/gtest.h>

#include "expar/serve/api_error.hpp"

namespace expar::serve {
namespace {

GenerationRequest request(int prompt, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt.assign(static_cast<size_t>(prompt), 7);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0;
  return r;
}

// Every sampling sequence of `plan` gets token 1.
StepTokens ones(const StepPlan& plan) {
  StepTokens t(plan.replicas.size());
  for (size_t r = 0; r < plan.replicas.size(); ++r)
    for (const SequenceStep& s : plan.replicas[r].sequences)
      if (s.sample) t[r].tokens.push_back(1);
  return t;
}

int status_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    return e.status();
  }
  return 0;
}

TEST(Scheduler, RefusesWhatCanNeverRun) {
  Metrics m;
  Scheduler s({}, 1, /*kv_tokens=*/50, /*max_seq=*/64, m);
  EXPECT_EQ(status_of([&] { s.submit(request(0, 4)); }), 400);    // empty prompt
  EXPECT_EQ(status_of([&] { s.submit(request(60, 5)); }), 400);   // beyond the context
  EXPECT_EQ(status_of([&] { s.submit(request(30, 25)); }), 400);  // more KV than the replica holds
  EXPECT_EQ(status_of([&] { s.submit(request(3, 0)); }), 400);    // max_tokens < 1
  EXPECT_EQ(status_of([&] { s.submit(request(30, 20)); }), 0);    // exactly the KV budget
}

TEST(Scheduler, QueueBoundGives503) {
  Metrics m;
  SchedulerOptions o;
  o.max_waiting = 2;
  Scheduler s(o, 1, 1000, 64, m);
  s.submit(request(4, 4));
  s.submit(request(4, 4));
  EXPECT_EQ(status_of([&] { s.submit(request(4, 4)); }), 503);
}

TEST(Scheduler, KvBudgetMakesRequestsWaitInOrder) {
  Metrics m;
  Scheduler s({}, 1, /*kv_tokens=*/100, 64, m);
  auto a = s.submit(request(10, 30));  // 40 positions
  auto b = s.submit(request(10, 30));
  auto c = s.submit(request(10, 30));
  auto d = s.submit(request(1, 1));  // would fit, but must not overtake c
  std::optional<StepPlan> plan = s.next_step();
  ASSERT_TRUE(plan);
  ASSERT_EQ(plan->replicas[0].add.size(), 2u);
  EXPECT_EQ(plan->replicas[0].add[0].second, 40);
  s.complete_step(*plan, ones(*plan));
  for (int step = 0; step < 29; ++step) {  // a and b decode their remaining 29 tokens; c and d wait
    plan = s.next_step();
    ASSERT_TRUE(plan);
    EXPECT_TRUE(plan->replicas[0].add.empty()) << "step " << step;
    s.complete_step(*plan, ones(*plan));
  }
  EXPECT_EQ(a->finish_reason(), FinishReason::Length);
  EXPECT_EQ(b->finish_reason(), FinishReason::Length);
  EXPECT_EQ(a->generated(), 30u);
  plan = s.next_step();  // a and b removed, c and d admitted in order
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->replicas[0].remove.size(), 2u);
  ASSERT_EQ(plan->replicas[0].add.size(), 2u);
  EXPECT_EQ(plan->replicas[0].sequences[0].tokens.size(), 10u);  // c's prompt
  EXPECT_EQ(plan->replicas[0].sequences[1].tokens.size(), 1u);   // d's prompt
}

TEST(Scheduler, PromptChunksAtFixedOffsetsAndDecodeFirst) {
  Metrics m;
  SchedulerOptions o;
  o.prefill_chunk = 8;
  o.max_batch_tokens = 12;
  Scheduler s(o, 1, 1000, 64, m);
  auto a = s.submit(request(3, 5));
  std::optional<StepPlan> p1 = s.next_step();
  ASSERT_TRUE(p1);
  EXPECT_TRUE(p1->prefill);
  s.complete_step(*p1, ones(*p1));
  auto b = s.submit(request(20, 2));
  std::optional<StepPlan> p2 = s.next_step();  // a decodes (1) + b's first chunk (8): 9 <= 12
  ASSERT_TRUE(p2);
  ASSERT_EQ(p2->replicas[0].sequences.size(), 2u);
  EXPECT_EQ(p2->replicas[0].sequences[0].tokens.size(), 1u);
  EXPECT_TRUE(p2->replicas[0].sequences[0].sample);
  EXPECT_EQ(p2->replicas[0].sequences[0].index, 1u);
  EXPECT_EQ(p2->replicas[0].sequences[1].tokens.size(), 8u);
  EXPECT_FALSE(p2->replicas[0].sequences[1].sample);
  EXPECT_TRUE(p2->prefill);
  s.complete_step(*p2, ones(*p2));
  std::optional<StepPlan> p3 = s.next_step();  // b's second chunk: 8 more, still no sample
  ASSERT_TRUE(p3);
  EXPECT_EQ(p3->replicas[0].sequences[1].tokens.size(), 8u);
  EXPECT_FALSE(p3->replicas[0].sequences[1].sample);
  s.complete_step(*p3, ones(*p3));
  std::optional<StepPlan> p4 = s.next_step();  // the last 4 prompt tokens sample b's first token
  ASSERT_TRUE(p4);
  EXPECT_EQ(p4->replicas[0].sequences[1].tokens.size(), 4u);
  EXPECT_TRUE(p4->replicas[0].sequences[1].sample);
  EXPECT_EQ(p4->replicas[0].sequences[1].index, 0u);
  s.complete_step(*p4, ones(*p4));
  std::optional<StepPlan> p5 = s.next_step();  // only decodes left: a decode step
  ASSERT_TRUE(p5);
  EXPECT_FALSE(p5->prefill);
}

TEST(Scheduler, CancelRemovesAtTheNextStep) {
  Metrics m;
  Scheduler s({}, 1, 1000, 64, m);
  auto a = s.submit(request(4, 10));
  std::optional<StepPlan> p = s.next_step();
  ASSERT_TRUE(p);
  const int64_t slot = p->replicas[0].add.at(0).first;
  s.complete_step(*p, ones(*p));
  a->cancel();
  p = s.next_step();
  ASSERT_TRUE(p);
  EXPECT_EQ(a->finish_reason(), FinishReason::Cancelled);
  ASSERT_EQ(p->replicas[0].remove.size(), 1u);
  EXPECT_EQ(p->replicas[0].remove[0], slot);
  EXPECT_FALSE(p->runs_engine);
  s.stop(false);
  EXPECT_FALSE(s.next_step().has_value());
}

TEST(Scheduler, SpreadsOverReplicasAndPadsIdleOnes) {
  Metrics m;
  Scheduler s({}, 2, 1000, 64, m);
  s.submit(request(4, 10));
  s.submit(request(4, 10));
  std::optional<StepPlan> p = s.next_step();
  ASSERT_TRUE(p);
  ASSERT_EQ(p->replicas.size(), 2u);
  EXPECT_EQ(p->replicas[0].sequences.size(), 1u);
  EXPECT_EQ(p->replicas[1].sequences.size(), 1u);
  s.complete_step(*p, ones(*p));
  Scheduler one({}, 2, 1000, 64, m);
  one.submit(request(4, 3));
  p = one.next_step();
  ASSERT_TRUE(p);
  EXPECT_EQ(p->replicas[0].sequences.size(), 1u);
  EXPECT_TRUE(p->replicas[1].sequences.empty());  // replica 1 runs the dummy step
  EXPECT_TRUE(p->runs_engine);
}

}  // namespace
}  // namespace expar::serve
