// expar serve: an OpenAI-compatible HTTP server over the inference engine with continuous batching across
// DP replicas (serve/). SIGTERM or SIGINT: stop accepting, finish the requests in flight, exit 0.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include "expar/cli/commands.hpp"
#include "expar/cli/serve_options.hpp"
#include "expar/core/error.hpp"
#include "expar/serve/http_server.hpp"
#include "expar/serve/runtime.hpp"

namespace expar::cli {
namespace {

struct ServeArgs {
  RuntimeArgs runtime;
  std::string model_name;  // default: the checkpoint directory's name
  std::string transport = "threads";
  std::string host = "127.0.0.1";
  int port = 8000;
  int http_threads = 64;
  int max_concurrent = 256;
};

int run_serve(const ServeArgs& a) {
  EXPAR_CHECK(
      a.transport == "threads",
      "--transport {}: expar serve runs its ranks as threads of one process; the MPI transport is not "
      "built for serve yet (the step plans would have to travel to the other processes): use "
      "--transport threads",
      a.transport);
  const serve::RuntimeOptions o = runtime_options(a.runtime);

  // Signals go to the watcher thread only: block them before any thread starts (threads inherit the mask).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  serve::Runtime runtime(o);
  std::unique_ptr<serve::TextCodec> codec = serve::text_codec_for(runtime.spec());
  serve::HttpOptions h;
  h.host = a.host;
  h.port = a.port;
  h.threads = a.http_threads;
  h.max_concurrent = a.max_concurrent;
  h.model_name = a.model_name.empty() ? std::filesystem::weakly_canonical(a.runtime.path).filename().string()
                                      : a.model_name;
  serve::HttpServer server(runtime, codec.get(), h);
  const int port = server.bind();
  std::thread watcher([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "expar serve: signal %d: finishing the requests in flight\n", sig);
    server.stop();
  });
  std::fprintf(stderr,
               "expar serve: model '%s' (%s, %d layers, %d experts) on TP %d x DP %d, %lld KV tokens per "
               "replica; listening on http://%s:%d\n",
               h.model_name.c_str(), infer::model_format_name(runtime.spec().format).c_str(),
               runtime.spec().config.layers, runtime.spec().config.moe.num_experts, a.runtime.tp,
               a.runtime.dp, static_cast<long long>(runtime.scheduler().kv_tokens()), a.host.c_str(), port);
  server.listen();  // returns after stop(): in-flight handlers have completed
  runtime.shutdown(false);
  pthread_kill(watcher.native_handle(), SIGTERM);  // no-op if the watcher already returned
  watcher.join();
  const std::string failure = runtime.failure();
  EXPAR_CHECK(failure.empty(), "the ranks failed: {}", failure);
  std::fprintf(stderr, "expar serve: stopped\n");
  return 0;
}

}  // namespace

void add_serve(CLI::App& app, CommandTable& table) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server with EP across TP x DP ranks");
  auto a = std::make_shared<ServeArgs>();
  add_runtime_options(cmd, a->runtime);
  cmd->add_option("--model-name", a->model_name,
                  "Name clients use (default: the checkpoint directory's name)");
  cmd->add_option("--transport", a->transport, "Ranks as: threads (mpi is not built for serve yet)")
      ->capture_default_str();
  cmd->add_option("--host", a->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a->port, "Port (0: any free port, printed at start)")->capture_default_str();
  cmd->add_option("--http-threads", a->http_threads, "Connection threads")->capture_default_str();
  cmd->add_option("--max-concurrent", a->max_concurrent, "Generation requests in flight before 503")
      ->capture_default_str();
  table[cmd] = [a] { return run_serve(*a); };
}

}  // namespace expar::cli
