#pragma once
// Client-side helpers of the serve tests: a streaming request on a raw socket (so that a test can stop
// reading or disconnect mid-stream), the events of a server-sent-event body, and polling for a condition.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

namespace expar::serve::testing {

// Sends a streaming POST /v1/completions and reads until `min_bytes` arrived (into *got when given);
// returns the socket, which the caller reads further or closes.
inline int open_stream(int port, const nlohmann::json& body, size_t min_bytes, std::string* got = nullptr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string b = body.dump();
  const std::string req =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(b.size()) + "\r\n\r\n" + b;
  EXPECT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  std::string received;
  char buf[4096];
  while (received.size() < min_bytes) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    received.append(buf, static_cast<size_t>(n));
  }
  EXPECT_GE(received.size(), min_bytes) << received;
  if (got) *got = std::move(received);
  return fd;
}

// Everything the peer sends until it closes the connection.
inline std::string read_to_end(int fd) {
  std::string got;
  char buf[4096];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return got;
    got.append(buf, static_cast<size_t>(n));
  }
}

// The events of a server-sent-event stream of completions or chat completions.
struct StreamEvents {
  std::string text, finish;       // the pieces of text joined; the last finish_reason
  bool done = false;              // data: [DONE] arrived
  int64_t usage_completion = -1;  // usage.completion_tokens of the usage event, -1 without one
};

inline StreamEvents stream_events(const std::string& body) {
  StreamEvents s;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    const std::string data = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") {
      s.done = true;
      continue;
    }
    const nlohmann::json event = nlohmann::json::parse(data);
    if (event.contains("usage") && !event["usage"].is_null()) {
      s.usage_completion = event["usage"]["completion_tokens"];
      if (event["choices"].empty()) continue;
    }
    const nlohmann::json& choice = event["choices"][0];
    if (choice.contains("text")) s.text += choice["text"].get<std::string>();
    if (choice.contains("delta") && choice["delta"].contains("content"))
      s.text += choice["delta"]["content"].get<std::string>();
    if (!choice["finish_reason"].is_null()) s.finish = choice["finish_reason"];
  }
  return s;
}

// Polls `done` every 50 ms for up to 10 s.
inline bool wait_for(const std::function<bool()>& done) {
  for (int i = 0; i < 200; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace expar::serve::testing
