#pragma once
// Generated tokens -> the text a client may see so far: whole UTF-8 characters only, cut at the first stop
// string (which is not returned), holding back a tail that could still become a stop string.
#include <cstdint>
#include <string>
#include <vector>

#include "expar/infer/text_codec.hpp"

namespace expar::serve {

class TextStream {
 public:
  TextStream(const infer::TextCodec* codec, std::vector<std::string> stops);
  // Adds tokens; returns the text that became final.
  std::string push(const std::vector<int32_t>& tokens);
  // The generation ended: the rest of the text (nothing after a stop string).
  std::string flush();
  bool stopped() const { return stopped_; }  // a stop string was found: end the request
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  const infer::TextCodec* codec_;
  std::vector<std::string> stops_;
  size_t longest_stop_ = 0;
  std::vector<int32_t> tokens_;
  std::string text_;
  size_t emitted_ = 0;
  bool stopped_ = false;
};

}  // namespace expar::serve
