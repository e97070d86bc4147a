#include "expar/io/tokenizer.hpp"

#include <mutex>
#include <unordered_set>

#include "expar/core/error.hpp"
#include "expar/io/strict_json.hpp"
#include "expar/io/text_file.hpp"
#include "expar/io/tokenizer/added_tokens.hpp"
#include "expar/io/tokenizer/bpe.hpp"
#include "expar/io/tokenizer/decoder.hpp"
#include "expar/io/tokenizer/json_fields.hpp"
#include "expar/io/tokenizer/normalizer.hpp"
#include "expar/io/tokenizer/pre_tokenizer.hpp"
#include "expar/io/tokenizer/utf8.hpp"

namespace expar {

namespace {

using nlohmann::json;
using namespace tok;

// tokenizer.json nests arrays in objects in arrays (Sequence of Split of pattern) a handful of levels deep.
constexpr int kMaxJsonDepth = 32;

// bos_token / eos_token / additional_special_tokens entries: a string, or an AddedToken object with
// "content".
std::optional<std::string> token_text(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string())
    return value["content"].get<std::string>();
  return std::nullopt;
}

// The post-processor, reduced to what a single text needs: the ids before and after the sequence.
struct PostProcessor {
  std::vector<int32_t> before, after;
};

void read_post_processor(const json& config, PostProcessor& out) {
  if (config.is_null()) return;
  const std::string type = component_type(config, "post_processor");
  if (type == "ByteLevel") return;  // only trims offsets, which expar does not report
  if (type == "Sequence") {
    for (const auto& step : config.value("processors", json::array())) read_post_processor(step, out);
    return;
  }
  if (type != "TemplateProcessing")
    unsupported("post_processor", type, "TemplateProcessing, ByteLevel, Sequence");
  const json& single = config.value("single", json::array());
  const json& specials = config.value("special_tokens", json::object());
  bool seen_sequence = false;
  for (const auto& item : single) {
    if (item.contains("Sequence")) {
      EXPAR_CHECK(!seen_sequence,
                  "tokenizer.json: post_processor TemplateProcessing single {} names the sequence twice",
                  json_excerpt(single));
      seen_sequence = true;
      continue;
    }
    EXPAR_CHECK(
        item.contains("SpecialToken") && item["SpecialToken"].contains("id"),
        "tokenizer.json: post_processor TemplateProcessing item {} is neither SpecialToken nor Sequence",
        json_excerpt(item));
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    EXPAR_CHECK(
        specials.contains(name) && specials[name].contains("ids") && specials[name]["ids"].is_array(),
        "tokenizer.json: post_processor TemplateProcessing uses {:?}, which its special_tokens do not define",
        name);
    for (const auto& id : specials[name]["ids"])
      (seen_sequence ? out.after : out.before).push_back(id.get<int32_t>());
  }
}

std::string clean_up_tokenization(std::string text) {
  // transformers' clean_up_tokenization (and the JavaScript reference's): spaces before punctuation and
  // English contractions, replaced in this order.
  static const std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    std::string out;
    size_t last = 0;
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, last)) {
      out.append(text, last, at - last);
      out.append(to);
      last = at + from.size();
    }
    out.append(text, last);
    text = std::move(out);
  }
  return text;
}

}  // namespace

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Bpe> model;
  std::unique_ptr<Decoder> decoder;
  PostProcessor post;
  AddedTokenMatcher raw_added, normalized_added;
  std::vector<std::string> id_to_token;
  std::vector<bool> has_id;
  std::unordered_set<std::string> special_texts;  // skipped by decode(skip_special_tokens)
  TokenIdMap added_ids;
  std::string chat_template;
  std::optional<std::string> bos, eos;
  bool clean_up_spaces = true;
  std::string label;

  void add_id(int32_t id, const std::string& token) {
    if (static_cast<size_t>(id) >= id_to_token.size()) {
      id_to_token.resize(static_cast<size_t>(id) + 1);
      has_id.resize(static_cast<size_t>(id) + 1, false);
    }
    id_to_token[static_cast<size_t>(id)] = token;
    has_id[static_cast<size_t>(id)] = true;
  }

  void encode_text(std::string_view text, size_t section, std::vector<int32_t>& ids, bool use_cache) const {
    thread_local std::vector<std::string> words;
    for (const Section& sub : normalized_added.split(text)) {
      if (sub.token >= 0) {
        ids.push_back(normalized_added.token(sub.token).id);
        continue;
      }
      words.assign(1, std::string(sub.text));
      if (pre_tokenizer) pre_tokenizer->split(words, section);
      for (const std::string& w : words) model->encode_word(w, ids, use_cache);
    }
  }
};

