#include "expar/io/tokenizer/decoder.hpp"

#include "expar/core/error.hpp"
#include "expar/io/tokenizer/byte_level.hpp"
#include "expar/io/tokenizer/json_fields.hpp"
#include "expar/io/tokenizer/normalizer.hpp"
#include "expar/io/tokenizer/utf8.hpp"

namespace expar::tok {

namespace {

constexpr const char* kSupported = "Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip";

// Runs of byte-spelled tokens become one string of their bytes (lossy UTF-8); added tokens stay as they are.
class ByteLevel : public Decoder {
 public:
  explicit ByteLevel(std::shared_ptr<const std::unordered_set<std::string>> added)
      : added_(std::move(added)) {}
  void decode(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    bool pending = false;
    const auto flush = [&] {
      if (pending) out.push_back(utf8_lossy(bytes));
      bytes.clear();
      pending = false;
    };
    for (std::string& t : tokens) {
      if (added_->count(t)) {
        flush();
        out.push_back(std::move(t));
        continue;
      }
      // A token outside the byte spelling keeps its own UTF-8 bytes (Rust's ByteLevel decoder does so).
      auto raw = byte_level_to_bytes(t);
      bytes += raw ? *raw : t;
      pending = true;
    }
    flush();
    tokens.swap(out);
  }

 private:
  std::shared_ptr<const std::unordered_set<std::string>> added_;
};

class Metaspace : public Decoder {
 public:
  explicit Metaspace(const nlohmann::json& config)
      : replacement_(field_or<std::string>(config, "replacement", "\u2581", "decoder Metaspace")) {
    std::string scheme = field_or<std::string>(config, "prepend_scheme", "", "decoder Metaspace");
    if (scheme.empty())
      scheme = field_or(config, "add_prefix_space", true, "decoder Metaspace") ? "always" : "never";
    strip_first_ = scheme != "never";
  }
  void decode(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string s;
      const std::string& t = tokens[i];
      for (size_t at = 0; at < t.size();) {
        if (t.compare(at, replacement_.size(), replacement_) == 0) {
          s.push_back(' ');
          at += replacement_.size();
        } else {
          s.push_back(t[at++]);
        }
      }
      if (i == 0 && strip_first_ && !s.empty() && s[0] == ' ') s.erase(0, 1);
      tokens[i] = std::move(s);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_ = true;
};

class Replace : public Decoder {
 public:
  explicit Replace(const nlohmann::json& config)
      : replacer_(config.value("pattern", nlohmann::json::object()),
                  field_or<std::string>(config, "content", "", "decoder Replace"), "decoder Replace") {}
  void decode(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) t = replacer_.apply(t);
  }

 private:
  Replacer replacer_;
};

// Runs of <0xXX> tokens become the text of their bytes (lossy UTF-8, as JavaScript's TextDecoder decodes).
class ByteFallback : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    const auto flush = [&] {
      if (!bytes.empty()) out.push_back(utf8_lossy(bytes));
      bytes.clear();
    };
    for (std::string& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        const auto hex = [](char c) {
          return c >= '0' && c <= '9'   ? c - '0'
                 : c >= 'A' && c <= 'F' ? c - 'A' + 10
                 : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                        : -1;
        };
        const int hi = hex(t[3]), lo = hex(t[4]);
        if (hi >= 0 && lo >= 0) byte = hi * 16 + lo;
      }
      if (byte >= 0) {
        bytes.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
};

class Fuse : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing copies of the one-character `content` from each token.
class Strip : public Decoder {
 public:
  explicit Strip(const nlohmann::json& config)
      : content_(field_or<std::string>(config, "content", " ", "decoder Strip")),
        start_(field_or(config, "start", 0, "decoder Strip")),
        stop_(field_or(config, "stop", 0, "decoder Strip")) {
    size_t i = 0;
    if (!content_.empty()) next_code_point(content_, i);
    EXPAR_CHECK(!content_.empty() && i == content_.size(),
                "tokenizer.json: decoder Strip content {:?} is not one character", content_);
  }
  void decode(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      size_t begin = 0, end = t.size();
      for (int k = 0; k < start_ && t.compare(begin, content_.size(), content_) == 0; ++k)
        begin += content_.size();
      for (int k = 0; k < stop_ && end >= begin + content_.size() &&
                      t.compare(end - content_.size(), content_.size(), content_) == 0;
           ++k)
        end -= content_.size();
      t = t.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  int start_, stop_;
};

class Sequence : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decode(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& config,
                                      std::shared_ptr<const std::unordered_set<std::string>> added_tokens) {
  if (config.is_null()) return nullptr;
  const std::string type = component_type(config, "decoder");
  if (type == "Sequence")
    return std::make_unique<Sequence>(sequence_steps<Decoder>(
        config, "decoders", "decoder",
        [&added_tokens](const nlohmann::json& item) { return make_decoder(item, added_tokens); }));
  if (type == "ByteLevel") return std::make_unique<ByteLevel>(std::move(added_tokens));
  if (type == "Metaspace") return std::make_unique<Metaspace>(config);
  if (type == "Replace") return std::make_unique<Replace>(config);
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip") return std::make_unique<Strip>(config);
  unsupported("decoder", type, kSupported);
}

}  // namespace expar::tok
