#pragma once
// An error the server answers with an HTTP status and an OpenAI-style error body (message, type, param).
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace expar::serve {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {})
      : std::runtime_error(message), status_(status), param_(std::move(param)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  // "invalid_request_error" (4xx) or "server_error" / "overloaded_error" (5xx), as OpenAI names them.
  const char* type() const {
    return status_ == 503 ? "overloaded_error" : status_ >= 500 ? "server_error" : "invalid_request_error";
  }

 private:
  int status_;
  std::string param_;
};

template <typename... Args>
[[noreturn]] void api_fail(int status, const std::string& param, fmt::format_string<Args...> format,
                           Args&&... args) {
  throw ApiError(status, fmt::format(format, std::forward<Args>(args)...), param);
}

}  // namespace expar::serve
