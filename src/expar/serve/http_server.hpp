#pragma once
// The OpenAI-compatible HTTP front end (cpp-httplib): POST /v1/completions, POST /v1/chat/completions (JSON,
// or server-sent events with `stream: true`, ending with `data: [DONE]`), GET /v1/models, GET /health,
// GET /metrics (Prometheus text).
#include <atomic>
#include <memory>
#include <string>

#include "expar/infer/text_codec.hpp"
#include "expar/serve/runtime.hpp"

namespace httplib {
class Server;
}

namespace expar::serve {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;           // 0: any free port (bind() returns it)
  int threads = 64;          // connection threads
  int max_concurrent = 256;  // generation requests in flight; beyond: 503
  std::string model_name;    // what /v1/models lists and requests must name
};

class HttpServer {
 public:
  HttpServer(Runtime& runtime, const infer::TextCodec* codec, HttpOptions options);
  ~HttpServer();
  // Binds the socket; returns the port. Throws expar::Error naming host and port on failure.
  int bind();
  // Serves until stop() (from another thread or a signal watcher).
  void listen();
  void stop();
  // Generation requests in flight (a stream until its last event was written).
  int in_flight() const { return in_flight_.load(); }

 private:
  void routes();
  Runtime& runtime_;
  const infer::TextCodec* codec_;
  HttpOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::atomic<int> in_flight_{0};
  int listen_socket_ = -1;
};

}  // namespace expar::serve
