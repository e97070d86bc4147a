// `expar train`: train an MoE transformer with expert parallelism: our byte-level presets (--preset) or a
// model of a Hugging Face family (--model: its config.json, and its weights to fine-tune when the directory
// has them). Ranks are threads of this process by default (--ranks); with --transport mpi, one rank per MPI
// process under mpirun.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "expar/cli/commands.hpp"
#include "expar/cli/option_checks.hpp"
#include "expar/cli/precision_flags.hpp"
#include "expar/cli/wave_flags.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/host_allocator.hpp"
#include "expar/core/memory.hpp"
#include "expar/io/tokenizer.hpp"
#include "expar/model/hf_config.hpp"
#include "expar/model/moe_transformer.hpp"
#include "expar/moe/capacity.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/router.hpp"
#include "expar/train/checkpoint.hpp"
#include "expar/train/run_model.hpp"
#include "expar/train/trainer.hpp"

namespace expar::cli {

namespace {

struct TrainArgs {
  std::string preset = "demo";
  std::string model;                // --model: a config.json or a Hugging Face checkpoint directory
  std::filesystem::path model_dir;  // the directory of the model's config.json (tokenizer, weights)
  std::string transport = "threads";
  int ranks = 4;
  int ranks_per_node = 0;  // threads: emulated nodes (0: one node)
  int threads = 0;         // compute threads per rank; 0 = cores / ranks (at least 1)
  std::string data = "data/kjv.txt";
  std::string log = "runs/train.jsonl";
  std::string capacity_policy = "source";
  std::string save_dtype = "f32";
  double capacity_factor = 0.0;
  std::string score = "softmax";
  double aux_coef = 0, z_coef = 0;  // used when given (cmd.count)
  PrecisionFlags precision;
  std::string products = "f32";  // --precision
  WaveConfig waves;
  TrainConfig config;
};

void print_step(const StepRecord& r, const TrainConfig& cfg, std::ofstream& log) {
  nlohmann::json j{{"step", r.step + 1},
                   {"loss", r.loss},
                   {"aux_loss", r.aux_loss},
                   {"z_loss", r.z_loss},
                   {"drop_rate", r.drop_rate},
                   {"utilisation", r.utilisation},
                   {"grad_norm", r.grad_norm},
                   {"lr", r.lr},
                   {"tokens_per_second", r.tokens_per_second}};
  if (r.val_loss >= 0) j["val_loss"] = r.val_loss;
  if (r.eplb_slots_changed >= 0) {
    j["eplb_slots_changed"] = r.eplb_slots_changed;
    j["eplb_bytes_moved"] = r.eplb_bytes_moved;
    j["eplb_imbalance_before"] = r.eplb_imbalance_before;
    j["eplb_imbalance_after"] = r.eplb_imbalance_after;
    j["eplb_seconds"] = r.eplb_seconds;
  }
  log << j.dump() << "\n";
  log.flush();
  const bool tty = isatty(fileno(stdout));
  const int width = 24;
  const int filled = static_cast<int>(width * (r.step + 1) / std::max(1, cfg.steps));
  std::string bar =
      std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(width - filled), '.');
  std::string line = fmt::format(
      "step {:>4}/{} [{}] loss {:.4f} aux {:.3f} z {:.3f} drop {:.2f}% util {:.2f} {:.0f} tok/s", r.step + 1,
      cfg.steps, bar, r.loss, r.aux_loss, r.z_loss, 100 * r.drop_rate, r.utilisation, r.tokens_per_second);
  if (r.val_loss >= 0) line += fmt::format(" | val {:.4f}", r.val_loss);
  if (r.eplb_slots_changed >= 0)
    line += fmt::format(
        " | experts re-placed: {} slots changed, {} moved in {:.1f} ms, imbalance {:.3f} -> {:.3f}",
        r.eplb_slots_changed, format_bytes(r.eplb_bytes_moved), 1e3 * r.eplb_seconds, r.eplb_imbalance_before,
        r.eplb_imbalance_after);
  // On a terminal the line is redrawn in place and kept every 10 steps; in a log (not a terminal) every
  // 10th step is printed, and every step of a short run.
  const bool periodic =
      (r.step + 1) % 10 == 0 || r.step + 1 == cfg.steps || r.val_loss >= 0 || r.eplb_slots_changed >= 0;
  if (tty) {
    fmt::print("\r{}{}", line, periodic ? "\n" : "");
  } else if (periodic || cfg.steps <= 50) {
    fmt::print("{}\n", line);
  }
  std::fflush(stdout);
}

// The run's model (train/run_model.hpp) and its execution (path, capacity, precision, waves,
// recomputation), checked against --seq-len and --microbatches. Returns the model's label for the banner.
std::string configure_run(TrainArgs& a, const CLI::App& cmd) {
  TrainConfig& cfg = a.config;
  RunModelRequest request;
  request.preset = a.preset;
  request.preset_given = cmd.count("--preset") > 0;
  request.score = a.score;
  request.score_given = cmd.count("--score") > 0;
  request.model = a.model;
  request.resume_from = cfg.resume_from;
  request.score_bias = cfg.score_bias_rate > 0;
  if (cmd.count("--aux-coef") > 0) request.aux_loss_coef = a.aux_coef;
  if (cmd.count("--z-coef") > 0) request.z_loss_coef = a.z_coef;
  RunModel run = resolve_run_model(request);
  cfg.model = std::move(run.model);
  cfg.format = run.format;
  cfg.features = std::move(run.features);
  cfg.hf_config_json = std::move(run.hf_config_json);
  cfg.init_from = std::move(run.init_from);
  a.model_dir = run.model_dir;

  MoeExecution& moe = cfg.execution.moe;
  if (a.capacity_factor > 0)
    moe.capacity = CapacityPolicy::with(capacity_rule_from_name(a.capacity_policy), a.capacity_factor);
  cfg.execution.bf16_products = a.products == "bf16";
  // BF16 products read BF16 rows: the payloads of the paths that move reduced precision default to BF16.
  if (cfg.execution.bf16_products && path_traits(moe.path).reduced_precision)
    a.precision.default_unset_to(cmd, "bf16");
  moe.precision = a.precision.parse();
  moe.waves = a.waves;
  cfg.save_dtype = save_dtype_from_name(a.save_dtype);
  // The preset's whole context; a Hugging Face model's contexts run to 4096 tokens and more: 256 unless said.
  if (cmd.count("--seq-len") == 0)
    cfg.seq_len = a.model_dir.empty() ? static_cast<int>(cfg.model.max_seq)
                                      : static_cast<int>(std::min<int64_t>(cfg.model.max_seq, 256));
  EXPAR_CHECK(cfg.seq_len <= cfg.model.max_seq,
              "--seq-len {} exceeds the model's max_seq {} ({}): pass --seq-len {} or less", cfg.seq_len,
              cfg.model.max_seq, run.label, cfg.model.max_seq);
  EXPAR_CHECK(cfg.microbatches <= cfg.global_batch,
              "--microbatches {} exceeds --batch {}: a microbatch holds at least one sequence; pass "
              "--microbatches {} or less",
              cfg.microbatches, cfg.global_batch, cfg.global_batch);
  return run.label;
}

// --data, through the model's tokenizer when its directory has one (else its bytes are the tokens).
TokenCorpus load_corpus(const TrainArgs& a) {
  std::optional<Tokenizer> tokenizer;
  if (!a.model_dir.empty() && Tokenizer::present_in(a.model_dir))
    tokenizer.emplace(Tokenizer::from_path(a.model_dir));
  TokenCorpus corpus = TokenCorpus::load(a.data, 0.05, tokenizer ? &*tokenizer : nullptr);
  corpus.check_vocab(a.config.model.vocab);
  return corpus;
}

// --log, appended to (its directory created).
std::ofstream open_log(const TrainArgs& a) {
  std::filesystem::path log_path(a.log);
  if (log_path.has_parent_path()) std::filesystem::create_directories(log_path.parent_path());
  std::ofstream log(log_path, std::ios::app);
  EXPAR_CHECK(log.good(), "cannot write the log file '{}': pass --log with a writable path", a.log);
  return log;
}

// The banner printed once the trainer knows the layout: model, layout, batch and log.
void print_banner(const TrainArgs& a, const std::string& model_label, const std::string& layout) {
  const TrainConfig& cfg = a.config;
  fmt::print("expar train: {}, {} layers, d={}, {} experts (top-{}, h={}), path {}, payload {}\n",
             model_label, cfg.model.layers, cfg.model.model_dim, cfg.model.moe.router.num_experts,
             cfg.model.moe.router.top_k, cfg.model.moe.hidden_dim, cfg.execution.moe.path,
             cfg.execution.moe.precision.describe());
  fmt::print("{}", layout);
  fmt::print("global batch {} x {} tokens, {} microbatch(es), {} steps, products {}, log {}{}{}\n",
             cfg.global_batch, cfg.seq_len, cfg.microbatches, cfg.steps,
             cfg.execution.bf16_products ? "bf16 (f32 master weights)" : "f32", a.log,
             cfg.execution.recompute_every_moe ? ", MoE recomputed in backward" : "",
             cfg.init_from.empty() ? "" : ", weights from " + cfg.init_from);
  std::fflush(stdout);
}

// Ranks, emulated nodes and compute threads per rank (--threads 0: the cores over the ranks on this node).
LaunchOptions launch_options(TrainArgs& a) {
  LaunchOptions launch;
  launch.ranks = a.ranks;
  check_emulated_nodes(a.ranks_per_node, a.ranks, a.transport);
  launch.ranks_per_node = a.ranks_per_node;
  if (a.threads <= 0) {
    // Ranks x compute threads should not exceed the cores; under mpirun the ranks on this node are the
    // processes Open MPI started here.
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int local_ranks = a.ranks;
    if (a.transport == "mpi")
      if (const char* n = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) local_ranks = std::atoi(n);
    a.threads = std::max(1, static_cast<int>(cores) / std::max(1, local_ranks));
  }
  EXPAR_CHECK(static_cast<int64_t>(a.ranks) * a.threads <= 4096,
              "--ranks {} x --threads {} = {} threads exceed 4096: pass fewer ranks or compute threads",
              a.ranks, a.threads, static_cast<int64_t>(a.ranks) * a.threads);
  launch.compute_threads = a.threads;
  return launch;
}

// Every rank's memory (current and peak per category), gathered to every rank of `world`.
std::vector<MemorySnapshot> gather_memory(Comm& world) {
  MemorySnapshot mine = current_tracker().snapshot();
  std::vector<int64_t> all(static_cast<size_t>(world.size()) * kNumMemCategories * 2);
  std::vector<int64_t> own(mine.current.begin(), mine.current.end());
  own.insert(own.end(), mine.peak.begin(), mine.peak.end());
  world.all_gather(own.data(), all.data(), own.size(), DType::I64);
  std::vector<MemorySnapshot> memory;
  for (int r = 0; r < world.size(); ++r) {
    MemorySnapshot snap;
    for (size_t c = 0; c < kNumMemCategories; ++c) {
      snap.current[c] = all[static_cast<size_t>(r) * 2 * kNumMemCategories + c];
      snap.peak[c] = all[static_cast<size_t>(r) * 2 * kNumMemCategories + kNumMemCategories + c];
      snap.total_current += snap.current[c];
      snap.total_peak += snap.peak[c];  // sum of per-category peaks: an upper bound of the total peak
    }
    memory.push_back(snap);
  }
  return memory;
}

struct TrainRun {
  std::vector<TrainSummary> summaries;  // one per rank
  std::vector<MemorySnapshot> memory;   // every rank's, peak over the run
  bool reports = true;                  // false on the MPI processes other than rank 0: they print nothing
};

// Trains on the ranks of --transport.
TrainRun run_ranks_of_transport(const TrainArgs& a, const LaunchOptions& launch, const TokenCorpus& corpus,
                                const TrainObserver& observer) {
  const TrainConfig& cfg = a.config;
  TrainRun run;
  run.summaries.resize(static_cast<size_t>(a.ranks));
  std::mutex mutex;
  auto body = [&](Comm& world) {
    TrainSummary s = train(cfg, world, corpus, &observer);
    std::lock_guard lock(mutex);
    run.summaries[static_cast<size_t>(world.rank())] = std::move(s);
  };
  if (a.transport == "threads") {
    run.memory = run_ranks_tracked(launch, body);
  } else if (a.transport == "mpi") {
    // One rank per process under mpirun (the world size comes from mpirun, --ranks is ignored). Rank 0
    // prints; every rank's peak memory is gathered to it.
    int world_rank = 0;
    run_mpi(nullptr, nullptr, launch, [&](Comm& world) {
      world_rank = world.rank();
      run.summaries.resize(static_cast<size_t>(world.size()));
      TrainSummary s = train(cfg, world, corpus, &observer);
      run.memory = gather_memory(world);
      run.summaries[static_cast<size_t>(world.rank())] = std::move(s);
    });
    run.reports = world_rank == 0;
  } else {
    fail("--transport '{}' is unknown: use threads (default) or mpi (under mpirun)", a.transport);
  }
  return run;
}

// After the run: every rank's peak memory, the host allocation cache and rank 0's final losses.
void print_reports(const TrainRun& run) {
  fmt::print("\nper-rank memory (peak over the run):\n");
  for (size_t r = 0; r < run.memory.size(); ++r) fmt::print("rank {}:\n{}", r, format_memory(run.memory[r]));
  // Not in the per-rank tables: freed tensor blocks the process keeps for reuse (core/host_allocator.hpp).
  const HostCacheStats cache = host_cache_stats();
  if (cache.enabled)
    fmt::print(
        "host allocation cache (process-wide, freed blocks kept for reuse): {} of at most {}, {} reuses, {} "
        "fresh\n",
        format_bytes(cache.cached_bytes), format_bytes(cache.limit_bytes), cache.hits, cache.misses);
  const auto& s0 = run.summaries[0];
  if (!s0.steps.empty())
    fmt::print("final: train loss {:.4f}, validation loss {:.4f}\n", s0.steps.back().loss, s0.final_val_loss);
}

int run_train(TrainArgs& a, const CLI::App& cmd) {
  const std::string model_label = configure_run(a, cmd);
  const TokenCorpus corpus = load_corpus(a);
  std::ofstream log = open_log(a);
  TrainObserver observer;
  observer.on_start = [&](const std::string& layout) { print_banner(a, model_label, layout); };
  observer.on_step = [&](const StepRecord& r, const TrainConfig& c) { print_step(r, c, log); };
  const LaunchOptions launch = launch_options(a);
  const TrainRun run = run_ranks_of_transport(a, launch, corpus, observer);
  if (run.reports) print_reports(run);
  return 0;
}

}  // namespace

