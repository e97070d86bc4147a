#include "expar/serve/runtime.hpp"

#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"
#include "expar/serve/mpi_steps.hpp"
#include "expar/serve/step_board.hpp"

namespace expar::serve {
namespace {

// A rank thread of this process: plans from the board, results to it.
class BoardChannel : public StepChannel {
 public:
  BoardChannel(StepBoard& board, Metrics& metrics, int rank)
      : board_(board), metrics_(metrics), rank_(rank) {}
  void loaded(int64_t kv_bytes_per_token) override { board_.loaded(kv_bytes_per_token); }
  const StepPlan* next() override {
    const StepPlan* plan = nullptr;
    return board_.wait_next(seen_, plan) == StepBoard::Next::Step ? plan : nullptr;
  }
  void finished(RankResult result) override {
    board_.deliver(rank_, std::move(result), metrics_);
    board_.arrive();
  }

 private:
  StepBoard& board_;
  Metrics& metrics_;
  int rank_;
  uint64_t seen_ = 0;
};

}  // namespace

Runtime::Runtime(RuntimeOptions options) : Runtime(std::move(options), nullptr) {}

Runtime::Runtime(RuntimeOptions options, Comm& world) : Runtime(std::move(options), &world) {}

Runtime::Runtime(RuntimeOptions options, Comm* mpi_world)
    : options_(std::move(options)), model_(open_serving_model(options_, mpi_world)) {
  if (mpi_world) check_mpi_world(model_.layout, *mpi_world);
  board_ = std::make_unique<StepBoard>(mpi_world ? 1 : model_.layout.world(), model_.layout.dp());
  if (mpi_world) {
    ranks_ = std::thread([this, mpi_world] {
      try {
        set_compute_threads(options_.model.compute_threads);  // per thread (OpenMP)
        std::unique_ptr<StepChannel> channel = mpi_root_channel(*board_, metrics_, *mpi_world);
        run_serving_rank(options_, model_, *mpi_world, *channel);
      } catch (const std::exception& e) {
        // Peers wait in a collective this rank will not join: end the job, as run_mpi does.
        abort_mpi_job(e.what());
      }
    });
  } else {
    ranks_ = std::thread([this] {
      LaunchOptions launch;
      launch.ranks = model_.layout.world();
      launch.compute_threads = options_.model.compute_threads;
      try {
        run_ranks(launch, [this](Comm& world) {
          BoardChannel channel(*board_, metrics_, world.rank());
          try {
            run_serving_rank(options_, model_, world, channel);
          } catch (const std::exception& e) {
            board_->fail(fmt::format("rank {}: {}", world.rank(), e.what()));
            throw;
          }
        });
      } catch (const std::exception& e) {
        board_->fail(e.what());
      }
    });
  }
  if (!board_->wait_loaded()) {
    ranks_.join();
    throw Error(fmt::format("expar serve: loading {} failed: {}", options_.path, failure()));
  }
  try {
    const int64_t kv_bytes = board_->kv_bytes_per_token();
    const int64_t kv_tokens = options_.kv_cache_mb * (int64_t{1} << 20) / kv_bytes;
    EXPAR_CHECK(kv_tokens >= 1, "--kv-cache-mb {} holds no token of this model ({} bytes per token per rank)",
                options_.kv_cache_mb, kv_bytes);
    scheduler_ = std::make_unique<Scheduler>(options_.scheduler, model_.layout.dp(), kv_tokens,
                                             model_.spec.config.max_seq, metrics_);
    if (model_.layout.expert_parallel())
      rebalancer_ = std::make_unique<ExpertRebalancer>(options_.eplb, model_.layout.placement(),
                                                       model_.spec.config.layers);
  } catch (...) {
    shutdown(true);  // the ranks are loaded and waiting: end them before the error leaves
    throw;
  }
  stepper_ = std::thread([this] { step_loop(); });
}

Runtime::~Runtime() {
  shutdown(true);
}

void Runtime::shutdown(bool cancel_in_flight) {
  if (scheduler_) scheduler_->stop(cancel_in_flight);
  if (stepper_.joinable()) stepper_.join();
  board_->finish();
  if (ranks_.joinable()) ranks_.join();
}

std::string Runtime::failure() const {
  return board_->failure();
}

void Runtime::step_loop() {
  while (std::optional<StepPlan> plan = scheduler_->next_step()) {
    if (rebalancer_ && plan->runs_engine) plan->expert_tables = rebalancer_->before_step();
    StepTokens tokens;
    StepLoad load;
    if (!board_->run(*plan, tokens, load)) {
      scheduler_->fail(board_->failure());
      return;
    }
    if (rebalancer_ && plan->runs_engine) {
      rebalancer_->after_step(load);
      metrics_.expert_imbalance(rebalancer_->layer_imbalance());
    }
    if (!plan->expert_tables.empty())
      metrics_.experts_moved(static_cast<int>(plan->expert_tables.size()), load.moved_bytes,
                             load.move_seconds);
    scheduler_->complete_step(*plan, tokens);
  }
}

}  // namespace expar::serve
