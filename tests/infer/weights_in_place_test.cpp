// load_rank_weights uses F32 row ranges of a mapped checkpoint in place (views charged to
// MemCategory::MappedWeights, no copy) and copies only what must change layout (stacked experts, column
// shards); the mapping lives as long as a weight views it.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "expar/infer/rank_weights.hpp"
#include "hf_test_models.hpp"

namespace expar::infer {
namespace {

using namespace testing;

// Whether this process maps a file under `dir` (/proc/self/maps).
bool maps_file_under(const fs::path& dir) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(dir.string()) != std::string::npos) return true;
  return false;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(WeightsInPlace, DenseRowsAreViewsOfTheFileAndExpertsOneCopy) {
  const HfTestModel m = mixtral_test_model();
  const fs::path dir = temp_dir("in_place");
  RemoveTempDirs::dirs().push_back(dir);
  m.write(dir, size_t{1} << 30);  // one shard
  const ModelSpec spec = open_model_spec(dir.string());
  for (int tp : {1, 2}) {
    const InferenceLayout layout = make_layout(tp, 1, true, std::nullopt, static_cast<int>(m.experts));
    MemoryTracker tracker;
    TrackerBinding bind(tracker);
    {
      RankWeights w;
      {
        std::unique_ptr<TensorStore> store = open_store(spec);
        w = load_rank_weights(*store, spec, layout, 0);
      }
      // The store is gone; the weights used in place keep the file mapped.
      EXPECT_TRUE(maps_file_under(dir)) << "TP " << tp;
      const RankWeights& cw = w;
      const LayerWeights& l0 = cw.layers[0];
      for (const Tensor* t : {&cw.embed, &cw.lm_head, &cw.final_norm, &l0.attn_norm, &l0.attn.wq, &l0.attn.wk,
                              &l0.attn.wv, &l0.router})
        EXPECT_EQ(t->category(), MemCategory::MappedWeights) << "TP " << tp;
      // Wo's columns of the local heads are a strided copy under TP; whole at TP 1.
      EXPECT_EQ(l0.attn.wo.category(), tp == 1 ? MemCategory::MappedWeights : MemCategory::DenseWeights);
      EXPECT_EQ(l0.experts.w1.category(), MemCategory::ExpertWeights);
      // The views read the checkpoint's values: TP rank 0's rows.
      EXPECT_TRUE(same_bytes(w.embed, m.tensors.at("model.embed_tokens.weight").rows(0, m.vocab / tp)));
      EXPECT_TRUE(same_bytes(
          l0.attn.wq,
          m.tensors.at(m.layer(0) + "self_attn.q_proj.weight").rows(0, m.heads * m.head_dim / tp)));
      // Where every byte is: the views are charged to MappedWeights, the copies to their categories.
      int64_t mapped = 0;
      for (const Tensor* t : {&w.embed, &w.lm_head, &w.final_norm})
        mapped += static_cast<int64_t>(t->nbytes());
      for (const LayerWeights& l : cw.layers) {
        for (const Tensor* t : {&l.attn_norm, &l.mlp_norm, &l.attn.wq, &l.attn.wk, &l.attn.wv, &l.router})
          mapped += static_cast<int64_t>(t->nbytes());
        if (tp == 1) mapped += static_cast<int64_t>(l.attn.wo.nbytes());
      }
      const MemorySnapshot s = tracker.snapshot();
      EXPECT_EQ(s.current_of(MemCategory::MappedWeights), mapped) << "TP " << tp;
      int64_t experts = 0;
      for (const LayerWeights& l : w.layers)
        experts +=
            static_cast<int64_t>(l.experts.w1.nbytes() + l.experts.w3.nbytes() + l.experts.w2.nbytes());
      EXPECT_EQ(s.current_of(MemCategory::ExpertWeights), experts) << "TP " << tp;
    }
    // Nothing views the file any more: it is unmapped, and nothing stays charged.
    EXPECT_FALSE(maps_file_under(dir)) << "TP " << tp;
    EXPECT_EQ(tracker.snapshot().current_of(MemCategory::MappedWeights), 0);
    EXPECT_EQ(tracker.snapshot().total_current, 0);
  }
}

}  // namespace
}  // namespace expar::infer
