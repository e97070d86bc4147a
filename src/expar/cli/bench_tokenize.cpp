// `expar bench tokenize`: encode throughput (MB/s of UTF-8 text) of expar::Tokenizer beside
// @huggingface/tokenizers (node, tests/io/reference) on the same text, same machine, same run; each the
// median of --repeats encodes of the whole text, after one warm-up. Prints both and their ratio.
// The text is --text-file, or --mb MB of generated text: words drawn with a Zipf-like law from 60,000
// made-up words (Latin, Cyrillic and CJK syllables), with digits, punctuation, code-like lines and
// newlines, so that most words repeat (as in real text) while the word cache still sees many distinct ones.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "expar/bench/measure.hpp"
#include "expar/cli/commands.hpp"
#include "expar/core/error.hpp"
#include "expar/core/rng.hpp"
#include "expar/core/timer.hpp"
#include "expar/io/text_file.hpp"
#include "expar/io/tokenizer.hpp"

namespace expar::cli {

namespace {

struct BenchTokenizeArgs {
  std::string tokenizer;
  std::string text_file;
  std::string reference = "tests/io/reference";
  double mb = 4;
  int repeats = 5;
};

std::string generated_text(size_t bytes) {
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

int run_bench_tokenize(const BenchTokenizeArgs& a) {
  namespace fs = std::filesystem;
  EXPAR_CHECK(a.repeats >= 1, "--repeats {}: use at least 1", a.repeats);
  EXPAR_CHECK(a.mb > 0 && a.mb <= 1024, "--mb {}: use a size in (0, 1024]", a.mb);
  const fs::path script = fs::path(a.reference) / "reference.mjs";
  EXPAR_CHECK(
      fs::exists(script) &&
          fs::exists(fs::path(a.reference) / "node_modules" / "@huggingface" / "tokenizers"),
      "--reference {}: no reference.mjs with node_modules/@huggingface/tokenizers there: run scripts/setup "
      "and run from the repository root, or pass --reference tests/io/reference",
      a.reference);
  const Tokenizer tokenizer = Tokenizer::from_path(a.tokenizer);
  std::string text;
  fs::path text_path = a.text_file;
  if (a.text_file.empty()) {
    text = generated_text(static_cast<size_t>(a.mb * 1e6));
    text_path = fs::temp_directory_path() / fmt::format("expar_bench_tokenize_{}.txt", getpid());
    std::ofstream(text_path, std::ios::binary) << text;
  } else {
    text = read_text_file(a.text_file, "--text-file");
  }
  const fs::path dir =
      fs::is_directory(a.tokenizer) ? fs::path(a.tokenizer) : fs::path(a.tokenizer).parent_path();
  const std::string command =
      fmt::format("node '{}' bench '{}' '{}' {}", fs::absolute(script).string(), fs::absolute(dir).string(),
                  fs::absolute(text_path).string(), a.repeats);
  fmt::print("expar bench tokenize: {} ({:.2f} MB of {} text), median of {} encodes each\n", a.tokenizer,
             static_cast<double>(text.size()) / 1e6, a.text_file.empty() ? "generated" : "file", a.repeats);
  std::fflush(stdout);

  size_t warm = std::min<size_t>(text.size(), 100000);  // warm-up on a prefix, as node's; cut at a code point
  while (warm < text.size() && (static_cast<unsigned char>(text[warm]) & 0xC0) == 0x80) ++warm;
  tokenizer.encode(std::string_view(text).substr(0, warm), false);
  std::vector<double> seconds;
  size_t tokens = 0;
  for (int r = 0; r < a.repeats; ++r) {
    Timer t;
    tokens = tokenizer.encode(text, false).size();
    seconds.push_back(t.seconds());
  }
  FILE* pipe = popen(command.c_str(), "r");
  EXPAR_CHECK(pipe != nullptr, "cannot run `{}`", command);
  std::string out;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
  const int status = pclose(pipe);
  if (a.text_file.empty()) fs::remove(text_path);
  EXPAR_CHECK(status == 0, "`{}` failed (status {})", command, status);
  const auto reference = nlohmann::json::parse(out);
  const auto ref_tokens = reference["tokens"].get<size_t>();
  EXPAR_CHECK(
      ref_tokens == tokens,
      "expar made {} tokens and @huggingface/tokenizers {} of the same text: the outputs differ, so the "
      "speeds are not comparable",
      tokens, ref_tokens);
  const double mb = static_cast<double>(text.size()) / 1e6;
  const double ours = mb / bench::median(seconds),
               theirs = mb / bench::median(reference["seconds"].get<std::vector<double>>());
  fmt::print("{:<28} {:>10} {:>12}\n", "", "MB/s", "tokens");
  fmt::print("{:<28} {:>10.2f} {:>12}\n", "expar (1 thread)", ours, tokens);
  fmt::print("{:<28} {:>10.2f} {:>12}\n", "@huggingface/tokenizers", theirs, ref_tokens);
  fmt::print("ratio expar / @huggingface/tokenizers: {:.2f}x\n", ours / theirs);
  return 0;
}

}  // namespace

void add_bench_tokenize(CLI::App* bench, CommandTable& table) {
  auto* cmd =
      bench->add_subcommand("tokenize", "Encode MB/s of expar's tokenizer vs @huggingface/tokenizers");
  auto a = std::make_shared<BenchTokenizeArgs>();
  cmd->add_option("--tokenizer", a->tokenizer, "tokenizer.json or a directory holding it")->required();
  cmd->add_option("--mb", a->mb, "MB of generated text (when no --text-file)")->capture_default_str();
  cmd->add_option("--text-file", a->text_file, "Encode this file instead of generated text");
  cmd->add_option("--repeats", a->repeats, "Encodes per side (the median is printed)")->capture_default_str();
  cmd->add_option("--reference", a->reference, "Folder of reference.mjs and its node_modules")
      ->capture_default_str();
  table[cmd] = [a] { return run_bench_tokenize(*a); };
}

}  // namespace expar::cli
