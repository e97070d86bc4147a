#include "expar/serve/openai_request.hpp"

#include <cmath>
#include <nlohmann/json.hpp>

#include "expar/serve/api_error.hpp"

namespace expar::serve {
namespace {

using nlohmann::json;

const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

double number_field(const json& body, const char* name, double fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number()) api_fail(400, name, "'{}' must be a number, got {}", name, v->dump());
  const double x = v->get<double>();
  if (!std::isfinite(x)) api_fail(400, name, "'{}' must be finite, got {}", name, v->dump());
  return x;
}

std::optional<int64_t> integer_field(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) api_fail(400, name, "'{}' must be an integer, got {}", name, v->dump());
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    api_fail(400, name, "'{}' = {} is too large", name, v->dump());
  return v->get<int64_t>();
}

bool bool_field(const json& body, const char* name, bool fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) api_fail(400, name, "'{}' must be true or false, got {}", name, v->dump());
  return v->get<bool>();
}

// Fields of the OpenAI API expar does not implement: accepted only at their defaults.
void refuse_unsupported(const json& body, bool chat) {
  if (auto n = integer_field(body, "n"); n && *n != 1)
    api_fail(400, "n", "n={} is not supported: expar returns one choice per request (n=1); send {} requests",
             *n, *n);
  if (auto b = integer_field(body, "best_of"); b && *b != 1)
    api_fail(400, "best_of", "best_of={} is not supported (only 1)", *b);
  if (bool_field(body, "echo", false)) api_fail(400, "echo", "echo=true is not supported");
  for (const char* name : {"presence_penalty", "frequency_penalty"})
    if (number_field(body, name, 0.0) != 0.0) api_fail(400, name, "'{}' is not supported (only 0)", name);
  for (const char* name : {"logit_bias", "suffix", "tools", "functions", "response_format"})
    if (field(body, name)) api_fail(400, name, "'{}' is not supported by expar serve", name);
  const json* lp = field(body, "logprobs");
  if (lp && !(lp->is_boolean() && !lp->get<bool>()))
    api_fail(400, "logprobs", "logprobs are not supported: leave 'logprobs' unset");
  if (chat && bool_field(body, "top_logprobs", false))
    api_fail(400, "top_logprobs", "top_logprobs are not supported");
}

std::vector<int32_t> token_ids(const json& array, const ModelLimits& limits) {
  std::vector<int32_t> ids;
  for (const json& t : array) {
    if (!t.is_number_integer())
      api_fail(400, "prompt", "'prompt' token ids must be integers, got {}", t.dump());
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= limits.vocab)
      api_fail(400, "prompt", "prompt token {} is outside the vocabulary [0, {}) of {}", id, limits.vocab,
               limits.name);
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

std::string message_text(const json& content, size_t index) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {  // content parts: only text parts
    std::string text;
    for (const json& part : content) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
          !part["text"].is_string())
        api_fail(400, "messages",
                 "messages[{}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) are "
                 "supported",
                 index);
      text += part["text"].get<std::string>();
    }
    return text;
  }
  api_fail(400, "messages", "messages[{}].content must be a string or a list of text parts", index);
}

}  // namespace

CompletionParams parse_completion_request(const std::string& body_text, bool chat,
                                          const infer::TextCodec* codec, const ModelLimits& limits) {
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::exception& e) {
    api_fail(400, "", "the request body is not valid JSON: {}", e.what());
  }
  if (!body.is_object()) api_fail(400, "", "the request body must be a JSON object");
  CompletionParams p;
  p.chat = chat;
  if (const json* m = field(body, "model")) {
    if (!m->is_string()) api_fail(400, "model", "'model' must be a string");
    p.model = m->get<std::string>();
    if (p.model != limits.name)
      api_fail(404, "model", "the model '{}' does not exist: this server serves '{}'", p.model, limits.name);
  }
  refuse_unsupported(body, chat);
  if (chat) {
    const json* messages = field(body, "messages");
    if (!messages || !messages->is_array() || messages->empty())
      api_fail(400, "messages", "'messages' must be a non-empty list of {{\"role\", \"content\"}} objects");
    json clean = json::array();
    for (size_t i = 0; i < messages->size(); ++i) {
      const json& m = (*messages)[i];
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content"))
        api_fail(400, "messages", "messages[{}] must be an object with a string 'role' and a 'content'", i);
      clean.push_back({{"role", m["role"]}, {"content", message_text(m["content"], i)}});
    }
    std::optional<std::string> text = codec ? codec->chat_prompt(clean) : std::nullopt;
    if (!text)
      api_fail(400, "messages", "the model {} has no chat template: use /v1/completions with a prompt",
               limits.name);
    p.prompt = codec->encode_chat(*text);
  } else {
    const json* prompt = field(body, "prompt");
    if (!prompt) api_fail(400, "prompt", "'prompt' is required (a string or a list of token ids)");
    if (prompt->is_string()) {
      if (!codec)
        api_fail(400, "prompt", "the model {} has no tokenizer here: send 'prompt' as a list of token ids",
                 limits.name);
      p.prompt = codec->encode(prompt->get<std::string>());
    } else if (prompt->is_array() && (prompt->empty() || (*prompt)[0].is_number())) {
      p.prompt = token_ids(*prompt, limits);
    } else {
      api_fail(400, "prompt", "'prompt' must be a string or a list of token ids (one prompt per request)");
    }
  }
  if (p.prompt.empty()) api_fail(400, "prompt", "the prompt is empty");
  const auto prompt_len = static_cast<int64_t>(p.prompt.size());
  std::optional<int64_t> max_tokens = integer_field(body, "max_tokens");
  if (chat && !max_tokens) max_tokens = integer_field(body, "max_completion_tokens");
  if (max_tokens) {
    if (*max_tokens < 1) api_fail(400, "max_tokens", "max_tokens={} must be at least 1", *max_tokens);
    p.max_tokens = *max_tokens;
  } else {
    p.max_tokens = chat ? std::max<int64_t>(limits.max_seq - prompt_len, 1) : 16;
  }
  p.sampling.temperature = number_field(body, "temperature", 1.0);
  p.sampling.top_p = number_field(body, "top_p", 1.0);
  if (auto k = integer_field(body, "top_k")) p.sampling.top_k = *k == -1 ? 0 : *k;  // vLLM: -1 = all
  try {
    infer::validate(p.sampling);
  } catch (const std::exception& e) {
    api_fail(400, "temperature", "{}", e.what());
  }
  if (const json* s = field(body, "seed")) {
    if (!s->is_number_integer()) api_fail(400, "seed", "'seed' must be an integer, got {}", s->dump());
    p.seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
  if (const json* s = field(body, "stop")) {
    if (s->is_string()) {
      p.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (const json& x : *s) {
        if (!x.is_string()) api_fail(400, "stop", "'stop' must be a string or a list of strings");
        p.stop.push_back(x.get<std::string>());
      }
    } else {
      api_fail(400, "stop", "'stop' must be a string or a list of strings");
    }
    if (p.stop.size() > 16) api_fail(400, "stop", "at most 16 stop strings, got {}", p.stop.size());
    for (const std::string& x : p.stop)
      if (x.empty()) api_fail(400, "stop", "stop strings must not be empty");
    if (!p.stop.empty() && !codec)
      api_fail(400, "stop", "stop strings need a tokenizer, and {} has none here", limits.name);
  }
  p.stream = bool_field(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) api_fail(400, "stream_options", "'stream_options' must be an object");
    p.include_usage = bool_field(*so, "include_usage", false);
  }
  return p;
}

}  // namespace expar::serve
