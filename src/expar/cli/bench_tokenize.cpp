// `expar bench tokenize` (bench/tokenize.hpp measures; this file prints): encode MB/s of expar::Tokenizer
// beside @huggingface/tokenizers on --text-file, or on --mb MB of generated text (bench::zipf_text).
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "expar/bench/tokenize.hpp"
#include "expar/cli/commands.hpp"
#include "expar/core/error.hpp"
#include "expar/io/text_file.hpp"

namespace expar::cli {

namespace {

struct BenchTokenizeArgs {
  std::string tokenizer;
  std::string text_file;
  std::string reference = "tests/io/reference";
  double mb = 4;
  int repeats = 5;
};

int run_bench_tokenize(const BenchTokenizeArgs& a) {
  namespace fs = std::filesystem;
  EXPAR_CHECK(a.mb > 0 && a.mb <= 1024, "--mb {}: use a size in (0, 1024]", a.mb);
  std::string text;
  fs::path text_path = a.text_file;
  if (a.text_file.empty()) {
    text = bench::zipf_text(static_cast<size_t>(a.mb * 1e6));
    text_path = fs::temp_directory_path() / fmt::format("expar_bench_tokenize_{}.txt", getpid());
    std::ofstream(text_path, std::ios::binary) << text;
  } else {
    text = read_text_file(a.text_file, "--text-file");
  }
  fmt::print("expar bench tokenize: {} ({:.2f} MB of {} text), median of {} encodes each\n", a.tokenizer,
             static_cast<double>(text.size()) / 1e6, a.text_file.empty() ? "generated" : "file", a.repeats);
  std::fflush(stdout);
  bench::TokenizeSpeed r;
  try {
    r = bench::measure_tokenize(a.tokenizer, text, text_path, a.reference, a.repeats);
  } catch (...) {
    if (a.text_file.empty()) fs::remove(text_path);
    throw;
  }
  if (a.text_file.empty()) fs::remove(text_path);
  fmt::print("{:<28} {:>10} {:>12}\n", "", "MB/s", "tokens");
  fmt::print("{:<28} {:>10.2f} {:>12}\n", "expar (1 thread)", r.mb_per_s, r.tokens);
  fmt::print("{:<28} {:>10.2f} {:>12}\n", "@huggingface/tokenizers", r.reference_mb_per_s,
             r.reference_tokens);
  fmt::print("ratio expar / @huggingface/tokenizers: {:.2f}x\n", r.mb_per_s / r.reference_mb_per_s);
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
