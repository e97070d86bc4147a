// Round trips through SafetensorsWriter and SafetensorsFile (memory and mmap), layout rules of the writer,
// metadata, row slices, and the reference implementation's byte format.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "common/temp_dir.hpp"
#include "expar/io/safetensors_file.hpp"
#include "expar/io/safetensors_writer.hpp"
#include "io/io_test_util.hpp"

namespace expar {
namespace {

using test::patterned;
using test::raw_file;
using test::TempDir;
using test::tensor_bytes;
using ::testing::HasSubstr;

const DType kAllDtypes[] = {DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::E8M0,
                            DType::I32, DType::I64, DType::U8,   DType::F64};

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no expar::Error thrown>";
}

void expect_same_tensor(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.dtype(), want.dtype());
  EXPECT_EQ(got.shape(), want.shape());
  EXPECT_EQ(tensor_bytes(got), tensor_bytes(want));
}

class EveryDtype : public ::testing::TestWithParam<DType> {};

TEST_P(EveryDtype, RoundTripsThroughMemoryAndFile) {
  const DType dtype = GetParam();
  std::map<std::string, Tensor> tensors = {
      {"matrix", patterned({3, 5}, dtype, 1)}, {"cube", patterned({2, 3, 4}, dtype, 2)},
      {"scalar", patterned({}, dtype, 3)},     {"empty", patterned({0, 7}, dtype, 4)},
      {"odd", patterned({7}, dtype, 5)},
  };
  SafetensorsWriter writer;
  for (const auto& [name, t] : tensors) writer.add(name, t);
  const auto bytes = writer.to_bytes();

  TempDir dir("dtype");
  const auto path = dir.path() / "t.safetensors";
  writer.write(path);
  std::ifstream in(path, std::ios::binary);
  std::vector<char> on_disk((std::istreambuf_iterator<char>(in)), {});
  ASSERT_EQ(on_disk.size(), bytes.size());
  EXPECT_EQ(std::memcmp(on_disk.data(), bytes.data(), bytes.size()), 0) << "write() and to_bytes() differ";

  for (const SafetensorsFile& file : {SafetensorsFile::from_bytes(bytes), SafetensorsFile::open(path)}) {
    ASSERT_EQ(file.names(), (std::vector<std::string>{"cube", "empty", "matrix", "odd", "scalar"}));
    for (const auto& [name, want] : tensors) {
      SCOPED_TRACE(name);
      const TensorInfo& info = file.info(name);
      EXPECT_EQ(info.dtype, dtype);
      EXPECT_EQ(info.shape, want.shape());
      EXPECT_EQ(info.nbytes(), want.nbytes());
      expect_same_tensor(file.view(name), want);
      expect_same_tensor(file.read(name), want);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(file.view(name).raw()) % dtype_size(dtype), 0u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Safetensors, EveryDtype, ::testing::ValuesIn(kAllDtypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(SafetensorsWriter, AlignsEveryTensorAndPadsTheHeader) {
  SafetensorsWriter writer;
  writer.add("a_u8", patterned({3}, DType::U8, 1));
  writer.add("b_f64", patterned({2}, DType::F64, 2));
  writer.add("c_bf16", patterned({3}, DType::BF16, 3));
  writer.add("d_f32", patterned({1}, DType::F32, 4));
  writer.add("e_i64", patterned({1}, DType::I64, 5));
  const auto layout = writer.layout();
  std::vector<std::string> order;
  for (const auto& info : layout) {
    order.push_back(info.name);
    EXPECT_EQ(info.data_begin % dtype_size(info.dtype), 0u) << info.name;
  }
  // Larger elements first, names ascending within one element size.
  EXPECT_EQ(order, (std::vector<std::string>{"b_f64", "e_i64", "d_f32", "c_bf16", "a_u8"}));

  const auto bytes = writer.to_bytes();
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ(n % 8, 0u);
  std::string header(reinterpret_cast<const char*>(bytes.data()) + 8, n);
  EXPECT_EQ(header.find_first_of(' '), header.find_last_not_of(' ') + 1) << "padding is trailing spaces only";
  EXPECT_EQ(bytes.size(), 8 + n + 16 + 8 + 4 + 6 + 3);
}

TEST(Safetensors, MatchesTheReferenceByteFormat) {
  // What the reference implementation writes for {"w": F32 [2] = {1, 2}} with metadata {"format": "pt"}:
  // compact JSON, __metadata__ first, fields in the order dtype, shape, data_offsets, space padded to 8.
  Tensor w = Tensor::empty({2}, DType::F32);
  w.data<float>()[0] = 1.0f;
  w.data<float>()[1] = 2.0f;
  SafetensorsWriter writer;
  writer.add("w", w);
  writer.set_metadata("format", "pt");
  std::string header =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  auto want = raw_file(header, 0);
  const float values[2] = {1.0f, 2.0f};
  const auto* p = reinterpret_cast<const std::byte*>(values);
  want.insert(want.end(), p, p + 8);
  EXPECT_EQ(writer.to_bytes(), want);
}

TEST(Safetensors, ReadsHeadersOfOtherWriters) {
  // Other field order, whitespace, no padding, so the data buffer does not start 8-byte aligned.
  const std::string header =
      R"({ "b" : {"data_offsets":[2,10], "shape":[2], "dtype":"F32"}, "a":{"shape":[2],"dtype":"U8","data_offsets":[0,2]}})";
  const auto bytes = raw_file(header, 10);
  const auto file = SafetensorsFile::from_bytes(bytes, "other.safetensors");
  EXPECT_EQ(file.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(file.info("b").data_begin, 2u);
  EXPECT_EQ(file.read("a").data<uint8_t>()[1], 1);
  const Tensor b = file.read("b");
  EXPECT_EQ(std::memcmp(b.raw(), bytes.data() + 8 + header.size() + 2, 8), 0);
  // b starts at file offset 8 + N + 2, not a multiple of 4: no in-place view, and the message says why.
  ASSERT_NE((8 + header.size() + 2) % 4, 0u);
  EXPECT_THAT(error_of([&] { file.view("b"); }),
              AllOf(HasSubstr("other.safetensors"), HasSubstr("\"b\""),
                    HasSubstr("not a multiple of its 4-byte"), HasSubstr("read()")));
  EXPECT_EQ(file.view("a").data<uint8_t>()[0], 0);
}

TEST(Safetensors, MetadataRoundTrips) {
  SafetensorsWriter writer;
  writer.set_metadata("format", "pt");
  writer.set_metadata("note", "ünïcode \"quoted\" \n newline");
  writer.set_metadata("empty", "");
  writer.add("x", patterned({4}, DType::F32, 1));
  const auto file = SafetensorsFile::from_bytes(writer.to_bytes());
  EXPECT_EQ(file.metadata(),
            (std::map<std::string, std::string>{
                {"empty", ""}, {"format", "pt"}, {"note", "ünïcode \"quoted\" \n newline"}}));
  EXPECT_EQ(file.names(), std::vector<std::string>{"x"});  // __metadata__ is not a tensor

  SafetensorsWriter bare;
  bare.add("x", patterned({4}, DType::F32, 1));
  const auto bare_bytes = bare.to_bytes();
  EXPECT_TRUE(SafetensorsFile::from_bytes(bare_bytes).metadata().empty());
  const std::string text(reinterpret_cast<const char*>(bare_bytes.data()), bare_bytes.size());
  EXPECT_EQ(text.find("__metadata__"), std::string::npos) << "no empty metadata object is written";
}

TEST(Safetensors, EmptyFileWithNoTensors) {
  SafetensorsWriter writer;
  const auto file = SafetensorsFile::from_bytes(writer.to_bytes());
  EXPECT_EQ(file.size(), 0u);
  EXPECT_THAT(error_of([&] { file.info("x"); }), HasSubstr("no tensor named \"x\""));
}

TEST(Safetensors, RowsOfTheFirstDimension) {
  // A stacked expert tensor [E=5, H=3, I=4]: each rank reads only its experts' rows.
  const Tensor experts = patterned({5, 3, 4}, DType::BF16, 9);
  SafetensorsWriter writer;
  writer.add("experts", experts);
  writer.add("scalar", patterned({}, DType::F32, 1));
  writer.add("none", patterned({0, 3}, DType::F32, 1));
  TempDir dir("rows");
  writer.write(dir.path() / "e.safetensors");
  const auto file = SafetensorsFile::open(dir.path() / "e.safetensors");
  const size_t row_bytes = 3 * 4 * 2;
  for (int64_t begin = 0; begin <= 5; ++begin) {
    for (int64_t end = begin; end <= 5; ++end) {
      const Tensor copy = file.read_rows("experts", begin, end, MemCategory::ExpertWeights);
      const Tensor view = file.view_rows("experts", begin, end);
      EXPECT_EQ(copy.shape(), (Shape{end - begin, 3, 4}));
      EXPECT_EQ(view.shape(), copy.shape());
      EXPECT_EQ(copy.category(), MemCategory::ExpertWeights);
      const auto* want =
          static_cast<const std::byte*>(experts.raw()) + static_cast<size_t>(begin) * row_bytes;
      const std::vector<std::byte> want_bytes(want, want + static_cast<size_t>(end - begin) * row_bytes);
      EXPECT_EQ(tensor_bytes(copy), want_bytes) << begin << ".." << end;
      EXPECT_EQ(tensor_bytes(view), want_bytes) << begin << ".." << end;
    }
  }
  EXPECT_EQ(file.read_rows("none", 0, 0).shape(), (Shape{0, 3}));
  EXPECT_THAT(error_of([&] { file.read_rows("experts", 2, 6); }),
              AllOf(HasSubstr("\"experts\""), HasSubstr("rows [2, 6)"), HasSubstr("first dimension of 5")));
  EXPECT_THAT(error_of([&] { file.read_rows("experts", 3, 2); }), HasSubstr("rows [3, 2)"));
  EXPECT_THAT(error_of([&] { file.view_rows("experts", -1, 2); }), HasSubstr("rows [-1, 2)"));
  EXPECT_THAT(error_of([&] { file.read_rows("scalar", 0, 1); }), HasSubstr("scalar"));
}

TEST(Safetensors, ViewsOutliveAMove) {
  SafetensorsWriter writer;
  const Tensor x = patterned({16}, DType::F32, 3);
  writer.add("x", x);
  auto file = SafetensorsFile::from_bytes(writer.to_bytes());
  const Tensor view = file.view("x");
  SafetensorsFile moved = std::move(file);
  EXPECT_EQ(tensor_bytes(view), tensor_bytes(x));
  EXPECT_EQ(moved.view("x").raw(), view.raw());
}

TEST(SafetensorsWriter, RejectsBadNames) {
  SafetensorsWriter writer;
  writer.add("a", patterned({1}, DType::F32, 1));
  EXPECT_THAT(error_of([&] { writer.add("a", patterned({1}, DType::F32, 1)); }), HasSubstr("added twice"));
  EXPECT_THAT(error_of([&] { writer.add("__metadata__", patterned({1}, DType::F32, 1)); }),
              HasSubstr("reserved"));
  EXPECT_THAT(error_of([&] { writer.add("", patterned({1}, DType::F32, 1)); }),
              HasSubstr("must not be empty"));
  EXPECT_THAT(error_of([&] { writer.add("bad\xff", patterned({1}, DType::F32, 1)); }), HasSubstr("UTF-8"));
  EXPECT_THAT(error_of([&] { writer.add("undefined", Tensor()); }), HasSubstr("no storage"));
  EXPECT_THAT(error_of([&] { writer.set_metadata("k", "\xc3"); }), HasSubstr("UTF-8"));
}

TEST(SafetensorsFile, OpenReportsMissingFilesAndDirectories) {
  TempDir dir("open");
  EXPECT_THAT(error_of([&] { SafetensorsFile::open(dir.path() / "missing.safetensors"); }),
              AllOf(HasSubstr("missing.safetensors"), HasSubstr("cannot open")));
  EXPECT_THAT(error_of([&] { SafetensorsFile::open(dir.path()); }), HasSubstr("not a regular file"));
  std::ofstream(dir.path() / "empty.safetensors").close();
  EXPECT_THAT(error_of([&] { SafetensorsFile::open(dir.path() / "empty.safetensors"); }),
              AllOf(HasSubstr("empty.safetensors"), HasSubstr("file is 0 bytes")));
}

TEST(SafetensorsWriter, WriteFailsCleanlyInAMissingDirectory) {
  TempDir dir("write");
  SafetensorsWriter writer;
  writer.add("x", patterned({1}, DType::F32, 1));
  EXPECT_THAT(error_of([&] { writer.write(dir.path() / "no" / "such" / "x.safetensors"); }),
              HasSubstr("cannot create"));
}

}  // namespace
}  // namespace expar
