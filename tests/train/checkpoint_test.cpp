// Checkpoints are crash-consistent and checked on load (train/checkpoint.hpp, io/checkpoint_dir.hpp):
//  - each save is its own step-<N>/ directory and `latest` names the newest; --keep-last prunes; what a
//    crashed save left (step-*.partial, latest.tmp*) is removed by the next save;
//  - a torn set (a file of another save), an edited manifest (step out of range, file names outside the
//    directory, a model config that does not describe the files) and an optimizer moment shorter than its
//    parameter are refused, naming the file or key;
//  - a target directory holding another model is refused unless overwritten, and an unwritable one is found
//    before the first step;
//  - kill -9 of a real `expar train --checkpoint-every 1` at any moment leaves a loadable latest checkpoint,
//    and a full disk (a tiny tmpfs, when the test may mount one) is an error while the previous save stays.
#include "expar/train/checkpoint.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "common/temp_dir.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"
#include "expar/io/checkpoint_dir.hpp"
#include "expar/io/durable_file.hpp"
#include "expar/io/safetensors_file.hpp"
#include "expar/io/safetensors_writer.hpp"
#include "expar/train/adamw.hpp"
#include "expar/train/trainer.hpp"
#include "run_process.hpp"
#include "train/verse_corpus.hpp"

