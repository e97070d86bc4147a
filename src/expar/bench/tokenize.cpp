#include "expar/bench/tokenize.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "expar/bench/measure.hpp"
#include "expar/core/error.hpp"
#include "expar/core/rng.hpp"
#include "expar/core/timer.hpp"
#include "expar/io/tokenizer.hpp"

namespace expar::bench {

std::string zipf_text(size_t bytes) {
  static const char* latin[] = {"ka", "to", "ri", "en", "the", "an", "mo", "pre",
                                "st", "li", "qu", "er", "in",  "ex", "pa", "ro"};
  static const char* cyrillic[] = {"ка", "то", "ри", "ен", "мо", "при", "ст", "ли"};
  static const char* cjk[] = {"专", "家", "并", "行", "模", "型", "数", "据", "の", "に", "は", "テ"};
  const auto word = [&](uint32_t w) {
    std::string s;
    const uint32_t script = w % 10;  // 8 of 10 words Latin
    const int syllables = 1 + static_cast<int>(random_u32(11, w, 0) % 4);
    for (int k = 0; k < syllables; ++k) {
      const uint32_t r = random_u32(11, w, static_cast<uint64_t>(k) + 1);
      s += script < 8 ? latin[r % 16] : script == 8 ? cyrillic[r % 8] : cjk[r % 12];
    }
    if (script < 8 && w % 7 == 0) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    return s;
  };
  std::string text;
  text.reserve(bytes + 64);
  for (uint64_t i = 0; text.size() < bytes; ++i) {
    const uint32_t r = random_u32(13, 0, i);
    // Zipf-like: rank = 60000^u, so low ranks (common words) dominate.
    const double u = static_cast<double>(random_u32(13, 1, i)) / 4294967296.0;
    const auto rank = static_cast<uint32_t>(std::pow(60000.0, u));
    text += word(rank);
    switch (r % 23) {
      case 0:
        text += ", ";
        break;
      case 1:
        text += ". ";
        break;
      case 2:
        text += fmt::format(" {} ", r % 10000);
        break;
      case 3:
        text += "\n";
        break;
      case 4:
        text += "(x[i] += 2);\n    ";
        break;
      case 5:
        text += "! 😀 ";
        break;
      default:
        text += " ";
        break;
    }
  }
  return text;
}

TokenizeSpeed measure_tokenize(const std::filesystem::path& tokenizer_path, const std::string& text,
                               const std::filesystem::path& text_path, const std::filesystem::path& reference,
                               int repeats) {
  namespace fs = std::filesystem;
  EXPAR_CHECK(repeats >= 1, "--repeats {}: use at least 1", repeats);
  const fs::path script = reference / "reference.mjs";
  EXPAR_CHECK(
      fs::exists(script) && fs::exists(reference / "node_modules" / "@huggingface" / "tokenizers"),
      "--reference {}: no reference.mjs with node_modules/@huggingface/tokenizers there: run scripts/setup "
      "and run from the repository root, or pass --reference tests/io/reference",
      reference.string());
  const Tokenizer tokenizer = Tokenizer::from_path(tokenizer_path);
  const fs::path dir = fs::is_directory(tokenizer_path) ? tokenizer_path : tokenizer_path.parent_path();
  const std::string command =
      fmt::format("node '{}' bench '{}' '{}' {}", fs::absolute(script).string(), fs::absolute(dir).string(),
                  fs::absolute(text_path).string(), repeats);
  size_t warm = std::min<size_t>(text.size(), 100000);  // warm-up on a prefix, as node's; cut at a code point
  while (warm < text.size() && (static_cast<unsigned char>(text[warm]) & 0xC0) == 0x80) ++warm;
  tokenizer.encode(std::string_view(text).substr(0, warm), false);
  std::vector<double> seconds;
  TokenizeSpeed r;
  r.text_bytes = text.size();
  for (int i = 0; i < repeats; ++i) {
    Timer t;
    r.tokens = tokenizer.encode(text, false).size();
    seconds.push_back(t.seconds());
  }
  FILE* pipe = popen(command.c_str(), "r");
  EXPAR_CHECK(pipe != nullptr, "cannot run `{}`", command);
  std::string out;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
  const int status = pclose(pipe);
  EXPAR_CHECK(status == 0, "`{}` failed (status {})", command, status);
  const auto answer = nlohmann::json::parse(out);
  r.reference_tokens = answer["tokens"].get<size_t>();
  EXPAR_CHECK(
      r.reference_tokens == r.tokens,
      "expar made {} tokens and @huggingface/tokenizers {} of the same text: the outputs differ, so the "
      "speeds are not comparable",
      r.tokens, r.reference_tokens);
  const double mb = static_cast<double>(text.size()) / 1e6;
  r.mb_per_s = mb / median(seconds);
  r.reference_mb_per_s = mb / median(answer["seconds"].get<std::vector<double>>());
  return r;
}

}  // namespace expar::bench
