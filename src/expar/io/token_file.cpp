#include "expar/io/token_file.hpp"

#include <cstring>
#include <fstream>
#include <iterator>
#include <string_view>

#include "expar/core/error.hpp"
#include "expar/io/strict_json.hpp"
#include "expar/io/tokenizer.hpp"

namespace expar {

namespace fs = std::filesystem;

namespace {

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPAR_CHECK(in.good(), "cannot read '{}': check that it exists and is readable", path.string());
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPAR_CHECK(!in.bad(), "reading '{}' failed: check the file", path.string());
  return bytes;
}

// Little-endian unsigned/signed integers of `width` bytes from `data`, each checked to fit int32.
void decode(std::string_view data, int width, bool is_signed, const std::string& label,
            std::vector<int32_t>& out) {
  EXPAR_CHECK(
      data.size() % static_cast<size_t>(width) == 0,
      "'{}' holds {} bytes of token data, not a whole number of {}-byte tokens: the file is truncated or "
      "its dtype is wrong",
      label, data.size(), width);
  const size_t n = data.size() / static_cast<size_t>(width);
  out.resize(n);
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  for (size_t i = 0; i < n; ++i) {
    uint64_t v = 0;
    for (int b = width - 1; b >= 0; --b)
      v = (v << 8) | p[i * static_cast<size_t>(width) + static_cast<size_t>(b)];
    int64_t s = static_cast<int64_t>(v);
    if (is_signed && width < 8 && (v >> (8 * width - 1)) != 0)
      s = static_cast<int64_t>(v) - (int64_t{1} << (8 * width));
    EXPAR_CHECK(s >= 0 && s <= INT32_MAX, "'{}': token {} has value {}: token ids must lie in [0, 2^31)",
                label, i, s);
    out[i] = static_cast<int32_t>(s);
  }
}

TokenFile read_raw(const fs::path& path, const fs::path& sidecar) {
  const std::string label = sidecar.string();
  const nlohmann::json j = parse_strict_json(read_bytes(sidecar), label, 4);
  EXPAR_CHECK(j.is_object(),
              "'{}' must be a JSON object {{\"dtype\": \"uint16\"|\"uint32\", \"vocab_size\": V}}", label);
  for (const auto& [key, value] : j.items())
    EXPAR_CHECK(key == "dtype" || key == "vocab_size",
                "'{}': key '{}' is not known: the sidecar holds only dtype and vocab_size", label, key);
  EXPAR_CHECK(j.contains("dtype") && j.at("dtype").is_string() &&
                  (j.at("dtype") == "uint16" || j.at("dtype") == "uint32"),
              "'{}': dtype {} must be \"uint16\" or \"uint32\" (little-endian tokens)", label,
              j.contains("dtype") ? j.at("dtype").dump() : "(absent)");
  EXPAR_CHECK(j.contains("vocab_size") && j.at("vocab_size").is_number_integer() &&
                  j.at("vocab_size").get<int64_t>() > 0 &&
                  j.at("vocab_size").get<int64_t>() <= (int64_t{1} << 31),
              "'{}': vocab_size {} must be a positive integer (at most 2^31)", label,
              j.contains("vocab_size") ? j.at("vocab_size").dump() : "(absent)");
  TokenFile f;
  f.kind = j.at("dtype").get<std::string>();
  f.vocab = j.at("vocab_size").get<int64_t>();
  decode(read_bytes(path), f.kind == "uint16" ? 2 : 4, false, path.string(), f.tokens);
  check_tokens_below(f.tokens, f.vocab,
                     path.string() + " (vocab_size " + std::to_string(f.vocab) + " from " +
                         sidecar.filename().string() + ")");
  return f;
}

// The value of `key` in a .npy header dict ("{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }").
std::string npy_field(const std::string& header, const std::string& key, const std::string& label) {
  const size_t k = header.find("'" + key + "'");
  EXPAR_CHECK(k != std::string::npos, "'{}': the .npy header has no '{}': is it a NumPy file?", label, key);
  size_t v = header.find(':', k);
  EXPAR_CHECK(v != std::string::npos, "'{}': the .npy header is malformed near '{}'", label, key);
  ++v;
  while (v < header.size() && header[v] == ' ') ++v;
  const char open = v < header.size() ? header[v] : '\0';
  const char close = open == '\'' ? '\'' : open == '(' ? ')' : ',';
  const size_t end = header.find(close, v + 1);
  EXPAR_CHECK(end != std::string::npos, "'{}': the .npy header is malformed near '{}'", label, key);
  return open == '\'' || open == '(' ? header.substr(v + 1, end - v - 1) : header.substr(v, end - v);
}

TokenFile read_npy(const fs::path& path) {
  const std::string label = path.string();
  const std::string bytes = read_bytes(path);
  EXPAR_CHECK(bytes.size() >= 10 && bytes.compare(0, 6, "\x93NUMPY") == 0,
              "'{}' does not start with the .npy magic: save it with numpy.save", label);
  const int major = static_cast<unsigned char>(bytes[6]);
  EXPAR_CHECK(major >= 1 && major <= 3, "'{}': .npy format version {} is not supported (1, 2 or 3)", label,
              major);
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t len_bytes = major == 1 ? 2 : 4, start = 8 + len_bytes;
  EXPAR_CHECK(bytes.size() >= start, "'{}' is truncated inside the .npy header", label);
  size_t header_len = 0;
  for (size_t b = 0; b < len_bytes; ++b) header_len |= static_cast<size_t>(u[8 + b]) << (8 * b);
  EXPAR_CHECK(bytes.size() >= start + header_len, "'{}' is truncated inside the .npy header", label);
  const std::string header = bytes.substr(start, header_len);
  const std::string descr = npy_field(header, "descr", label);
  EXPAR_CHECK(npy_field(header, "fortran_order", label) == "False",
              "'{}': the array is in Fortran order: save it in C order (numpy.ascontiguousarray)", label);
  struct Kind {
    const char* descr;
    int width;
    bool is_signed;
  };
  static const Kind kinds[] = {
      {"|u1", 1, false}, {"<u2", 2, false}, {"<u4", 4, false}, {"<i4", 4, true}, {"<i8", 8, true}};
  const Kind* kind = nullptr;
  for (const Kind& k : kinds)
    if (descr == k.descr) kind = &k;
  EXPAR_CHECK(
      kind != nullptr,
      "'{}': dtype '{}' is not a token dtype: use uint8, uint16, uint32, int32 or int64 (little-endian)",
      label, descr);
  // The element count from the shape, so that trailing bytes are caught.
  int64_t count = 1;
  const std::string shape = npy_field(header, "shape", label);
  size_t pos = 0;
  while (pos < shape.size()) {
    while (pos < shape.size() && (shape[pos] == ' ' || shape[pos] == ',')) ++pos;
    if (pos >= shape.size()) break;
    size_t used = 0;
    int64_t dim = 0;
    try {
      dim = std::stoll(shape.substr(pos), &used);
    } catch (const std::exception&) {
      fail("'{}': the .npy shape '({})' does not parse", label, shape);
    }
    EXPAR_CHECK(dim >= 0, "'{}': the .npy shape '({})' has a negative dimension", label, shape);
    count *= dim;
    pos += used;
  }
  const std::string_view data = std::string_view(bytes).substr(start + header_len);
  EXPAR_CHECK(data.size() == static_cast<size_t>(count) * static_cast<size_t>(kind->width),
              "'{}': the shape ({}) needs {} bytes of data but the file holds {}: the file is truncated or "
              "padded",
              label, shape, count * kind->width, data.size());
  TokenFile f;
  f.kind = std::string("npy ") + descr;
  decode(data, kind->width, kind->is_signed, label, f.tokens);
  return f;
}

}  // namespace

