#pragma once
// expar serve on a free loopback port for a test: the runtime, the checkpoint's text codec and the HTTP
// server on its own thread, stopped on destruction (also when an assertion ends the test early).
#include <httplib.h>

#include <memory>
#include <thread>

#include "expar/serve/http_server.hpp"

namespace expar::serve::testing {

struct TestServer {
  explicit TestServer(const RuntimeOptions& options, int max_concurrent = 256, int http_threads = 64) {
    runtime = std::make_unique<Runtime>(options);
    codec = infer::text_codec_for(runtime->spec());
    HttpOptions h;
    h.port = 0;
    h.model_name = "tiny";
    h.max_concurrent = max_concurrent;
    h.threads = http_threads;
    http = std::make_unique<HttpServer>(*runtime, codec.get(), h);
    port = http->bind();
    thread = std::thread([this] { http->listen(); });
  }
  ~TestServer() {
    http->stop();
    thread.join();
    runtime->shutdown(true);
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c;
  }
  std::string metrics() const {
    auto res = client().Get("/metrics");
    return res ? res->body : "";
  }

  std::unique_ptr<Runtime> runtime;
  std::unique_ptr<infer::TextCodec> codec;
  std::unique_ptr<HttpServer> http;
  int port = 0;
  std::thread thread;
};

}  // namespace expar::serve::testing
