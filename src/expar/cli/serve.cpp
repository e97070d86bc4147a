// expar serve: an OpenAI-compatible HTTP server over the inference engine with continuous batching across
// DP replicas (serve/), its ranks threads of this process or (--transport mpi) processes under mpirun.
// SIGTERM or SIGINT: stop accepting, finish the requests in flight, exit 0.
#include <fmt/format.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include "expar/cli/commands.hpp"
#include "expar/cli/load_report.hpp"
#include "expar/cli/option_checks.hpp"
#include "expar/cli/serve_options.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"
#include "expar/serve/http_server.hpp"
#include "expar/serve/mpi_steps.hpp"
#include "expar/serve/rank_loop.hpp"
#include "expar/serve/runtime.hpp"

namespace expar::cli {
namespace {

sigset_t stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  return signals;
}

struct ServeArgs {
  RuntimeArgs runtime;
  std::string model_name;  // default: the checkpoint directory's name
  std::string transport = "threads";
  std::string host = "127.0.0.1";
  int port = 8000;
  int http_threads = 64;
  int max_concurrent = 256;
};

// Serves HTTP until one of `signals` (blocked in every thread) arrives. mpi_world: this process is world
// rank 0 of an MPI job (the other processes follow its steps); null: the ranks are threads of this process.
int serve_http(const ServeArgs& a, const serve::RuntimeOptions& o, Comm* mpi_world, sigset_t signals) {
  std::unique_ptr<serve::Runtime> runtime;
  {
    const infer::ModelSpec spec = infer::open_model_spec(o.path, o.model.format);
    const InferenceLayout layout = infer::inference_layout(o.model, spec.config);
    const LoadReport report("expar serve", spec, o.model, serve::kv_tokens_per_rank(o, spec, layout));
    runtime =
        mpi_world ? std::make_unique<serve::Runtime>(o, *mpi_world) : std::make_unique<serve::Runtime>(o);
  }
  std::unique_ptr<infer::TextCodec> codec = infer::text_codec_for(runtime->spec());
  serve::HttpOptions h;
  h.host = a.host;
  h.port = a.port;
  h.threads = a.http_threads;
  h.max_concurrent = a.max_concurrent;
  h.model_name = a.model_name.empty()
                     ? std::filesystem::weakly_canonical(a.runtime.checkpoint.dir).filename().string()
                     : a.model_name;
  serve::HttpServer server(*runtime, codec.get(), h);
  const int port = server.bind();
  // The first signal: new generation requests get a 503, the ones in flight (streams included) finish, then
  // the listener closes. A second signal cancels what is still in flight.
  std::thread watcher([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    fmt::print(stderr,
               "expar serve: signal {}: finishing the requests in flight ({}; signal again to cancel them)\n",
               sig, server.in_flight());
    runtime->scheduler().stop(false);
    bool cancelled = false;
    const timespec tick{0, 10'000'000};
    while (server.in_flight() > 0)
      if (sigtimedwait(&signals, nullptr, &tick) > 0 && !cancelled) {
        fmt::print(stderr, "expar serve: signal again: cancelling the requests in flight\n");
        runtime->scheduler().stop(true);
        cancelled = true;
      }
    server.stop();
  });
  fmt::print(stderr,
             "expar serve: model '{}' ({}, {} layers, {} experts) on TP {} x DP {}, EP {} ({}), {} KV tokens "
             "per replica; listening on http://{}:{}\n",
             h.model_name, infer::model_format_name(runtime->spec().format), runtime->spec().config.layers,
             runtime->spec().config.moe.router.num_experts, runtime->layout().tp(), runtime->layout().dp(),
             ep_label(runtime->layout().expert_parallel(), runtime->layout().ep_degree(),
                      runtime->layout().tp(), runtime->layout().dp()),
             mpi_world ? "MPI processes" : "threads", runtime->scheduler().kv_tokens(), a.host, port);
  server.listen();  // returns after stop(), which the watcher calls once nothing is in flight
  runtime->shutdown(false);
  pthread_kill(watcher.native_handle(), SIGTERM);  // no-op if the watcher already returned
  watcher.join();
  const std::string failure = runtime->failure();
  EXPAR_CHECK(failure.empty(), "the ranks failed: {}", failure);
  fmt::print(stderr, "expar serve: stopped\n");
  return 0;
}

int run_serve(const ServeArgs& a) {
  const serve::RuntimeOptions o = runtime_options(a.runtime);
  // Signals go to the watcher thread only: block them before any thread starts (threads inherit the mask;
  // MPI_Init starts threads of its own).
  const sigset_t signals = stop_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  if (a.transport == "threads") return serve_http(a, o, nullptr, signals);
  EXPAR_CHECK(a.transport == "mpi",
              "--transport '{}' is unknown: use threads (default) or mpi (under mpirun)", a.transport);
  // One rank per process under mpirun (scripts/mpirun-local -n TP*DP). Rank 0 serves; the others run its
  // steps and leave when it stops. They leave SIGTERM and SIGINT blocked (mpirun-local forwards them to
  // every rank): rank 0 finishes the requests in flight, then ends them.
  LaunchOptions launch;
  launch.compute_threads = o.model.compute_threads;
  int status = 0;
  run_mpi(nullptr, nullptr, launch, [&](Comm& world) {
    if (world.rank() == 0)
      status = serve_http(a, o, &world, signals);
    else
      serve::run_mpi_follower(o, world);
  });
  return status;
}

}  // namespace

void add_serve(CLI::App& app, CommandTable& table) {
  auto* cmd = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server on TP x DP ranks (EP with --enable-expert-parallel)");
  auto a = std::make_shared<ServeArgs>();
  add_runtime_options(cmd, a->runtime);
  cmd->add_option("--model-name", a->model_name,
                  "Name clients use (default: the checkpoint directory's name)");
  cmd->add_option("--transport", a->transport,
                  "threads (ranks are threads of this process) | mpi (one rank per process, under mpirun; "
                  "rank 0 serves HTTP)")
      ->capture_default_str()
      ->check(one_of(transport_names()));
  cmd->add_option("--host", a->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a->port, "Port (0: any free port, printed at start)")->capture_default_str();
  cmd->add_option("--http-threads", a->http_threads, "Connection threads")->capture_default_str();
  cmd->add_option("--max-concurrent", a->max_concurrent, "Generation requests in flight before 503")
      ->capture_default_str();
  table[cmd] = [a] { return run_serve(*a); };
}

}  // namespace expar::cli
