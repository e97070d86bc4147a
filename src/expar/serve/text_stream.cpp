#include "expar/serve/text_stream.hpp"

#include <algorithm>

namespace expar::serve {
namespace {
constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD: a tokenizer's stand-in for an unfinished byte run
}

TextStream::TextStream(const infer::TextCodec* codec, std::vector<std::string> stops)
    : codec_(codec), stops_(std::move(stops)) {
  for (const std::string& s : stops_) longest_stop_ = std::max(longest_stop_, s.size());
}

std::string TextStream::push(const std::vector<int32_t>& tokens) {
  if (stopped_ || !codec_) {
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    return {};
  }
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  text_ = codec_->decode(tokens_);
  // A stop string may start inside text already emitted only if it began in the held-back tail.
  const size_t from = emitted_;
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = text_.find(s, from);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut != std::string::npos) {
    text_.resize(cut);
    stopped_ = true;
    return flush();
  }
  size_t safe = text_.size();
  if (longest_stop_ > 1) safe -= std::min(safe, longest_stop_ - 1);
  safe = infer::complete_utf8_prefix(text_.substr(0, safe));
  if (safe >= 3 && text_.compare(safe - 3, 3, kReplacement) == 0) safe -= 3;
  if (safe <= emitted_) return {};
  std::string out = text_.substr(emitted_, safe - emitted_);
  emitted_ = safe;
  return out;
}

std::string TextStream::flush() {
  if (!codec_ || emitted_ >= text_.size()) return {};
  std::string out = text_.substr(emitted_);
  emitted_ = text_.size();
  return out;
}

}  // namespace expar::serve