void check_tokens_below(const std::vector<int32_t>& tokens, int64_t vocab, const std::string& label,
                        size_t first_index) {
  for (size_t i = 0; i < tokens.size(); ++i)
    EXPAR_CHECK(
        tokens[i] >= 0 && tokens[i] < vocab,
        "{}: token {} has value {}, not below the vocabulary size {}: the tokens were made for another "
        "vocabulary",
        label, first_index + i, tokens[i], vocab);
}

TokenFile read_token_file(const fs::path& path, const Tokenizer* tokenizer) {
  EXPAR_CHECK(fs::exists(path),
              "--data '{}' does not exist: pass a text file, a token file with a FILE.json "
              "sidecar, or a .npy",
              path.string());
  EXPAR_CHECK(!fs::is_directory(path),
              "--data '{}' is a directory: pass one file (text bytes, little-endian tokens with a FILE.json "
              "sidecar naming dtype and vocab_size, or a .npy)",
              path.string());
  if (path.extension() == ".npy") return read_npy(path);
  const fs::path sidecar = fs::path(path.string() + ".json");
  if (fs::exists(sidecar)) return read_raw(path, sidecar);
  TokenFile f;
  const std::string bytes = read_bytes(path);
  if (tokenizer) {
    f.kind = "text (tokenizer.json)";
    f.vocab = tokenizer->vocab_size();
    try {
      f.tokens = tokenizer->encode(bytes, /*add_special_tokens=*/true);
    } catch (const Error& e) {
      fail("--data '{}': {}", path.string(), e.what());
    }
    return f;
  }
  f.kind = "text";
  f.vocab = 256;
  f.tokens.assign(reinterpret_cast<const unsigned char*>(bytes.data()),
                  reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size());
  return f;
}

}  // namespace expar