Tokenizer::Tokenizer(std::string_view tokenizer_json, std::string_view config_json, std::string_view label)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.label = std::string(label);
  const json doc = parse_strict_json(tokenizer_json, label, kMaxJsonDepth);
  EXPAR_CHECK(doc.is_object() && doc.contains("model"), "{}: not a tokenizer.json (it has no \"model\")",
              label);
  const std::string model_type = component_type(doc["model"], "model");
  if (model_type != "BPE") unsupported("model", model_type, "BPE");

  m.normalizer = make_normalizer(doc.value("normalizer", json()));
  m.pre_tokenizer = make_pre_tokenizer(doc.value("pre_tokenizer", json()));
  m.model = std::make_unique<Bpe>(doc["model"], m.pre_tokenizer && m.pre_tokenizer->byte_level());
  read_post_processor(doc.value("post_processor", json()), m.post);
  for (const auto& [token, id] : m.model->vocab()) m.add_id(id, token);

  std::vector<AddedToken> raw, normalized;
  std::vector<std::string> raw_patterns, normalized_patterns;
  auto added_contents = std::make_shared<std::unordered_set<std::string>>();
  for (const auto& entry : doc.value("added_tokens", json::array())) {
    AddedToken t;
    EXPAR_CHECK(entry.is_object() && entry.contains("id") && entry.contains("content") &&
                    entry["content"].is_string(),
                "{}: added token {} lacks \"id\" or \"content\"", label, json_excerpt(entry));
    t.id = entry["id"].get<int32_t>();
    t.content = entry["content"].get<std::string>();
    EXPAR_CHECK(t.id >= 0 && !t.content.empty(), "{}: added token {} needs an id >= 0 and non-empty content",
                label, json_excerpt(entry));
    const char* what = "added token";
    t.special = field_or(entry, "special", false, what);
    t.lstrip = field_or(entry, "lstrip", false, what);
    t.rstrip = field_or(entry, "rstrip", false, what);
    t.single_word = field_or(entry, "single_word", false, what);
    t.normalized = field_or(entry, "normalized", !t.special, what);
    m.add_id(t.id, t.content);
    m.added_ids[t.content] = t.id;
    added_contents->insert(t.content);
    if (t.special) m.special_texts.insert(t.content);
    if (t.normalized && m.normalizer) {
      std::string pattern = t.content;
      m.normalizer->normalize(pattern);
      normalized_patterns.push_back(pattern);
      normalized.push_back(std::move(t));
    } else {
      raw_patterns.push_back(t.content);
      raw.push_back(std::move(t));
    }
  }
  m.raw_added = AddedTokenMatcher(std::move(raw), std::move(raw_patterns));
  m.normalized_added = AddedTokenMatcher(std::move(normalized), std::move(normalized_patterns));
  m.decoder = make_decoder(doc.value("decoder", json()), added_contents);
  for (const auto* ids : {&m.post.before, &m.post.after})
    for (int32_t id : *ids)
      EXPAR_CHECK(id >= 0 && static_cast<size_t>(id) < m.has_id.size() && m.has_id[static_cast<size_t>(id)],
                  "{}: post_processor adds id {}, which is not in the vocabulary", label, id);

  if (config_json.empty()) return;
  const json config =
      parse_strict_json(config_json, std::string(label) + " (tokenizer_config.json)", kMaxJsonDepth);
  EXPAR_CHECK(config.is_object(), "{}: tokenizer_config.json is not a JSON object", label);
  if (config.contains("chat_template")) {
    const json& t = config["chat_template"];
    if (t.is_string()) {
      m.chat_template = t.get<std::string>();
    } else if (t.is_array()) {  // named templates: the one called "default" is the chat template
      for (const auto& named : t)
        if (named.value("name", "") == "default") m.chat_template = named.value("template", "");
    }
  }
  if (config.contains("bos_token")) m.bos = token_text(config["bos_token"]);
  if (config.contains("eos_token")) m.eos = token_text(config["eos_token"]);
  if (config.contains("clean_up_tokenization_spaces") && config["clean_up_tokenization_spaces"].is_boolean())
    m.clean_up_spaces = config["clean_up_tokenization_spaces"].get<bool>();
  for (const auto& extra : config.value("additional_special_tokens", json::array()))
    if (auto text = token_text(extra)) m.special_texts.insert(*text);
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

