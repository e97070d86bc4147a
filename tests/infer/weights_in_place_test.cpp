// load_rank_weights keeps the embedding table's F32 rows of a mapped checkpoint in place (a view charged to
// MemCategory::MappedWeights: a step gathers one row per token) and copies every weight a step streams
// whole (DenseWeights: attention, norms, router, LM head; ExpertWeights: the stacked experts), giving the
// file pages it read back; the mapping lives as long as the embedding views it. A step gives back the
// table's pages its lookups mapped.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "common/resident_bytes.hpp"
#include "expar/infer/engine.hpp"
#include "expar/infer/generate.hpp"
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

TEST(WeightsInPlace, TheEmbeddingIsAViewOfTheFileAndStreamedWeightsOneCopy) {
  const HfTestModel m = mixtral_test_model();
  const fs::path dir = test::run_temp_dir("in_place");
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
      // The store is gone; the embedding used in place keeps the file mapped.
      EXPECT_TRUE(maps_file_under(dir)) << "TP " << tp;
      const RankWeights& cw = w;
      const LayerWeights& l0 = cw.layers[0];
      EXPECT_EQ(cw.embed.category(), MemCategory::MappedWeights) << "TP " << tp;
      for (const Tensor* t : {&cw.lm_head, &cw.final_norm, &l0.attn_norm, &l0.attn.wq, &l0.attn.wk,
                              &l0.attn.wv, &l0.attn.wo, &l0.router})
        EXPECT_EQ(t->category(), MemCategory::DenseWeights) << "TP " << tp;
      EXPECT_EQ(l0.experts.w1.category(), MemCategory::ExpertWeights);
      // The view and the copies hold the checkpoint's values: TP rank 0's rows.
      EXPECT_TRUE(same_bytes(w.embed, m.tensors.at("model.embed_tokens.weight").rows(0, m.vocab / tp)));
      EXPECT_TRUE(same_bytes(w.lm_head, m.tensors.at("lm_head.weight").rows(0, m.vocab / tp)));
      EXPECT_TRUE(same_bytes(
          l0.attn.wq,
          m.tensors.at(m.layer(0) + "self_attn.q_proj.weight").rows(0, m.heads * m.head_dim / tp)));
      // Where every byte is: the view is charged to MappedWeights, the copies to their categories.
      int64_t dense = 0;
      for (const Tensor* t : {&w.lm_head, &w.final_norm}) dense += static_cast<int64_t>(t->nbytes());
      for (const LayerWeights& l : cw.layers)
        for (const Tensor* t :
             {&l.attn_norm, &l.mlp_norm, &l.attn.wq, &l.attn.wk, &l.attn.wv, &l.attn.wo, &l.router})
          dense += static_cast<int64_t>(t->nbytes());
      const MemorySnapshot s = tracker.snapshot();
      EXPECT_EQ(s.current_of(MemCategory::MappedWeights), static_cast<int64_t>(w.embed.nbytes()))
          << "TP " << tp;
      EXPECT_EQ(s.current_of(MemCategory::DenseWeights), dense) << "TP " << tp;
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

// The kernel maps the 64 KiB around each page a lookup reads (fault-around), so without the release a
// prompt's rows would keep most of a table resident through its step and after it.
TEST(WeightsInPlace, AStepGivesBackTheEmbeddingPagesItsLookupsMapped) {
  HfTestModel m = mixtral_test_model();
  m.vocab = 8192;  // a table of 8192 x 40 F32 rows: 1.25 MiB, 320 pages
  m.tensors.clear();
  m.randomize(61);
  const fs::path dir = test::run_temp_dir("in_place_step");
  m.write(dir, size_t{1} << 30);  // one shard
  fs::path file;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".safetensors") file = entry.path();
  ASSERT_FALSE(file.empty());
  const ModelSpec spec = open_model_spec(dir.string());
  const InferenceLayout layout = make_layout(1, 1, true, std::nullopt, static_cast<int>(m.experts));
  const int64_t table = int64_t{8192} * m.d * static_cast<int64_t>(sizeof(float));
  // Tokens spread over the whole table, so their lookups map pages in every part of it.
  std::vector<int32_t> prompt;
  for (int32_t t = 5; t < 8192; t += 8192 / 12) prompt.push_back(t);
  run_ranks(1, [&](Comm& world) {
    std::unique_ptr<TensorStore> store = open_store(spec);
    Engine engine(layout, world, load_rank_weights(*store, spec, layout, world.rank()));
    store.reset();
    const Tensor& embed = engine.weights().embed;
    ASSERT_EQ(embed.category(), MemCategory::MappedWeights);
    const int64_t loaded = test::resident_bytes_of(file.string());
    // The measure sees the table's pages: read every one of them.
    const auto* p = static_cast<const volatile uint8_t*>(embed.raw());
    for (size_t i = 0; i < embed.nbytes(); i += 4096) static_cast<void>(p[i]);
    EXPECT_GE(test::resident_bytes_of(file.string()), loaded + table / 2);
    const int id = engine.add_sequence(static_cast<int64_t>(prompt.size()) + 2);
    Tensor logits = engine.prefill(std::vector<int>{id}, {prompt}, PrefillLogits::LastRow);
    // At most the pages around the table's two ends (shared with its neighbours) stay.
    EXPECT_LE(test::resident_bytes_of(file.string()), loaded + (int64_t{128} << 10));
    logits = engine.decode(std::vector<int>{id}, std::vector<int32_t>{argmax_row(logits, 0)});
    EXPECT_LE(test::resident_bytes_of(file.string()), loaded + (int64_t{128} << 10));
  });
}

}  // namespace
}  // namespace expar::infer
