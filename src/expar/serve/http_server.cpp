#include "expar/serve/http_server.hpp"

#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "expar/core/error.hpp"
#include "expar/serve/api_error.hpp"
#include "expar/serve/openai_request.hpp"
#include "expar/serve/text_stream.hpp"

namespace expar::serve {
namespace {

using nlohmann::json;

json error_body(const ApiError& e) {
  json err = {{"message", e.what()}, {"type", e.type()}, {"code", e.status()}};
  err["param"] = e.param().empty() ? json(nullptr) : json(e.param());
  return {{"error", err}};
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string request_id(bool chat) {
  static std::atomic<uint64_t> next{0};
  return fmt::format("{}-{:x}{:06x}", chat ? "chatcmpl" : "cmpl", unix_now(), next++);
}

uint64_t random_seed() {
  static std::mutex mutex;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard lock(mutex);
  return rng();
}

// Counts a generation request as in flight for its whole life (503 beyond the bound).
class InFlight {
 public:
  InFlight(std::atomic<int>& counter, int bound) : counter_(counter) {
    if (counter_.fetch_add(1) >= bound) {
      counter_.fetch_sub(1);
      api_fail(503, "", "{} requests are in flight (--max-concurrent {}): retry later", bound, bound);
    }
  }
  ~InFlight() { counter_.fetch_sub(1); }

 private:
  std::atomic<int>& counter_;
};

const char* openai_finish(FinishReason r) {
  return r == FinishReason::Length ? "length" : "stop";
}

json choice_json(bool chat, const std::string& text, const json& finish, const std::vector<int32_t>& tokens) {
  json c = {{"index", 0}, {"finish_reason", finish}};
  if (chat) {
    c["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    c["text"] = text;
    c["logprobs"] = nullptr;
  }
  c["token_ids"] = tokens;  // an extension (as vLLM's return_token_ids): the generated ids
  return c;
}

json chunk_json(bool chat, const std::string& id, int64_t created, const std::string& model,
                const std::string& text, const json& finish, bool first) {
  json c = {{"index", 0}, {"finish_reason", finish}};
  if (chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || !first) delta["content"] = text;
    c["delta"] = delta;
  } else {
    c["text"] = text;
    c["logprobs"] = nullptr;
  }
  return {{"id", id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({c})}};
}

json usage_json(size_t prompt, size_t completion) {
  return {
      {"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

}  // namespace

HttpServer::HttpServer(Runtime& runtime, const TextCodec* codec, HttpOptions options)
    : runtime_(runtime),
      codec_(codec),
      options_(std::move(options)),
      server_(std::make_unique<httplib::Server>()) {
  EXPAR_CHECK(options_.threads >= 1 && options_.threads <= 4096, "--http-threads {} must be in [1, 4096]",
              options_.threads);
  EXPAR_CHECK(options_.max_concurrent >= 1, "--max-concurrent {} must be at least 1",
              options_.max_concurrent);
  EXPAR_CHECK(options_.port >= 0 && options_.port <= 65535, "--port {} must be in [0, 65535]", options_.port);
  const int threads = options_.threads;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  server_->set_payload_max_length(size_t{8} << 20);
  routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  int port = options_.port;
  if (port == 0) {
    port = server_->bind_to_any_port(options_.host);
  } else if (!server_->bind_to_port(options_.host, port)) {
    port = -1;
  }
  EXPAR_CHECK(port > 0,
              "cannot listen on {}:{} (in use, or not an address of this machine): choose another "
              "--host/--port",
              options_.host, options_.port);
  return port;
}

void HttpServer::listen() {
  server_->listen_after_bind();
}

void HttpServer::stop() {
  server_->stop();
}

void HttpServer::routes() {
  using httplib::Request;
  using httplib::Response;
  const ModelLimits limits{options_.model_name, runtime_.spec().config.vocab, runtime_.spec().config.max_seq};

  server_->Get("/health", [this](const Request&, Response& res) {
    const std::string failure = runtime_.failure();
    if (failure.empty()) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
    } else {
      res.status = 503;
      res.set_content(json({{"status", "failed"}, {"error", failure}}).dump(), "application/json");
    }
  });
  server_->Get("/metrics", [this](const Request&, Response& res) {
    res.set_content(runtime_.metrics().render(), "text/plain; version=0.0.4");
  });
  server_->Get("/v1/models", [this, limits](const Request&, Response& res) {
    json model = {{"id", limits.name},
                  {"object", "model"},
                  {"created", unix_now()},
                  {"owned_by", "expar"},
                  {"max_model_len", limits.max_seq}};
    res.set_content(json({{"object", "list"}, {"data", json::array({model})}}).dump(), "application/json");
  });

  auto generate = [this, limits](bool chat) {
    return [this, limits, chat](const Request& req, Response& res) {
      auto in_flight = std::make_shared<std::unique_ptr<InFlight>>();
      try {
        *in_flight = std::make_unique<InFlight>(in_flight_, options_.max_concurrent);
        const CompletionParams p = parse_completion_request(req.body, chat, codec_, limits);
        GenerationRequest g;
        g.prompt = p.prompt;
        g.max_tokens = p.max_tokens;
        g.sampling = p.sampling;
        g.seed = p.seed ? *p.seed : random_seed();
        if (codec_) g.stop_token_ids = codec_->stop_tokens();
        std::shared_ptr<RequestState> state = runtime_.scheduler().submit(std::move(g));
        const std::string id = request_id(chat);
        const int64_t created = unix_now();
        auto stream = std::make_shared<TextStream>(codec_, p.stop);
        if (!p.stream) {
          std::string text;
          size_t seen = 0;
          while (!state->finished()) {
            std::vector<int32_t> more = state->wait_tokens(seen);
            seen += more.size();
            text += stream->push(more);
            if (stream->stopped()) {
              state->cancel();
              break;
            }
          }
          std::vector<int32_t> more = state->wait_tokens(seen);  // tokens published with the finish
          text += stream->push(more);
          text += stream->flush();
          if (state->finish_reason() == FinishReason::Error)
            api_fail(500, "", "generation failed: {}", state->error());
          const char* finish = stream->stopped() ? "stop" : openai_finish(state->finish_reason());
          json out = {{"id", id},
                      {"object", chat ? "chat.completion" : "text_completion"},
                      {"created", created},
                      {"model", limits.name},
                      {"choices", json::array({choice_json(chat, text, finish, stream->tokens())})},
                      {"usage", usage_json(p.prompt.size(), stream->tokens().size())}};
          res.set_content(out.dump(), "application/json");
          runtime_.metrics().request_finished(200);
          return;
        }
        const size_t prompt_tokens = p.prompt.size();
        const bool include_usage = p.include_usage;
        res.set_header("Cache-Control", "no-cache");
        res.set_chunked_content_provider(
            "text/event-stream",
            [this, state, stream, id, created, chat, prompt_tokens, include_usage, limits, first = true,
             seen = size_t{0}](size_t, httplib::DataSink& sink) mutable {
              auto send = [&](const json& event) {
                const std::string line = "data: " + event.dump() + "\n\n";
                return sink.write(line.data(), line.size());
              };
              if (first && chat) {  // chat streams open with the assistant role
                if (!send(chunk_json(chat, id, created, limits.name, "", nullptr, true))) {
                  state->cancel();
                  return false;
                }
              }
              first = false;
              if (!state->finished() || state->generated() > seen) {
                std::vector<int32_t> more = state->wait_tokens(seen);
                seen += more.size();
                const std::string text = stream->push(more);
                if (stream->stopped()) state->cancel();
                if (!text.empty() &&
                    !send(chunk_json(chat, id, created, limits.name, text, nullptr, false))) {
                  state->cancel();  // the client went away: free its slot and cache now
                  return false;
                }
                if (!stream->stopped()) return true;
              }
              const std::string rest = stream->flush();
              if (state->finish_reason() == FinishReason::Error) {
                send({{"error", {{"message", state->error()}, {"type", "server_error"}, {"code", 500}}}});
              } else {
                const char* finish = stream->stopped() ? "stop" : openai_finish(state->finish_reason());
                send(chunk_json(chat, id, created, limits.name, rest, finish, false));
                if (include_usage) {
                  json u = {{"id", id},
                            {"object", chat ? "chat.completion.chunk" : "text_completion"},
                            {"created", created},
                            {"model", limits.name},
                            {"choices", json::array()},
                            {"usage", usage_json(prompt_tokens, stream->tokens().size())}};
                  send(u);
                }
              }
              const std::string done = "data: [DONE]\n\n";
              sink.write(done.data(), done.size());
              sink.done();
              return true;
            },
            [this, state, in_flight](bool success) {
              if (!success) state->cancel();
              runtime_.metrics().request_finished(success ? 200 : 499);
              in_flight->reset();
            });
      } catch (const ApiError& e) {
        res.status = e.status();
        res.set_content(error_body(e).dump(), "application/json");
        runtime_.metrics().request_finished(e.status());
      } catch (const std::exception& e) {
        const ApiError wrapped(500, e.what());
        res.status = 500;
        res.set_content(error_body(wrapped).dump(), "application/json");
        runtime_.metrics().request_finished(500);
      }
    };
  };
  server_->Post("/v1/completions", generate(false));
  server_->Post("/v1/chat/completions", generate(true));
  server_->set_error_handler([](const Request&, Response& res) {
    if (!res.body.empty()) return;
    const ApiError e(res.status, fmt::format("HTTP {}: no such route (see GET /v1/models)", res.status));
    res.set_content(error_body(e).dump(), "application/json");
  });
}

}  // namespace expar::serve
