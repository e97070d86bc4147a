// Sharded checkpoints: writing shards plus a Hugging Face style index, lazy opening, lookups by name, and
// every inconsistency between index and shards.
#include "expar/io/sharded_checkpoint.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "common/temp_dir.hpp"
#include "expar/io/safetensors_writer.hpp"
#include "io/io_test_util.hpp"

namespace expar {
namespace {

using test::patterned;
using test::TempDir;
using test::tensor_bytes;
using ::testing::HasSubstr;

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no expar::Error thrown>";
}

std::map<std::string, Tensor> model_tensors() {
  return {
      {"embed", patterned({8, 4}, DType::F32, 1)},                    // 128 bytes
      {"layers.0.experts.w1", patterned({4, 4, 6}, DType::BF16, 2)},  // 192 bytes
      {"layers.0.experts.w2", patterned({4, 6, 4}, DType::BF16, 3)},  // 192 bytes
      {"layers.0.norm", patterned({4}, DType::F32, 4)},               // 16 bytes
      {"lm_head", patterned({4, 8}, DType::F32, 5)},                  // 128 bytes
  };
}

void write_text(const std::filesystem::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// A crash while an older set was being replaced leaves shards of two saves beside one index: the shard that
// belongs to another save is refused by name (each save's id is in the index and in every shard).
TEST(ShardedCheckpoint, AShardOfAnotherSaveIsRefused) {
  TempDir first("sharded_first"), second("sharded_second");
  write_sharded_checkpoint(first.path(), model_tensors(), 256);
  write_sharded_checkpoint(second.path(), model_tensors(), 256);
  std::filesystem::copy_file(first.path() / "model-00002-of-00004.safetensors",
                             second.path() / "model-00002-of-00004.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  const auto ckpt = ShardedCheckpoint::open(second.path() / "model.safetensors.index.json");
  EXPECT_NO_THROW(ckpt.view("embed"));
  EXPECT_THAT(error_of([&] { ckpt.view("layers.0.experts.w1"); }),
              HasSubstr("torn checkpoint: shard model-00002-of-00004.safetensors belongs to save"));
}

TEST(ShardedCheckpoint, WritesShardsAndReadsThemBackLazily) {
  TempDir dir("sharded");
  const auto tensors = model_tensors();
  const auto paths = write_sharded_checkpoint(dir.path(), tensors, 256, {{"format", "pt"}});
  // Name order, at most 256 bytes per shard: [embed], [w1], [w2, norm], [lm_head].
  ASSERT_EQ(paths.size(), 4u);
  EXPECT_EQ(paths[0].filename(), "model-00001-of-00004.safetensors");
  EXPECT_EQ(paths[3].filename(), "model-00004-of-00004.safetensors");

  const auto ckpt = ShardedCheckpoint::open(dir.path() / "model.safetensors.index.json");
  EXPECT_EQ(ckpt.shards_opened(), 0u);
  EXPECT_EQ(ckpt.metadata().at("total_size").get<uint64_t>(), 128u + 192 + 192 + 16 + 128);
  EXPECT_EQ(ckpt.shard_of("layers.0.norm"), "model-00003-of-00004.safetensors");
  EXPECT_EQ(ckpt.shard_of("layers.0.experts.w2"), "model-00003-of-00004.safetensors");
  EXPECT_EQ(ckpt.shard_names().size(), 4u);

  // Reading one expert slice opens only the shard that holds it.
  const Tensor rows = ckpt.read_rows("layers.0.experts.w1", 1, 3, MemCategory::ExpertWeights);
  EXPECT_EQ(ckpt.shards_opened(), 1u);
  const Tensor& w1 = tensors.at("layers.0.experts.w1");
  EXPECT_EQ(tensor_bytes(rows), tensor_bytes(w1.rows(1, 3)));
  EXPECT_EQ(tensor_bytes(ckpt.view_rows("layers.0.experts.w1", 3, 4)), tensor_bytes(w1.rows(3, 4)));

  EXPECT_EQ(ckpt.names().size(), tensors.size());
  for (const auto& [name, want] : tensors) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(ckpt.contains(name));
    EXPECT_EQ(ckpt.info(name).shape, want.shape());
    EXPECT_EQ(tensor_bytes(ckpt.view(name)), tensor_bytes(want));
    EXPECT_EQ(tensor_bytes(ckpt.read(name)), tensor_bytes(want));
    EXPECT_EQ(ckpt.file_of(name).metadata().at("format"), "pt");
  }
  EXPECT_EQ(ckpt.shards_opened(), 4u);
  EXPECT_NO_THROW(ckpt.validate());
  EXPECT_THAT(error_of([&] { ckpt.read("nope"); }),
              AllOf(HasSubstr("no tensor named \"nope\""), HasSubstr("5 tensors")));

  // The same checkpoint through open_directory, and a moved checkpoint keeps its views.
  auto again = ShardedCheckpoint::open_directory(dir.path());
  const Tensor view = again.view("lm_head");
  ShardedCheckpoint moved = std::move(again);
  EXPECT_EQ(tensor_bytes(view), tensor_bytes(tensors.at("lm_head")));
}

TEST(ShardedCheckpoint, ATensorLargerThanTheLimitGetsItsOwnShard) {
  TempDir dir("big");
  const auto paths = write_sharded_checkpoint(dir.path(), model_tensors(), 1);
  EXPECT_EQ(paths.size(), 5u);
  EXPECT_NO_THROW(ShardedCheckpoint::open_directory(dir.path()).validate());
  EXPECT_THAT(error_of([&] { write_sharded_checkpoint(dir.path(), model_tensors(), 0); }),
              HasSubstr("max_shard_bytes=0"));
}

TEST(ShardedCheckpoint, OpenDirectoryFallsBackToASingleFile) {
  TempDir dir("single");
  write_safetensors(dir.path() / "model.safetensors", model_tensors());
  const auto ckpt = ShardedCheckpoint::open_directory(dir.path());
  EXPECT_EQ(ckpt.names().size(), 5u);
  EXPECT_EQ(ckpt.shard_of("embed"), "model.safetensors");
  EXPECT_EQ(tensor_bytes(ckpt.read("embed")), tensor_bytes(model_tensors().at("embed")));
  EXPECT_NO_THROW(ckpt.validate());

  TempDir empty("empty");
  EXPECT_THAT(error_of([&] { ShardedCheckpoint::open_directory(empty.path()); }),
              AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("not a safetensors checkpoint")));
}

TEST(ShardedCheckpoint, RejectsMalformedIndexes) {
  TempDir dir("index");
  const auto index = dir.path() / "model.safetensors.index.json";
  const std::pair<std::string, std::vector<std::string>> cases[] = {
      {"[]", {"must be a JSON object"}},
      {"{", {"not valid JSON"}},
      {R"({"metadata":{}})", {"missing \"weight_map\""}},
      {R"({"weight_map":[]})", {"missing \"weight_map\""}},
      {R"({"metadata":3,"weight_map":{}})", {"\"metadata\" must be an object", "got 3"}},
      {R"({"weight_map":{"a":1}})", {"entry \"a\" must be a file name string", "got 1"}},
      {R"({"weight_map":{"a":"x.safetensors","a":"y.safetensors"}})", {"duplicate key \"a\""}},
      {R"({"weight_map":{"a":"/etc/passwd"}})", {"\"a\" to \"/etc/passwd\"", "relative paths without '..'"}},
      {R"({"weight_map":{"a":"../x.safetensors"}})", {"\"../x.safetensors\""}},
      {R"({"weight_map":{"a":"sub/../../x.safetensors"}})", {"without '..'"}},
      {R"({"weight_map":{"a":""}})", {"not a file name"}},
  };
  for (const auto& [text, expected] : cases) {
    SCOPED_TRACE(text);
    write_text(index, text);
    const std::string message = error_of([&] { ShardedCheckpoint::open(index); });
    EXPECT_THAT(message, HasSubstr(index.string()));
    for (const auto& want : expected) EXPECT_THAT(message, HasSubstr(want));
  }
  EXPECT_THAT(error_of([&] { ShardedCheckpoint::open(dir.path() / "missing.json"); }),
              HasSubstr("cannot open"));
}

TEST(ShardedCheckpoint, ReportsIndexAndShardsThatDisagree) {
  TempDir dir("disagree");
  write_safetensors(dir.path() / "a.safetensors",
                    {{"x", patterned({2}, DType::F32, 1)}, {"y", patterned({2}, DType::F32, 2)}});
  write_safetensors(dir.path() / "bad.safetensors", {{"z", patterned({2}, DType::F32, 3)}});
  {  // Corrupt the second shard: one byte missing.
    std::filesystem::resize_file(dir.path() / "bad.safetensors",
                                 std::filesystem::file_size(dir.path() / "bad.safetensors") - 1);
  }
  const auto index = dir.path() / "index.json";
  write_sharded_index(index, {{"x", "a.safetensors"},
                              {"ghost", "a.safetensors"},
                              {"z", "bad.safetensors"},
                              {"w", "missing.safetensors"}});
  const auto ckpt = ShardedCheckpoint::open(index);
  EXPECT_EQ(ckpt.metadata(), nlohmann::json::object());
  EXPECT_EQ(tensor_bytes(ckpt.read("x")), tensor_bytes(patterned({2}, DType::F32, 1)));
  EXPECT_THAT(error_of([&] { ckpt.read("ghost"); }),
              AllOf(HasSubstr("\"ghost\" to a.safetensors"), HasSubstr("holds no such tensor")));
  EXPECT_THAT(error_of([&] { ckpt.read("z"); }),
              AllOf(HasSubstr("bad.safetensors"), HasSubstr("end past the data buffer")));
  EXPECT_THAT(error_of([&] { ckpt.read("w"); }),
              AllOf(HasSubstr("missing.safetensors"), HasSubstr("cannot open")));
  EXPECT_THAT(error_of([&] { ckpt.validate(); }), HasSubstr("\"ghost\""));

  // validate() also finds shard tensors that the index leaves out.
  write_sharded_index(index, {{"x", "a.safetensors"}});
  EXPECT_THAT(error_of([&] { ShardedCheckpoint::open(index).validate(); }),
              AllOf(HasSubstr("a.safetensors holds tensor \"y\""), HasSubstr("does not list")));
  EXPECT_THAT(error_of([&] {
                write_sharded_index(index, {{"x", "/abs.safetensors"}});
              }),
              HasSubstr("without '..'"));
}

}  // namespace
}  // namespace expar