namespace expar {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

TrainConfig small_config(int steps) {
  TrainConfig c;
  c.model = ModelConfig::preset("tiny");
  c.ep = 2;
  c.execution.moe.path = "rowwise";
  c.steps = steps;
  c.global_batch = 4;
  c.seq_len = 16;
  c.warmup = 1;
  c.eval_every = 0;
  c.eval_sequences = 2;
  return c;
}

// Steps that ran (observer calls on rank 0).
int train_ranks(int ranks, const TrainConfig& cfg) {
  int steps = 0;
  TrainObserver observer;
  observer.on_step = [&](const StepRecord&, const TrainConfig&) { ++steps; };
  run_ranks(ranks, [&](Comm& world) { train(cfg, world, testing::genesis_corpus(), &observer); });
  return steps;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// `expar train` of the tiny model on 2 ranks (EP 2) saving every step into `checkpoint`, keeping
// `keep_last`; then `extra`.
std::vector<std::string> checkpointing_train(const fs::path& checkpoint, const std::string& keep_last,
                                             const std::string& log, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {EXPAR_BINARY,
                                   "train",
                                   "--preset",
                                   "tiny",
                                   "--ranks",
                                   "2",
                                   "--ep",
                                   "2",
                                   "--seq-len",
                                   "16",
                                   "--batch",
                                   "4",
                                   "--eval-every",
                                   "0",
                                   "--checkpoint",
                                   checkpoint.string(),
                                   "--checkpoint-every",
                                   "1",
                                   "--keep-last",
                                   keep_last,
                                   "--data",
                                   EXPAR_SOURCE_DIR "/data/kjv.txt",
                                   "--log",
                                   log};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// Loads `dir` into a one-rank model with its optimizer.
void load_one_rank(const std::string& dir, const ModelConfig& model) {
  run_ranks(1, [&](Comm& world) {
    MoeTransformer m(model, {}, world);
    std::vector<Parameter*> params;
    for (Parameter& p : m.parameters()) params.push_back(&p);
    AdamW optimizer(params, AdamWConfig{}, world, world);
    load_checkpoint(dir, m, &optimizer);
  });
}

// Rewrites a safetensors file with the same metadata, after `edit` changed its tensors.
void rewrite(const fs::path& file, const std::function<void(std::map<std::string, Tensor>&)>& edit) {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  {
    SafetensorsFile f = SafetensorsFile::open(file);
    for (const auto& name : f.names()) tensors[name] = f.read(name);
    metadata = f.metadata();
  }
  edit(tensors);
  write_safetensors(file, tensors, metadata);
}

void edit_manifest(const fs::path& step_dir, const std::function<void(json&)>& edit) {
  json j = json::parse(read_text_file(step_dir / "manifest.json"));
  edit(j);
  write_file_atomically(step_dir / "manifest.json", j.dump(2));
}

class Checkpoints : public ::testing::Test {
 protected:
  // The checkpoint folder inside a new one that also holds its siblings (the kill loop's metrics file
  // `<dir>.jsonl`, copies beside it).
  const test::TempDir temp_{"checkpoint"};
  const fs::path dir_ = temp_ / "run";
  // A run of `steps` steps saving every step into dir_, keeping `keep`.
  void save_run(int steps, int keep = 0) {
    TrainConfig c = small_config(steps);
    c.checkpoint_dir = dir_.string();
    c.checkpoint_every = 1;
    c.keep_last = keep;
    ASSERT_EQ(train_ranks(2, c), steps);
  }
};

TEST_F(Checkpoints, EachSaveIsAStepDirectoryAndLatestNamesTheNewest) {
  save_run(3);
  EXPECT_EQ(checkpoint_steps(dir_), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(read_text_file(dir_ / "latest"), "step-3\n");
  EXPECT_EQ(resolve_checkpoint_dir(dir_), dir_ / "step-3");
  EXPECT_EQ(read_checkpoint_info(dir_.string()).step, 3);
  EXPECT_EQ(read_checkpoint_info((dir_ / "step-2").string()).step, 2);
  for (const char* file : {"dense.safetensors", "experts-0.safetensors", "experts-1.safetensors"}) {
    SafetensorsFile f = SafetensorsFile::open(dir_ / "step-2" / file);
    EXPECT_EQ(f.metadata().at("step"), "2") << file;
  }
  load_one_rank(dir_.string(), small_config(1).model);
}

TEST_F(Checkpoints, KeepLastPrunesTheOldestAndStaleTemporariesGo) {
  fs::create_directories(dir_ / "step-7.partial");
  std::ofstream(dir_ / "step-7.partial" / "dense.safetensors") << "half";
  std::ofstream(dir_ / "latest.tmp999") << "step-7";
  save_run(4, /*keep=*/2);
  EXPECT_EQ(checkpoint_steps(dir_), (std::vector<int64_t>{3, 4}));
  EXPECT_FALSE(fs::exists(dir_ / "step-7.partial"));
  EXPECT_FALSE(fs::exists(dir_ / "latest.tmp999"));
  for (const auto& entry : fs::directory_iterator(dir_ / "step-4"))
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
}

TEST_F(Checkpoints, AFileOfAnotherSaveIsRefusedByName) {
  save_run(3);
  fs::copy_file(dir_ / "step-2" / "experts-1.safetensors", dir_ / "step-3" / "experts-1.safetensors",
                fs::copy_options::overwrite_existing);
  const std::string m = error_of([&] { load_one_rank(dir_.string(), small_config(1).model); });
  EXPECT_NE(m.find("torn checkpoint"), std::string::npos) << m;
  EXPECT_NE(m.find("step-3/experts-1.safetensors belongs to step 2"), std::string::npos) << m;
}

TEST_F(Checkpoints, SameStepOfAnotherSaveIsRefused) {
  save_run(2);
  const fs::path keep = dir_.string() + "_first";
  fs::remove_all(keep);
  fs::copy(dir_ / "step-2", keep);
  save_run(2);  // saves step 1 and 2 again, with new save ids
  fs::copy_file(keep / "dense.safetensors", dir_ / "step-2" / "dense.safetensors",
                fs::copy_options::overwrite_existing);
  fs::remove_all(keep);
  const std::string m = error_of([&] { load_one_rank(dir_.string(), small_config(1).model); });
  EXPECT_NE(m.find("dense.safetensors belongs to save"), std::string::npos) << m;
}

TEST_F(Checkpoints, ShortOptimizerMomentIsAnErrorNotAnOutOfBoundsRead) {
  save_run(1);
  rewrite(dir_ / "step-1" / "experts-0.safetensors", [](std::map<std::string, Tensor>& t) {
    const std::string key = "optimizer.m.layers.0.moe.experts.0.w1";
    ASSERT_TRUE(t.contains(key));
    t[key] = Tensor::zeros({3});
  });
  const std::string m = error_of([&] { load_one_rank(dir_.string(), small_config(1).model); });
  EXPECT_NE(m.find("'optimizer.m.layers.0.moe.experts.0.w1'"), std::string::npos) << m;
  EXPECT_NE(m.find("has shape [3]"), std::string::npos) << m;
}

TEST_F(Checkpoints, ManifestValuesAreRangeCheckedAndConfined) {
  save_run(1);
  const fs::path step = dir_ / "step-1";
  const std::string original = read_text_file(step / "manifest.json");
  struct Case {
    std::function<void(json&)> edit;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["step"] = -100; }, "\"step\" is -100, not an integer in [0, 2147483647]"},
      {[](json& j) { j["step"] = 1e15; }, "\"step\" is 1e+15"},
      {[](json& j) { j["dense_file"] = "../dense.safetensors"; }, "not a file name inside the checkpoint"},
      {[](json& j) { j["dense_file"] = "/etc/passwd"; }, "not a file name inside the checkpoint"},
      {[](json& j) {
         j["expert_files"]["../experts-0.safetensors"] = j["expert_files"]["experts-0.safetensors"];
         j["expert_files"].erase("experts-0.safetensors");
       },
       "not a file name inside the checkpoint"},
      {[](json& j) { j["model"]["layers"] = 1; }, "\"model_hash\""},
      {[](json& j) { j["world"] = 0; }, "\"world\" is 0"},
  };
  for (const Case& c : cases) {
    edit_manifest(step, c.edit);
    const std::string m = error_of([&] { load_one_rank(dir_.string(), small_config(1).model); });
    EXPECT_NE(m.find(c.expected), std::string::npos) << m;
    EXPECT_NE(m.find("manifest.json"), std::string::npos) << m;
    write_file_atomically(step / "manifest.json", original);
  }
  // The manifest's "layers" edited together with its hash: the files carry the hash of the 2-layer model.
  edit_manifest(step, [](json& j) {
    j["model"]["layers"] = 1;
    j["model_hash"] = stable_hash(j["model"].dump());
  });
  ModelConfig one_layer = small_config(1).model;
  one_layer.layers = 1;
  std::string m = error_of([&] { load_one_rank(dir_.string(), one_layer); });
  EXPECT_NE(m.find("dense.safetensors was written for a model config with hash"), std::string::npos) << m;
  // In the older format without hashes, the tensors nobody loads give it away.
  edit_manifest(step, [](json& j) {
    j["format"] = "expar-checkpoint-1";
    j.erase("model_hash");
    j.erase("save_id");
  });
  m = error_of([&] { load_one_rank(dir_.string(), one_layer); });
  EXPECT_NE(m.find("holds tensor 'layers.1."), std::string::npos) << m;
}

TEST_F(Checkpoints, ResumeRefusesAnotherModelAndAStepPastTheEnd) {
  save_run(2);
  TrainConfig other = small_config(4);
  other.model.moe.router.score = ScoreFunction::Sigmoid;
  other.resume_from = dir_.string();
  std::string m = error_of([&] { train_ranks(2, other); });
  EXPECT_NE(m.find("model.score is \"sigmoid\" here but \"softmax\" in the checkpoint"), std::string::npos)
      << m;
  TrainConfig done = small_config(2);
  done.resume_from = dir_.string();
  m = error_of([&] { train_ranks(2, done); });
  EXPECT_NE(m.find("completed step 2 of a run of 2 steps"), std::string::npos) << m;
}

TEST_F(Checkpoints, AnotherModelInTheTargetIsRefusedUnlessOverwritten) {
  save_run(3);
  TrainConfig other = small_config(1);
  other.model.moe.router.score = ScoreFunction::Sigmoid;
  other.checkpoint_dir = dir_.string();
  std::string m = error_of([&] { train_ranks(2, other); });
  EXPECT_NE(m.find("already holds a checkpoint of another model"), std::string::npos) << m;
  EXPECT_EQ(checkpoint_steps(dir_), (std::vector<int64_t>{1, 2, 3}));
  other.overwrite_checkpoint = true;
  EXPECT_EQ(train_ranks(2, other), 1);
  // No save of the other model is left beside the new one.
  EXPECT_EQ(checkpoint_steps(dir_), (std::vector<int64_t>{1}));
  EXPECT_EQ(read_checkpoint_info(dir_.string()).model.moe.router.score, ScoreFunction::Sigmoid);
}

TEST_F(Checkpoints, UnwritableTargetIsFoundBeforeTheFirstStep) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "a_file") << "x";
  TrainConfig c = small_config(3);
  c.checkpoint_dir = (dir_ / "a_file" / "run").string();
  int steps = -1;
  const std::string m = error_of([&] { steps = train_ranks(2, c); });
  EXPECT_EQ(steps, -1);
  EXPECT_NE(m.find("--checkpoint '" + c.checkpoint_dir + "': cannot create the directory"), std::string::npos)
      << m;
}

