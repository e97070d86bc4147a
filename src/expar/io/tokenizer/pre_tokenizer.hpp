#pragma once
// tokenizer.json's "pre_tokenizer": splits normalized text into words for the model. Supported: Sequence,
// Split (String or Regex pattern; Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous;
// invert), ByteLevel, Metaspace, Digits. ByteLevel's byte spelling is not materialized: a byte-level model
// takes words as raw bytes (see bpe.hpp), so the pre-tokenizer only says that it is byte-level.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace expar::tok {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `words` by their splits. `section`: the index of the text between added tokens that these words
  // came from (Metaspace's prepend_scheme "first" adds its prefix to section 0 only).
  virtual void split(std::vector<std::string>& words, size_t section) const = 0;
  // Whether a ByteLevel step is part of it (the model then reads words as bytes).
  virtual bool byte_level() const { return false; }
};

// nullptr for a JSON null; throws expar::Error naming an unsupported or malformed component.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config);

}  // namespace expar::tok
