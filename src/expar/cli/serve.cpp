// expar serve: an OpenAI-compatible HTTP server over the inference engine with continuous batching across
// DP replicas (serve/). SIGTERM or SIGINT: stop accepting, finish the requests in flight, exit 0.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include "expar/cli/commands.hpp"
#include "expar/core/error.hpp"
#include "expar/serve/http_server.hpp"
#include "expar/serve/runtime.hpp"
#include "expar/topo/placement.hpp"

namespace expar::cli {
namespace {

struct ServeArgs {
  std::string path;
  std::string format = "auto";
  std::string model_name;  // default: the checkpoint directory's name
  int tp = 1, dp = 1, ep = 0;
  bool no_ep = false;
  std::string placement = "contiguous";
  std::string decode_moe = "allreduce";
  int threads = 1;  // compute threads per rank
  bool no_batch_invariant = false;
  int64_t kv_cache_mb = 256;
  serve::SchedulerOptions scheduler;
  std::string host = "127.0.0.1";
  int port = 8000;
  int http_threads = 64;
  int max_concurrent = 256;
};

int run_serve(const ServeArgs& a) {
  EXPAR_CHECK(!a.path.empty(), "expar serve needs a model: pass --path <checkpoint dir or file>");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  EXPAR_CHECK(a.threads >= 1 && a.threads <= 1024, "--threads {} must be in [1, 1024]", a.threads);
  serve::RuntimeOptions o;
  o.path = a.path;
  o.model.tp = a.tp;
  o.model.dp = a.dp;
  o.model.enable_expert_parallel = !a.no_ep;
  if (a.ep > 0) o.model.ep_degree = a.ep;
  o.model.placement = placement_from_name(a.placement);
  if (a.format != "auto") o.model.format = infer::model_format_from_name(a.format);
  o.model.decode_moe = infer::decode_moe_from_name(a.decode_moe);
  o.model.compute_threads = a.threads;
  o.batch_invariant = !a.no_batch_invariant;
  o.kv_cache_mb = a.kv_cache_mb;
  o.scheduler = a.scheduler;
  if (static_cast<unsigned>(a.tp * a.dp * a.threads) > cores)
    std::fprintf(stderr, "expar serve: warning: %d ranks x %d threads exceed the %u cores (oversubscribed)\n",
                 a.tp * a.dp, a.threads, cores);

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
  h.model_name =
      a.model_name.empty() ? std::filesystem::weakly_canonical(a.path).filename().string() : a.model_name;
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
               runtime.spec().config.layers, runtime.spec().config.moe.num_experts, a.tp, a.dp,
               static_cast<long long>(runtime.scheduler().kv_tokens()), a.host.c_str(), port);
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
  cmd->add_option("--path", a->path, "Checkpoint directory or a file in one")->required();
  cmd->add_option("--format", a->format, "Checkpoint format: auto | ours | mixtral | qwen-moe | gpt-oss")
      ->capture_default_str();
  cmd->add_option("--model-name", a->model_name,
                  "Name clients use (default: the checkpoint directory's name)");
  cmd->add_option("--tp", a->tp, "Tensor-parallel degree (ranks per DP replica)")->capture_default_str();
  cmd->add_option("--dp", a->dp, "Data-parallel replicas (each schedules its own requests)")
      ->capture_default_str();
  cmd->add_option("--ep", a->ep, "EP degree (0: TP*DP; < TP: variable EP+TP)")->capture_default_str();
  cmd->add_flag("--no-ep", a->no_ep, "Shard experts on the intermediate dimension over TP instead of EP");
  cmd->add_option("--placement", a->placement, "Expert placement: contiguous | round-robin")
      ->capture_default_str();
  cmd->add_option("--decode-moe", a->decode_moe, "Decode MoE pattern: allreduce | rowwise (full EP only)")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "Compute threads per rank")->capture_default_str();
  cmd->add_flag(
      "--no-batch-invariant", a->no_batch_invariant,
      "Let small batches use faster kernels (a request's tokens may then depend on its neighbours)");
  cmd->add_option("--kv-cache-mb", a->kv_cache_mb, "KV-cache budget per rank (MiB)")->capture_default_str();
  cmd->add_option("--max-batch-tokens", a->scheduler.max_batch_tokens, "Tokens per replica per step")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", a->scheduler.prefill_chunk, "Prompts run in chunks of this many tokens")
      ->capture_default_str();
  cmd->add_option("--max-running", a->scheduler.max_running, "Sequences per replica in the running batch")
      ->capture_default_str();
  cmd->add_option("--max-waiting", a->scheduler.max_waiting, "Queued requests before 503")
      ->capture_default_str();
  cmd->add_option("--host", a->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a->port, "Port (0: any free port, printed at start)")->capture_default_str();
  cmd->add_option("--http-threads", a->http_threads, "Connection threads")->capture_default_str();
  cmd->add_option("--max-concurrent", a->max_concurrent, "Generation requests in flight before 503")
      ->capture_default_str();
  table[cmd] = [a] { return run_serve(*a); };
}

}  // namespace expar::cli