namespace {

std::filesystem::path tokenizer_file(const std::filesystem::path& file_or_dir) {
  namespace fs = std::filesystem;
  if (fs::is_directory(file_or_dir)) return file_or_dir / "tokenizer.json";
  if (file_or_dir.filename() == "tokenizer.json") return file_or_dir;
  return file_or_dir.parent_path() / "tokenizer.json";
}

}  // namespace

bool Tokenizer::present_in(const std::filesystem::path& file_or_dir) {
  return std::filesystem::is_regular_file(tokenizer_file(file_or_dir));
}

Tokenizer Tokenizer::from_path(const std::filesystem::path& file_or_dir) {
  namespace fs = std::filesystem;
  const fs::path file = fs::is_directory(file_or_dir) ? file_or_dir / "tokenizer.json" : file_or_dir;
  EXPAR_CHECK(fs::is_regular_file(file), "{} is not a tokenizer.json file or a directory holding one",
              file_or_dir.string());
  const fs::path config = file.parent_path() / "tokenizer_config.json";
  Tokenizer t(read_text_file(file, "tokenizer"),
              fs::is_regular_file(config) ? read_text_file(config, "tokenizer config") : std::string(),
              file.string());
  const fs::path jinja = file.parent_path() / "chat_template.jinja";
  if (t.impl_->chat_template.empty() && fs::is_regular_file(jinja))
    t.impl_->chat_template = read_text_file(jinja, "chat template");
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  const size_t bad = first_invalid_utf8(text);
  EXPAR_CHECK(
      bad == std::string_view::npos,
      "text to encode is not valid UTF-8: byte {} (0x{:02X}) starts an invalid sequence; tokenizers read "
      "UTF-8 text",
      bad, bad == std::string_view::npos ? 0 : static_cast<unsigned char>(text[bad]));
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = m.post.before;
  // One encoder at a time fills the word cache; a concurrent one works without it rather than wait.
  std::unique_lock cache_lock(m.model->cache_mutex(), std::try_to_lock);
  const bool use_cache = cache_lock.owns_lock();
  std::string normalized;
  const std::vector<Section> sections = m.raw_added.split(text);
  for (size_t i = 0; i < sections.size(); ++i) {
    const Section& s = sections[i];
    if (s.token >= 0) {
      ids.push_back(m.raw_added.token(s.token).id);
      continue;
    }
    if (!m.normalizer) {
      m.encode_text(s.text, i, ids, use_cache);
      continue;
    }
    normalized.assign(s.text);
    m.normalizer->normalize(normalized);
    if (!normalized.empty()) m.encode_text(normalized, i, ids, use_cache);
  }
  if (add_special_tokens) ids.insert(ids.end(), m.post.after.begin(), m.post.after.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string& token = id_to_token(id);
    if (skip_special_tokens && m.special_texts.count(token)) continue;
    tokens.push_back(token);
  }
  std::string text;
  if (m.decoder) {
    m.decoder->decode(tokens);
    for (const std::string& t : tokens) text += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
  }
  return m.clean_up_spaces ? clean_up_tokenization(std::move(text)) : text;
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  const Impl& m = *impl_;
  EXPAR_CHECK(id >= 0 && static_cast<size_t>(id) < m.has_id.size() && m.has_id[static_cast<size_t>(id)],
              "token id {} is not in the vocabulary of {} (ids 0..{} with gaps possible)", id, m.label,
              m.has_id.size() - 1);
  return m.id_to_token[static_cast<size_t>(id)];
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (const int32_t id = find_id(impl_->added_ids, token); id >= 0) return id;
  if (const int32_t id = impl_->model->token_to_id(token); id >= 0) return id;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  return impl_->special_texts.count(id_to_token(id)) > 0;
}
int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->has_id.size());
}
const std::string& Tokenizer::chat_template() const {
  return impl_->chat_template;
}
const std::optional<std::string>& Tokenizer::bos_token() const {
  return impl_->bos;
}
const std::optional<std::string>& Tokenizer::eos_token() const {
  return impl_->eos;
}

}  // namespace expar