// What `latest` names now ("" while there is none). It is replaced by a rename, so a read sees the old or the
// new name whole.
std::string latest_name(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir / "latest", ec)) return "";
  try {
    return read_text_file(dir / "latest");
  } catch (const Error&) {
    return "";  // replaced between the check and the read
  }
}

// A real `expar train` killed with SIGKILL at random moments while it checkpoints every step: after every
// kill, the checkpoint `latest` names is complete and loads, and the run resumes from it. Each round kills
// at a random moment after the run has saved at least once in that round (a fixed delay from the start was
// machine-dependent: under a sanitizer on a busy machine every kill could land before the first save).
TEST_F(Checkpoints, KillNineLoopLeavesALoadableCheckpoint) {
  const std::vector<std::string> base = checkpointing_train(dir_, "2", dir_.string() + ".jsonl", {});
  std::mt19937 rng(12345);
  int loaded = 0;
  for (int round = 0; round < 8; ++round) {
    const std::string before = latest_name(dir_);
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), {"--steps", "100000"});
    if (holds_checkpoint(dir_)) argv.insert(argv.end(), {"--resume", dir_.string()});
    const pid_t pid = fork();
    if (pid == 0) {
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      freopen("/dev/null", "w", stdout);
      execv(args[0], args.data());
      _exit(127);
    }
    // Until this round's run has saved (its `latest` moved), or it ended, or two minutes passed.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    int status = 0;
    bool ended = false;
    while (latest_name(dir_) == before && std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        ended = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const bool saved = latest_name(dir_) != before;
    if (!ended) {
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 400));
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
    ASSERT_TRUE(WIFSIGNALED(status)) << "round " << round << ": the run ended by itself";
    ASSERT_TRUE(saved) << "round " << round << ": no save within two minutes";
    const CheckpointInfo info = read_checkpoint_info(dir_.string());
    EXPECT_GE(info.step, 1);
    EXPECT_EQ(error_of([&] { load_one_rank(dir_.string(), small_config(1).model); }), "(no error)")
        << "round " << round;
    ++loaded;
  }
  EXPECT_EQ(loaded, 8);
  // And the survivor resumes to the end with status 0.
  std::vector<std::string> argv = base;
  const int64_t step = read_checkpoint_info(dir_.string()).step;
  argv.insert(argv.end(), {"--steps", std::to_string(step + 2), "--resume", dir_.string()});
  testing::ProcessResult r = testing::run_process(argv);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_checkpoint_info(dir_.string()).step, step + 2);
}

// A disk with room for one save: the second fails with the system's reason and status 1, and the first is
// still complete and named by `latest`.
TEST_F(Checkpoints, FullDiskIsAnErrorAndThePreviousSaveSurvives) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root; run as root to check a full disk";
  fs::create_directories(dir_);
  // One save of the tiny model with its optimizer state is about 0.95 MB.
  if (mount("tmpfs", dir_.c_str(), "tmpfs", 0, "size=1400k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << "); needs CAP_SYS_ADMIN";
  const fs::path run = dir_ / "run";
  testing::ProcessResult r =
      testing::run_process(checkpointing_train(run, "0", "/dev/null", {"--steps", "3"}));
  const std::string latest = fs::exists(run / "latest") ? read_text_file(run / "latest") : "(none)";
  std::string load_error = "(not loaded)";
  if (latest != "(none)") load_error = error_of([&] { load_one_rank(run.string(), small_config(1).model); });
  umount2(dir_.c_str(), MNT_DETACH);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  EXPECT_EQ(latest, "step-1\n");
  EXPECT_EQ(load_error, "(no error)");
}

}  // namespace
}  // namespace expar
