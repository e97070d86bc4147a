// `expar tokenize`: a model's tokenizer on the command line, for debugging prompts and vocabularies.
//   expar tokenize --tokenizer DIR_OR_FILE --text "Hello world"     ids and pieces, one token a line
//   expar tokenize --tokenizer ... --text-file notes.txt --json -     {"ids": [...], "tokens": [...]}
//   expar tokenize --tokenizer ... --decode 9906,4435                 the text of those ids
// --no-special: encode without the post-processor's tokens (e.g. Llama-2's <s>); decode without special
// tokens.
#include "expar/cli/tokenize.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "expar/cli/commands.hpp"
#include "expar/cli/json_output.hpp"
#include "expar/core/error.hpp"
#include "expar/io/text_file.hpp"
#include "expar/io/tokenizer.hpp"

namespace expar::cli {

namespace {

struct TokenizeArgs {
  std::string tokenizer;
  std::optional<std::string> text;
  std::string text_file;
  std::vector<int32_t> decode;
  JsonOutput json;
  bool no_special = false;
};

// One line; bytes that are not UTF-8 (a lone byte-level piece) become U+FFFD instead of throwing.
std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string quoted(const std::string& s) {
  return dump_json(nlohmann::json(s));
}

int run_tokenize(const TokenizeArgs& a) {
  const int inputs = (a.text ? 1 : 0) + (a.text_file.empty() ? 0 : 1) + (a.decode.empty() ? 0 : 1);
  EXPAR_CHECK(inputs == 1, "expar tokenize takes exactly one of --text, --text-file and --decode ({} given)",
              inputs);
  const Tokenizer tokenizer = Tokenizer::from_path(a.tokenizer);
  if (!a.decode.empty()) {
    const std::string text = tokenizer.decode(a.decode, a.no_special);
    if (a.json.table_wanted()) fmt::print("{}\n", text);
    a.json.write(dump_json(nlohmann::json{{"text", text}}));
    return 0;
  }
  const std::string text = a.text ? *a.text : read_text_file(a.text_file, "--text-file");
  const std::vector<int32_t> ids = tokenizer.encode(text, !a.no_special);
  if (a.json.wanted()) {
    nlohmann::json out{{"ids", ids}, {"tokens", nlohmann::json::array()}};
    for (int32_t id : ids) out["tokens"].push_back(tokenizer.id_to_token(id));
    a.json.write(dump_json(out));
  }
  if (!a.json.table_wanted()) return 0;
  // One token a line: id, the vocabulary's spelling, and the text that id alone decodes to.
  for (int32_t id : ids) {
    const int32_t one[] = {id};
    fmt::print("{:8}  {:<24} {}\n", id, quoted(tokenizer.id_to_token(id)), quoted(tokenizer.decode(one)));
  }
  fmt::print(stderr, "[{} tokens, {} bytes]\n", ids.size(), text.size());
  return 0;
}

}  // namespace

std::optional<TextPrompt> encode_prompt(const infer::ModelSpec& spec, const std::string& prompt, bool chat) {
  std::unique_ptr<infer::TextCodec> codec = infer::text_codec_for(spec);
  if (!codec) {
    EXPAR_CHECK(
        !chat, "--chat needs the checkpoint's tokenizer.json and its chat template; {} has no tokenizer.json",
        spec.dir.string());
    return std::nullopt;
  }
  TextPrompt p{std::move(codec), {}, chat};
  if (!chat) {
    p.ids = p.codec->encode(prompt);
    return p;
  }
  const nlohmann::json messages = {{{"role", "user"}, {"content", prompt}}};
  const std::optional<std::string> rendered = p.codec->chat_prompt(messages);
  EXPAR_CHECK(rendered.has_value(),
              "--chat: {} has no chat template (chat_template in tokenizer_config.json, or "
              "chat_template.jinja, beside a tokenizer.json): drop --chat",
              spec.dir.string());
  p.ids = p.codec->encode_chat(*rendered);
  return p;
}

std::string decode_generated(const TextPrompt& prompt, const std::vector<int32_t>& generated) {
  if (prompt.chat) return prompt.codec->decode(generated);
  // The prompt and its continuation decoded together, so a piece that joins them reads as one word.
  std::vector<int32_t> all = prompt.ids;
  all.insert(all.end(), generated.begin(), generated.end());
  return prompt.codec->decode(all);
}

void add_tokenize(CLI::App& app, CommandTable& table) {
  auto* cmd =
      app.add_subcommand("tokenize", "Encode text to token ids (or decode ids) with a tokenizer.json");
  auto a = std::make_shared<TokenizeArgs>();
  cmd->add_option("--tokenizer", a->tokenizer, "tokenizer.json, or a directory holding it (a checkpoint)")
      ->required();
  cmd->add_option("--text", a->text, "Text to encode");
  cmd->add_option("--text-file", a->text_file, "File whose text to encode");
  cmd->add_option("--decode", a->decode, "Token ids to decode (comma separated)")->delimiter(',');
  add_json_option(cmd, a->json, "the result ({\"ids\": [...], \"tokens\": [...]} or {\"text\": ...})");
  cmd->add_flag("--no-special", a->no_special,
                "Encode without the post-processor's special tokens; decode leaving special tokens out");
  table[cmd] = [a] { return run_tokenize(*a); };
}

}  // namespace expar::cli
