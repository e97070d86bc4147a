#pragma once
// tokenizer.json's "decoder": turns a list of token strings back into text. Supported: Sequence,
// ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip. Steps map a list of strings to a list of strings
// (as in both reference implementations); the result is their concatenation.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <vector>

namespace expar::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode(std::vector<std::string>& tokens) const = 0;
};

// `added_tokens`: contents a ByteLevel step passes through unchanged (added tokens are not in byte
// spelling). nullptr for a JSON null; throws expar::Error naming an unsupported or malformed component.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& config,
                                      std::shared_ptr<const std::unordered_set<std::string>> added_tokens);

}  // namespace expar::tok