void add_train(CLI::App& app, CommandTable& table) {
  auto* cmd = app.add_subcommand(
      "train", "Train an MoE transformer (a preset or a Hugging Face family) with expert parallelism");
  auto a = std::make_shared<TrainArgs>();
  TrainConfig& c = a->config;
  cmd->add_option("--preset", a->preset, "Model preset: " + choices(ModelConfig::preset_names()))
      ->capture_default_str();
  std::vector<std::string> model_types;
  for (ModelFormat f : all_model_formats())
    if (f != ModelFormat::Expar) model_types.push_back(hf_model_type(f));
  cmd->add_option(
      "--model", a->model,
      "A Hugging Face config.json (random initialisation) or checkpoint directory (its config.json; "
      "its weights when it has them: fine-tuning) with model_type " +
          choices(model_types) + "; saves are then Hugging Face checkpoints of that family too");
  cmd->add_option("--transport", a->transport,
                  "threads (ranks are threads of this process) | mpi (one rank per process, under mpirun)")
      ->capture_default_str()
      ->check(one_of(transport_names()));
  cmd->add_option("--ranks", a->ranks, "Number of ranks (W)")
      ->capture_default_str()
      ->check(integer_in(1, 1024));
  cmd->add_option(
         "--ranks-per-node", a->ranks_per_node,
         "threads: emulate nodes of this many ranks (a divisor of --ranks; default: all on one node)")
      ->check(integer_in(1, 1024));
  cmd->add_option("--ep", c.ep, "EP_MP degree M_E (divides the ranks)")
      ->capture_default_str()
      ->check(integer_in(1, 1024));
  cmd->add_option("--redundant-experts", c.redundant_experts,
                  "R extra expert slots (S = experts + R, a multiple of --ep): replicas of the first R "
                  "experts, each replicated expert's gradient summed over its replicas (same training)")
      ->capture_default_str()
      ->check(integer_in(0, 1 << 20));
  cmd->add_option("--eplb-interval", c.eplb_interval,
                  "Every N steps re-place the experts by EPLB from the routes since the last (moving weights "
                  "and Adam moments; the same training; 0: never)")
      ->capture_default_str()
      ->check(integer_in(0, 1'000'000'000));
  cmd->add_option("--cp", c.cp,
                  "Context-parallel degree C: each sequence split over C ranks (divides the ranks and "
                  "--seq-len; EP folds over D*C)")
      ->capture_default_str()
      ->check(integer_in(1, 1024));
  std::vector<std::string> training_paths;  // the decode form needs the same tokens on every EP rank
  for (const PathTraits& p : path_registry())
    if (!p.decode_form) training_paths.push_back(p.name);
  cmd->add_option("--path", c.execution.moe.path,
                  "Execution path (local: M_E = 1): " + choices(training_paths))
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "Compute threads per rank (0: cores / ranks)")
      ->capture_default_str()
      ->check(integer_in(0, 256));
  cmd->add_option("--steps", c.steps, "Optimizer steps")
      ->capture_default_str()
      ->check(integer_in(1, 1'000'000'000));
  cmd->add_option("--batch", c.global_batch, "Global batch in sequences")
      ->capture_default_str()
      ->check(integer_in(1, 65536));
  cmd->add_option("--seq-len", c.seq_len,
                  "Sequence length in tokens (default: a preset's max_seq; min(max_seq, 256) with --model)")
      ->check(integer_in(1, 1 << 20));
  cmd->add_option("--microbatches", c.microbatches, "Microbatches per rank and step")
      ->capture_default_str()
      ->check(integer_in(1, 65536));
  cmd->add_option("--lr", c.lr, "Peak learning rate")->capture_default_str()->check(finite_above(0, 10));
  cmd->add_option("--warmup", c.warmup, "Warmup steps")
      ->capture_default_str()
      ->check(integer_in(0, 1'000'000'000));
  cmd->add_option("--weight-decay", c.weight_decay)->capture_default_str()->check(finite_in(0, 10));
  cmd->add_option("--clip", c.clip_norm, "Clip the global gradient norm (0: off)")
      ->capture_default_str()
      ->check(finite_in(0, 1e6));
  cmd->add_option("--capacity-factor", a->capacity_factor, "Capacity factor (0: dropless)")
      ->capture_default_str()
      ->check(finite_in(0, 1024));
  cmd->add_option("--capacity-policy", a->capacity_policy,
                  "Capacity rule with a capacity factor: " + choices(capacity_policy_names()))
      ->capture_default_str()
      ->check(one_of(capacity_policy_names()));
  cmd->add_option("--score", a->score, "Router score function: " + choices(score_function_names()))
      ->capture_default_str()
      ->check(one_of(score_function_names()));
  cmd->add_option("--aux-coef", a->aux_coef, "Load-balancing loss coefficient (default: preset's)")
      ->check(finite_in(0, 100));
  cmd->add_option("--z-coef", a->z_coef, "Router z-loss coefficient (default: preset's)")
      ->check(finite_in(0, 100));
  cmd->add_option(
         "--score-bias-rate", c.score_bias_rate,
         "Auxiliary-loss-free balancing (DeepSeek-V3): after each step a per-expert score bias, used "
         "for expert selection only, moves by this rate towards balanced loads (0: off; a new run "
         "gets the bias, a resumed one keeps its checkpoint's)")
      ->capture_default_str()
      ->check(finite_in(0, 1));
  cmd->add_flag("--shard-optimizer", c.shard_optimizer, "Shard expert Adam state over EP_DP");
  cmd->add_flag("--recompute-moe", c.execution.recompute_every_moe,
                "Activation recomputation of every block's MoE MLP: backward redoes dispatch, experts and "
                "combine gather instead of keeping them (same gradients; saves the expert activations and, "
                "with rowwise, the per-block dispatch leases; costs one more dispatch + expert forward per "
                "block)");
  add_precision_flags(cmd, a->precision);
  cmd->add_option("--precision", a->products,
                  "The products: f32 | bf16 (mixed precision: the experts, attention's projections and the "
                  "LM head multiply BF16 copies of the f32 weights with f32 accumulation, refreshed after "
                  "every step; the payload flags then default to bf16; refused on CPUs without BF16 dot "
                  "products)")
      ->capture_default_str()
      ->check(one_of({"f32", "bf16"}));
  add_wave_flags(cmd, a->waves);
  cmd->add_option("--seed", c.seed)->capture_default_str();
  cmd->add_option("--eval-every", c.eval_every, "Validation loss every N steps (0: at the end)")
      ->capture_default_str()
      ->check(integer_in(0, 1'000'000'000));
  cmd->add_option("--data", a->data,
                  "Training data: a text file (bytes), little-endian uint16/uint32 tokens with a FILE.json "
                  "sidecar {dtype, vocab_size}, or a .npy")
      ->capture_default_str();
  cmd->add_option("--log", a->log, "JSON-lines log, one line per step")->capture_default_str();
  cmd->add_option(
      "--checkpoint", c.checkpoint_dir,
      "Checkpoint run directory: each save in step-<N>/, 'latest' names the newest (written at the "
      "end)");
  cmd->add_option("--checkpoint-every", c.checkpoint_every, "Also checkpoint every N steps")
      ->check(integer_in(0, 1'000'000'000));
  cmd->add_option("--keep-last", c.keep_last, "Step directories kept in --checkpoint (0: all)")
      ->capture_default_str()
      ->check(integer_in(0, 1'000'000));
  cmd->add_option("--save-dtype", a->save_dtype,
                  "Dtype of the weights each save holds: " + choices(save_dtype_names()) +
                      " (the optimizer state and the f32 master weights that resume reads stay f32)")
      ->capture_default_str()
      ->check(one_of(save_dtype_names()));
  cmd->add_flag("--overwrite", c.overwrite_checkpoint,
                "Replace a checkpoint of another model in --checkpoint (else that is an error)");
  cmd->add_option("--resume", c.resume_from,
                  "Resume from this checkpoint (a run directory or a step-<N> directory); the model is the "
                  "checkpoint's");
  cmd->add_option("--stop-after", c.stop_after, "Stop after this many steps (to test resume)")
      ->check(integer_in(-1, 1'000'000'000));
  table[cmd] = [a, cmd] { return run_train(*a, *cmd); };
}

}  // namespace expar::cli
