#include "expar/serve/mpi_steps.hpp"

#include <algorithm>
#include <numeric>

#include "expar/comm/comm_env.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/serve/runtime.hpp"

namespace expar::serve {
namespace {

enum Kind : int64_t { kIdle = 0, kStep = 1, kDone = 2 };

// The kv-cache bytes per token the scheduler plans with: the largest over all ranks.
int64_t largest_over_ranks(Comm& world, int64_t value) {
  world.all_reduce(&value, 1, DType::I64, ReduceOp::Max);
  return value;
}

// Every rank's result, in world-rank order (an all-gather: the messages are a few hundred bytes).
std::vector<RankResult> gather_results(Comm& world, const RankResult& mine) {
  const std::vector<int64_t> wire = encode_result(mine);
  const auto n = static_cast<size_t>(world.size());
  std::vector<int64_t> lengths(n);
  const int64_t length = static_cast<int64_t>(wire.size());
  world.all_gather(&length, lengths.data(), 1, DType::I64);
  std::vector<size_t> counts(lengths.begin(), lengths.end());
  std::vector<int64_t> all(static_cast<size_t>(std::accumulate(lengths.begin(), lengths.end(), int64_t{0})));
  world.all_gather_v(wire.data(), wire.size(), all.data(), counts, DType::I64);
  std::vector<RankResult> results;
  size_t at = 0;
  for (size_t r = 0; r < n; ++r) {
    results.push_back(decode_result(all.data() + at, counts[r]));
    at += counts[r];
  }
  return results;
}

class RootChannel : public StepChannel {
 public:
  RootChannel(StepBoard& board, Metrics& metrics, Comm& world)
      : board_(board),
        metrics_(metrics),
        world_(world),
        idle_(std::min(1.0, comm_timeout_seconds(LaunchOptions{}.timeout_seconds) / 4)) {}

  void loaded(int64_t kv_bytes_per_token) override {
    board_.loaded(largest_over_ranks(world_, kv_bytes_per_token));
  }
  const StepPlan* next() override {
    for (;;) {
      const StepPlan* plan = nullptr;
      switch (board_.wait_next(seen_, plan, idle_)) {
        case StepBoard::Next::Idle:
          header(kIdle, 0);
          break;
        case StepBoard::Next::Done:
          header(kDone, 0);
          return nullptr;
        case StepBoard::Next::Step: {
          std::vector<int64_t> wire = encode_plan(*plan);
          header(kStep, static_cast<int64_t>(wire.size()));
          world_.broadcast(wire.data(), wire.size(), DType::I64, 0);
          return plan;
        }
      }
    }
  }
  void finished(RankResult result) override {
    std::vector<RankResult> all = gather_results(world_, result);
    for (size_t r = 0; r < all.size(); ++r) board_.deliver(static_cast<int>(r), std::move(all[r]), metrics_);
    board_.arrive();
  }

 private:
  void header(int64_t kind, int64_t length) {
    int64_t h[2] = {kind, length};
    world_.broadcast(h, 2, DType::I64, 0);
  }
  StepBoard& board_;
  Metrics& metrics_;
  Comm& world_;
  std::chrono::duration<double> idle_;
  uint64_t seen_ = 0;
};

class FollowerChannel : public StepChannel {
 public:
  explicit FollowerChannel(Comm& world) : world_(world) {}
  void loaded(int64_t kv_bytes_per_token) override { largest_over_ranks(world_, kv_bytes_per_token); }
  const StepPlan* next() override {
    for (;;) {
      int64_t h[2] = {0, 0};
      world_.broadcast(h, 2, DType::I64, 0);
      if (h[0] == kIdle) continue;
      if (h[0] == kDone) return nullptr;
      EXPAR_ASSERT(h[0] == kStep && h[1] >= 0, "rank 0 sent an unknown step header {{{}, {}}}", h[0], h[1]);
      std::vector<int64_t> wire(static_cast<size_t>(h[1]));
      world_.broadcast(wire.data(), wire.size(), DType::I64, 0);
      plan_ = decode_plan(wire);
      return &plan_;
    }
  }
  void finished(RankResult result) override { gather_results(world_, result); }

 private:
  Comm& world_;
  StepPlan plan_;
};

}  // namespace

void check_mpi_world(const InferenceLayout& layout, const Comm& world) {
  EXPAR_CHECK(
      world.size() == layout.world(),
      "expar serve --transport mpi runs one process per rank: mpirun started {} processes but --tp {} "
      "x --dp {} = {} ranks; start mpirun -n {}",
      world.size(), layout.tp(), layout.dp(), layout.world(), layout.world());
}

std::unique_ptr<StepChannel> mpi_root_channel(StepBoard& board, Metrics& metrics, Comm& world) {
  EXPAR_ASSERT(world.rank() == 0, "the MPI root channel runs on world rank 0, not {}", world.rank());
  return std::make_unique<RootChannel>(board, metrics, world);
}

void run_mpi_follower(const RuntimeOptions& options, Comm& world) {
  const ServingModel model = open_serving_model(options, &world);
  check_mpi_world(model.layout, world);
  FollowerChannel channel(world);
  run_serving_rank(options, model, world, channel);
}

}  // namespace expar::serve
