// The multi-group gradient reducer: buckets never mix reduction groups, and the reduced gradients of an EP
// training step (M_E = 2 and 4 on 4 ranks) equal those of the same step without EP (M_E = 1), for dense
// parameters and for every routed expert.
#include "expar/train/grad_reducer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>

#include "expar/comm/launcher.hpp"
#include "expar/model/moe_transformer.hpp"
#include "expar/topo/training_layout.hpp"
#include "expar/train/data.hpp"

namespace expar {
namespace {

TEST(GradReducer, BucketsNeverMixGroupsAndRespectTheSize) {
  run_ranks(1, [](Comm& world) {
    std::vector<Parameter> params;
    for (int i = 0; i < 6; ++i)
      params.push_back(
          make_parameter(fmt::format("p{}", i), {10}, i % 2 ? ParamKind::Expert : ParamKind::Dense));
    params.push_back(make_parameter("big", {100}, ParamKind::Dense));
    std::vector<Parameter*> ptrs;
    for (auto& p : params) ptrs.push_back(&p);
    GradReducer reducer(ptrs, world, world, 25 * sizeof(float), 1);
    size_t covered = 0;
    for (int b = 0; b < reducer.bucket_count(); ++b) {
      size_t elements = 0;
      for (size_t i : reducer.bucket(b)) {
        EXPECT_EQ(params[i].kind, reducer.bucket_kind(b)) << "bucket " << b << " mixes groups";
        elements += static_cast<size_t>(params[i].grad.numel());
      }
      EXPECT_TRUE(elements <= 25 || reducer.bucket(b).size() == 1) << "bucket " << b << " is over the size";
      covered += reducer.bucket(b).size();
    }
    EXPECT_EQ(covered, params.size());
    // 25 floats per bucket: dense {p0,p2} (20), {p4} (p4 would make 30), {big} (100, alone); expert {p1,p3},
    // {p5}.
    EXPECT_EQ(reducer.bucket_count(), 5);
  });
}

// name -> reduced gradient; routed experts under their global names ("layers.0.moe.experts.5.w1").
using Grads = std::map<std::string, std::vector<float>>;

Grads reduced_step(int ep) {
  Grads out;
  std::mutex m;
  TokenCorpus corpus = TokenCorpus::from_text([] {
    std::string t;
    for (int i = 0; i < 300; ++i) t += "In the beginning God created the heaven and the earth. ";
    return t;
  }());
  run_ranks(4, [&](Comm& world) {
    TrainingLayout layout(4, ep);
    auto dp = world.subgroup(layout.groups(TrainingGroup::Dp), "dp");
    auto ep_mp = world.subgroup(layout.groups(TrainingGroup::EpMp), "ep_mp");
    auto ep_dp = world.subgroup(layout.groups(TrainingGroup::EpDp), "ep_dp");
    ModelExecution execution;
    execution.moe.path = ep == 1 ? "local" : "rowwise";
    MoeTransformer model(ModelConfig::preset("tiny"), execution, *ep_mp);
    model.init(3);
    model.zero_grads();
    TokenBatch batch = training_batch(corpus, 1, 0, 8, world.rank() * 2, 2, 16);
    model.forward_backward(batch.inputs, batch.targets, 2, 16, 32);
    std::vector<Parameter*> ptrs;
    for (auto& p : model.parameters()) ptrs.push_back(&p);
    GradReducer reducer(ptrs, *dp, *ep_dp, 1 << 12, layout.dp);
    reducer.reduce();
    const auto& placement = model.moe(0).placement();
    std::lock_guard lock(m);
    for (auto& p : model.parameters()) {
      const float* g = p.grad.data<float>();
      if (p.kind == ParamKind::Dense) {
        if (world.rank() == 0) out[p.name].assign(g, g + p.grad.numel());
        continue;
      }
      const int64_t per = p.grad.numel() / placement.local_count();
      for (int l = 0; l < placement.local_count(); ++l) {
        const int e = placement.global_expert(ep_mp->rank(), l);
        const std::string name = fmt::format("{}.{}", p.name, e);
        std::vector<float> v(g + l * per, g + (l + 1) * per);
        if (out.count(name)) {
          EXPECT_EQ(out[name], v) << name << ": EP_DP replicas disagree after the reduction";
        } else {
          out[name] = std::move(v);
        }
      }
    }
  });
  return out;
}

TEST(GradReducer, EpStepGradientsEqualThoseWithoutEp) {
  Grads plain = reduced_step(1);
  for (int ep : {2, 4}) {
    Grads with_ep = reduced_step(ep);
    ASSERT_EQ(with_ep.size(), plain.size());
    for (const auto& [name, want] : plain) {
      const auto& got = with_ep.at(name);
      ASSERT_EQ(got.size(), want.size()) << name;
      float scale = 0;
      for (float w : want) scale = std::max(scale, std::fabs(w));
      ASSERT_GT(scale, 0.0f) << name << " has a zero gradient";
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-5f * scale + 1e-9f) << name << "[" << i << "] M_E=" << ep;
    }
  }
}

}  // namespace
}  // namespace expar
