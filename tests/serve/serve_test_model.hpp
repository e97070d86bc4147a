#pragma once
// A small random MoE checkpoint (our format) shared by the serve tests, written once per test binary.
#include <fstream>
#include <map>
#include <mutex>

#include "common/temp_dir.hpp"
#include "infer/hf_test_models.hpp"
#include "infer/infer_test_util.hpp"

namespace expar::serve::testing {

// max_seq: the context (a long one lets a test keep a stream running for a while).
inline std::filesystem::path serve_test_model(int64_t max_seq = 64) {
  static std::map<int64_t, std::filesystem::path> dirs;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  auto it = dirs.find(max_seq);
  if (it != dirs.end()) return it->second;
  const std::filesystem::path dir = [max_seq] {
    std::filesystem::path d = test::run_temp_dir("serve_" + std::to_string(max_seq));
    ModelConfig c = infer::testing::test_config();
    c.max_seq = max_seq;
    run_ranks(1, [&](Comm& world) {
      auto group = world.split(0, 0, "ep");
      MoeTransformer model(c, {}, *group);
      model.init(5);
      infer::testing::write_expar_checkpoint(d, model, 4);
    });
    return d;
  }();
  dirs[max_seq] = dir;
  return dir;
}

// A random Mixtral-format checkpoint stored in BF16 (the serve tests' vocabulary of 256 and context of 64),
// which the engine holds and multiplies as stored: written once per test binary.
inline std::filesystem::path serve_bf16_test_model() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d = test::run_temp_dir("serve_bf16");
    infer::testing::HfTestModel m;
    m.format = ModelFormat::Mixtral;
    m.shared = 0;
    m.eps = 1e-5f;
    m.vocab = 256;
    m.max_seq = 64;
    m.randomize(71);
    write_sharded_checkpoint(d, infer::testing::bf16_rounded(m.tensors, true), 64 * 1024);
    std::ofstream(d / "config.json") << m.config().dump(2);
    return d;
  }();
  return dir;
}

// The same Mixtral architecture 128 wide with its products' weights in block-scaled FP8 (E4M3 codes and a
// multiplier per 128 × 128 block, as DeepSeek-V3 ships), held and multiplied as stored.
inline std::filesystem::path serve_fp8_test_model() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d = test::run_temp_dir("serve_fp8");
    infer::testing::HfTestModel m = infer::testing::mixtral_fp8_test_model(128);
    m.vocab = 256;
    m.max_seq = 64;
    m.tensors.clear();
    m.randomize(73);
    write_sharded_checkpoint(d, infer::testing::fp8_quantised(m.tensors).stored, 256 * 1024);
    std::ofstream(d / "config.json") << infer::testing::fp8_config(m.config()).dump(2);
    return d;
  }();
  return dir;
}

// A gpt-oss checkpoint with MXFP4 experts (hidden 64, intermediate 32: whole 32-value blocks).
inline std::filesystem::path serve_mxfp4_test_model() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d = test::run_temp_dir("serve_mxfp4");
    infer::testing::HfTestModel m = infer::testing::gpt_oss_test_model(64, 32);
    m.vocab = 256;
    m.max_seq = 64;
    m.tensors.clear();
    m.randomize(79);
    write_sharded_checkpoint(d, infer::testing::quantise_gpt_oss_experts(m), 256 * 1024);
    std::ofstream(d / "config.json") << infer::testing::mxfp4_config(m).dump(2);
    return d;
  }();
  return dir;
}

}  // namespace expar::serve::testing

namespace expar::serve::testing {

// GPT-2's byte-to-character map (every byte spelled as one printable character), as byte-level BPE
// vocabularies write their tokens.
inline std::string byte_level_char(int b) {
  int cp = b;
  const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  if (!printable) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// The serve test model with a tokenizer beside it: a byte-level BPE tokenizer.json over the model's 256
// ids (no merges), its eos token the byte '\n', and a chat template in tokenizer_config.json.
inline std::filesystem::path serve_test_model_with_tokenizer() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path src = serve_test_model(64);
    std::filesystem::path d = test::run_temp_dir("serve_tokenizer");
    std::filesystem::create_directories(d);
    for (const auto& f : std::filesystem::directory_iterator(src))
      std::filesystem::copy(f.path(), d / f.path().filename(), std::filesystem::copy_options::recursive);
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[byte_level_char(b)] = b;
    const nlohmann::json tokenizer = {
        {"version", "1.0"},
        {"added_tokens", nlohmann::json::array()},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
        {"post_processor", nullptr},
        {"decoder",
         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
        {"model",
         {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"vocab", vocab},
          {"merges", nlohmann::json::array()}}}};
    std::ofstream(d / "tokenizer.json") << tokenizer.dump();
    const nlohmann::json config = {{"eos_token", byte_level_char('\n')},
                                   {"chat_template",
                                    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}|{% endfor %}"
                                    "{% if add_generation_prompt %}<assistant>{% endif %}"}};
    std::ofstream(d / "tokenizer_config.json") << config.dump();
    return d;
  }();
  return dir;
}

}  // namespace expar::serve::testing
