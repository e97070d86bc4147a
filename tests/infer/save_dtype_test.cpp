// `expar train --save-dtype bf16`: the weights a save holds are the f32 run's rounded to BF16 (nearest even),
// the engine loading a BF16 save (TP 1, and TP 2 with EP) gives the logits of the f32 save's weights rounded
// to BF16 within 1e-5 relative, the config.json of a family's save names the dtype, and the training state
// stays f32: the saved masters are the f32 weights bit for bit, and a run resumed from a BF16 save ends with
// every tensor of every file of the uninterrupted run's save. Our own format and the Hugging Face families
// (Qwen-MoE's per-expert tensors, gpt-oss's stacked experts) alike.
//
// Links expar_train as well as expar_infer (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "common/temp_dir.hpp"
#include "expar/core/convert.hpp"
#include "expar/infer/engine.hpp"
#include "expar/io/safetensors_file.hpp"
#include "expar/model/hf_config.hpp"
#include "expar/model/moe_transformer.hpp"
#include "expar/train/checkpoint.hpp"
#include "expar/train/trainer.hpp"
#include "hf_test_models.hpp"
#include "infer_test_util.hpp"
#include "train/training_runs.hpp"

namespace expar::infer::testing {
namespace {

struct Case {
  const char* name;
  ModelFormat format;
  HfTestModel (*make)();  // null: our format
};

const Case kCases[] = {
    {"ours", ModelFormat::Expar, nullptr},
    {"qwen_moe", ModelFormat::QwenMoe, [] { return qwen_test_model(); }},
    {"gpt_oss", ModelFormat::GptOss, [] { return gpt_oss_test_model(); }},
};

class SaveDtype : public ::testing::TestWithParam<Case> {};

// The architecture of a case: its training config, and what the engine and the training model need.
struct SavedRun {
  TrainConfig config;
  Architecture architecture;
  int vocab = 0;
};

SavedRun make_run(const Case& c, const fs::path& weights) {
  SavedRun r;
  if (c.make) {
    const HfTestModel m = c.make();
    m.write(weights);
    r.architecture = hf_architecture(m.config(), "test config.json");
    r.config.hf_config_json = m.config().dump(2);
    r.config.init_from = weights.string();
    r.vocab = static_cast<int>(m.vocab);
  } else {
    r.architecture.config = test_config();
    r.vocab = r.architecture.config.vocab;
  }
  // EP 2, rowwise, 3 steps (the training tests' small run), on this architecture; a save after every step.
  TrainConfig t = expar::testing::small_config(2, "rowwise", 3);
  t.model = r.architecture.config;
  t.format = r.architecture.format;
  t.features = r.architecture.features;
  t.hf_config_json = r.config.hf_config_json;
  t.init_from = r.config.init_from;
  t.checkpoint_every = 1;
  t.keep_last = 0;
  r.config = t;
  return r;
}

void train_into(SavedRun r, const fs::path& dir, DType save_dtype, int stop_after = -1,
                const fs::path& resume = {}) {
  r.config.checkpoint_dir = dir.string();
  r.config.save_dtype = save_dtype;
  r.config.stop_after = stop_after;
  if (!resume.empty()) r.config.resume_from = resume.string();
  const TokenCorpus corpus = TokenCorpus::from_tokens(vocab_tokens(99, 3000, r.vocab), r.vocab);
  run_ranks(2, [&](Comm& world) { train(r.config, world, corpus); });
}

// Every tensor of every safetensors file of a save, by file and name.
std::map<std::string, Tensor> save_tensors(const fs::path& step) {
  std::map<std::string, Tensor> all;
  for (const auto& entry : fs::directory_iterator(step)) {
    if (entry.path().extension() != ".safetensors") continue;
    const SafetensorsFile f = SafetensorsFile::open(entry.path());
    for (const std::string& name : f.names())
      all[entry.path().filename().string() + ":" + name] = f.read(name);
  }
  return all;
}

// The parameters of a training model (one rank) loaded from the save `run`, each rounded to BF16 when
// `round`: the logits of `prompt`, and the parameters' values.
Tensor training_logits(const SavedRun& r, const fs::path& run, bool round, const std::vector<int32_t>& prompt,
                       std::map<std::string, std::vector<float>>* params = nullptr) {
  Tensor logits;
  MemoryTracker& host = current_tracker();
  run_ranks(1, [&](Comm& world) {
    auto group = world.split(0, 0, "ep");
    MoeTransformer model(r.architecture.config, {}, *group, 0, r.architecture.features);
    load_checkpoint(run.string(), model, nullptr);
    for (Parameter& p : model.parameters()) {
      for (float& v : p.value.span<float>())
        if (round) v = bf16_to_f32(f32_to_bf16(v));
      if (params)
        params->emplace(p.name,
                        std::vector<float>(p.value.span<float>().begin(), p.value.span<float>().end()));
    }
    logits = export_to(host, model.logits(prompt, 1, static_cast<int64_t>(prompt.size())));
  });
  return logits;
}

TEST_P(SaveDtype, Bf16SavesTheRoundedWeightsAndResumesFromF32Masters) {
  const Case& c = GetParam();
  test::TempDir dir(std::string("save_dtype_") + c.name);
  const SavedRun r = make_run(c, dir.path() / "weights");
  const fs::path f32 = dir.path() / "f32", bf16 = dir.path() / "bf16", resumed = dir.path() / "resumed";
  train_into(r, f32, DType::F32);
  train_into(r, bf16, DType::BF16);
  train_into(r, resumed, DType::BF16, 2);
  train_into(r, resumed, DType::BF16, -1, resumed);

  // The weights: the f32 save's, each rounded to the nearest BF16 (ties to even); the score bias of none
  // here.
  const std::map<std::string, Tensor> wide = save_tensors(f32 / "step-3"),
                                      narrow = save_tensors(bf16 / "step-3");
  int weights = 0;
  for (const auto& [key, w] : wide) {
    if (key.find(":optimizer.") != std::string::npos) continue;
    ASSERT_TRUE(narrow.contains(key)) << key;
    const Tensor& n = narrow.at(key);
    ASSERT_EQ(n.dtype(), DType::BF16) << key;
    ASSERT_EQ(n.shape(), w.shape()) << key;
    const float* a = w.data<float>();
    const auto* b = static_cast<const uint16_t*>(n.raw());
    for (int64_t i = 0; i < w.numel(); ++i) ASSERT_EQ(b[i], f32_to_bf16(a[i])) << key << " [" << i << "]";
    ++weights;
  }
  EXPECT_GT(weights, 10);
  if (c.make) {
    for (const auto& [run, want] : {std::pair{f32, "float32"}, std::pair{bf16, "bfloat16"}}) {
      std::ifstream in(run / "step-3" / "config.json");
      EXPECT_EQ(nlohmann::json::parse(in).at("torch_dtype"), want) << run;
    }
  }

  // Resume: every tensor of every file (weights, masters, moments) of the uninterrupted run's save.
  const std::map<std::string, Tensor> again = save_tensors(resumed / "step-3");
  ASSERT_EQ(again.size(), narrow.size());
  for (const auto& [key, t] : narrow) {
    ASSERT_TRUE(again.contains(key)) << key;
    ASSERT_EQ(again.at(key).nbytes(), t.nbytes()) << key;
    EXPECT_EQ(std::memcmp(again.at(key).raw(), t.raw(), t.nbytes()), 0) << key << " differs after resume";
  }

  // The training state is f32: a training model loaded from the BF16 save holds the f32 run's parameters.
  const std::vector<int32_t> prompt = vocab_tokens(7, 10, r.vocab);
  std::map<std::string, std::vector<float>> from_f32, from_bf16;
  const Tensor exact = training_logits(r, f32, false, prompt, &from_f32);
  training_logits(r, bf16, false, prompt, &from_bf16);
  EXPECT_EQ(from_bf16, from_f32);

  // The engine on the BF16 save: the logits of the f32 weights rounded to BF16.
  const Tensor rounded = training_logits(r, f32, true, prompt);
  EXPECT_FALSE(close(rounded, exact, 1e-6)) << "rounding to BF16 changes no logit: the test could not fail";
  const ModelSpec spec = open_model_spec(bf16);
  for (const auto& [tp, ep] : {std::pair{1, false}, std::pair{2, true}}) {
    const InferenceLayout layout = make_layout(tp, 1, ep, std::nullopt, spec.config.moe.router.num_experts);
    run_ranks(tp, [&](Comm& world) {
      auto store = open_store(spec);
      Engine engine(layout, world, load_rank_weights(*store, spec, layout, world.rank()));
      const int id = engine.add_sequence(16);
      EXPECT_TRUE(close(engine.prefill(std::vector<int>{id}, {prompt}), rounded, 1e-5))
          << "TP " << tp << (ep ? " EP" : "") << ", rank " << world.rank();
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Infer, SaveDtype, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(SaveDtype, OnlyF32AndBf16AreSaveDtypes) {
  EXPECT_EQ(save_dtype_from_name("f32"), DType::F32);
  EXPECT_EQ(save_dtype_from_name("bf16"), DType::BF16);
  try {
    save_dtype_from_name("fp8");
    ADD_FAILURE() << "fp8 is not a save dtype";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--save-dtype fp8"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("use f32 or bf16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace expar::infer::testing
