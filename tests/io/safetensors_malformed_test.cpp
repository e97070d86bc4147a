// Every malformed safetensors file is rejected with an expar::Error that names the file, the tensor, the
// value and the rule; never a crash or an out-of-bounds read (this suite runs under ASan/UBSan). Hand-written
// cases are below; inputs found by the fuzzer (fuzz/, scripts/fuzz) are kept as files in tests/io/malformed/.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "expar/io/safetensors_file.hpp"
#include "expar/io/safetensors_writer.hpp"
#include "io/io_test_util.hpp"

namespace expar {
namespace {

using test::raw_file;

constexpr const char* kLabel = "bad.safetensors";

struct Malformed {
  std::string name;
  std::vector<std::byte> bytes;
  std::vector<std::string> expected;  // substrings of the message
};

// One tensor entry with the given field texts.
std::string entry(std::string_view dtype, std::string_view shape, std::string_view offsets) {
  return fmt::format(R"({{"dtype":{},"shape":{},"data_offsets":{}}})", dtype, shape, offsets);
}
std::string one(std::string_view name, std::string_view entry_text) {
  return fmt::format(R"({{"{}":{}}})", name, entry_text);
}

std::vector<Malformed> cases() {
  const std::string ok_w = entry(R"("F32")", "[2]", "[0,8]");
  std::vector<Malformed> c = {
      {"empty_file", {}, {"file is 0 bytes", "shorter than the 8-byte header length"}},
      {"seven_bytes", std::vector<std::byte>(7), {"file is 7 bytes"}},
      {"header_over_limit",
       raw_file("{}", 0, 100'000'001),
       {"header length 100000001", "exceeds", "100000000"}},
      {"header_length_huge", raw_file("{}", 0, INT64_MAX), {"exceeds the safetensors limit"}},
      {"header_past_end", raw_file("{}", 0, 3), {"header length 3 runs past the end", "2 bytes after"}},
      {"header_empty", raw_file("", 0), {"does not start with '{'", "the header is empty"}},
      {"header_not_object", raw_file("[1,2]", 0), {"does not start with '{'", "0x5b"}},
      {"header_leading_space", raw_file(" {}", 0), {"does not start with '{'", "0x20"}},
      {"header_bom", raw_file("\xEF\xBB\xBF{}", 0), {"does not start with '{'", "0xef"}},
      {"header_truncated_json", raw_file(R"({"w":{"dtype":"F32")", 0), {"not valid JSON"}},
      {"header_trailing_garbage", raw_file("{} x", 0), {"not valid JSON"}},
      {"header_two_objects", raw_file("{}{}", 0), {"not valid JSON"}},
      {"header_nul_byte", raw_file(std::string("{\0}", 3), 0), {"not valid JSON"}},
      {"header_invalid_utf8_key", raw_file("{\"w\xff\":" + ok_w + "}", 8), {"not valid JSON"}},
      {"header_comment", raw_file("{/* c */}", 0), {"not valid JSON"}},
      {"duplicate_tensor",
       raw_file(R"({"w":)" + ok_w + R"(,"w":)" + ok_w + "}", 8),
       {"duplicate key \"w\"", "may appear once"}},
      {"duplicate_field",
       raw_file(one("w", R"({"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]})"), 8),
       {"duplicate key \"dtype\""}},
      {"duplicate_metadata_key",
       raw_file(R"({"__metadata__":{"a":"1","a":"2"}})", 0),
       {"duplicate key \"a\""}},
      {"too_deep", raw_file(R"({"__metadata__":{"a":[[1]]}})", 0), {"nests containers 4 deep", "3 levels"}},
      {"entry_not_object", raw_file(R"({"w":5})", 0), {"tensor \"w\"", "must be an object", "got 5"}},
      {"missing_dtype",
       raw_file(one("w", R"({"shape":[2],"data_offsets":[0,8]})"), 8),
       {"tensor \"w\"", "missing field \"dtype\""}},
      {"missing_shape",
       raw_file(one("w", R"({"dtype":"F32","data_offsets":[0,8]})"), 8),
       {"missing field \"shape\""}},
      {"missing_offsets",
       raw_file(one("w", R"({"dtype":"F32","shape":[2]})"), 8),
       {"missing field \"data_offsets\""}},
      {"unknown_field",
       raw_file(one("w", R"({"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1})"), 8),
       {"tensor \"w\"", "unknown field \"extra\""}},
      {"dtype_not_string",
       raw_file(one("w", entry("4", "[2]", "[0,8]")), 8),
       {"dtype must be a string", "got 4"}},
      {"dtype_unknown",
       raw_file(one("w", entry(R"("F128")", "[2]", "[0,8]")), 8),
       {"tensor \"w\"", "dtype 'F128' is not supported", "F32"}},
      {"dtype_lowercase", raw_file(one("w", entry(R"("f32")", "[2]", "[0,8]")), 8), {"dtype 'f32'"}},
      {"shape_not_array",
       raw_file(one("w", entry(R"("F32")", "2", "[0,8]")), 8),
       {"shape must be an array", "got 2"}},
      {"shape_negative",
       raw_file(one("w", entry(R"("F32")", "[-2]", "[0,8]")), 8),
       {"shape dimension 0 is -2", "non-negative integer"}},
      {"shape_float",
       raw_file(one("w", entry(R"("F32")", "[2.0]", "[0,8]")), 8),
       {"shape dimension 0 is 2.0"}},
      {"shape_string",
       raw_file(one("w", entry(R"("F32")", R"([1,"2"])", "[0,8]")), 8),
       {"shape dimension 1 is \"2\""}},
      {"shape_dim_2_63",
       raw_file(one("w", entry(R"("U8")", "[9223372036854775808]", "[0,8]")), 8),
       {"shape dimension 0 is 9223372036854775808"}},
      {"shape_dim_beyond_u64",
       raw_file(one("w", entry(R"("U8")", "[18446744073709551616]", "[0,8]")), 8),
       {"shape dimension 0"}},
      {"shape_product_overflow",
       raw_file(one("w", entry(R"("U8")", "[4294967296,4294967296]", "[0,8]")), 8),
       {"more than 2^63-1 elements", "overflows"}},
      {"shape_overflow_before_zero",
       raw_file(one("w", entry(R"("U8")", "[4294967296,4294967296,0]", "[0,0]")), 0),
       {"overflows"}},
      {"shape_bytes_overflow",
       raw_file(one("w", entry(R"("F64")", "[4611686018427387904]", "[0,8]")), 8),
       {"more than 2^64 bytes"}},
      {"offsets_not_array",
       raw_file(one("w", entry(R"("F32")", "[2]", "8")), 8),
       {"data_offsets must be [begin, end]", "got 8"}},
      {"offsets_three", raw_file(one("w", entry(R"("F32")", "[2]", "[0,8,8]")), 8), {"got [0,8,8]"}},
      {"offsets_one", raw_file(one("w", entry(R"("F32")", "[2]", "[8]")), 8), {"data_offsets must be"}},
      {"offsets_negative", raw_file(one("w", entry(R"("F32")", "[2]", "[-8,0]")), 8), {"got [-8,0]"}},
      {"offsets_float", raw_file(one("w", entry(R"("F32")", "[2]", "[0,8.0]")), 8), {"got [0,8.0]"}},
      {"offsets_string",
       raw_file(one("w", entry(R"("F32")", "[2]", R"(["0","8"])")), 8),
       {"data_offsets must be"}},
      {"offsets_beyond_u64",
       raw_file(one("w", entry(R"("F32")", "[2]", "[0,18446744073709551616]")), 8),
       {"data_offsets must be"}},
      {"offsets_reversed",
       raw_file(one("w", entry(R"("F32")", "[0]", "[8,0]")), 8),
       {"tensor \"w\"", "[8, 0]", "begin > end"}},
      {"offsets_past_buffer",
       raw_file(one("w", entry(R"("F32")", "[2]", "[0,8]")), 4),
       {"tensor \"w\"", "[0, 8] end past the data buffer of 4 bytes", "truncated"}},
      {"offsets_far_past_buffer",
       raw_file(one("w", entry(R"("U8")", "[1]", "[18446744073709551614,18446744073709551615]")), 1),
       {"end past the data buffer"}},
      {"size_mismatch",
       raw_file(one("w", entry(R"("F32")", "[2,2]", "[0,12]")), 12),
       {"tensor \"w\"", "hold 12 bytes but dtype F32 x shape [2, 2] needs 16 bytes"}},
      {"overlap",
       raw_file(R"({"a":)" + entry(R"("U8")", "[4]", "[0,4]") + R"(,"b":)" +
                    entry(R"("U8")", "[4]", "[2,6]") + "}",
                6),
       {"\"a\" [0, 4] and \"b\" [2, 6] overlap"}},
      {"same_range_twice",
       raw_file(R"({"a":)" + entry(R"("U8")", "[4]", "[0,4]") + R"(,"b":)" +
                    entry(R"("U8")", "[4]", "[0,4]") + "}",
                4),
       {"overlap"}},
      {"gap_at_start",
       raw_file(one("w", entry(R"("F32")", "[1]", "[4,8]")), 8),
       {"gap of 4 bytes before tensor \"w\" at data offset 4", "without gaps"}},
      {"gap_between",
       raw_file(R"({"a":)" + entry(R"("U8")", "[2]", "[0,2]") + R"(,"b":)" +
                    entry(R"("U8")", "[2]", "[3,5]") + "}",
                5),
       {"gap of 1 bytes before tensor \"b\""}},
      {"trailing_bytes",
       raw_file(one("w", entry(R"("F32")", "[2]", "[0,8]")), 9),
       {"1 trailing bytes after the last tensor", "holds 9 bytes", "end at 8"}},
      {"no_tensors_but_data", raw_file("{}", 3), {"3 trailing bytes"}},
      {"metadata_not_object",
       raw_file(R"({"__metadata__":"x"})", 0),
       {"\"__metadata__\" must be an object", "got \"x\""}},
      {"metadata_null", raw_file(R"({"__metadata__":null})", 0), {"\"__metadata__\" must be an object"}},
      {"metadata_value_number",
       raw_file(R"({"__metadata__":{"step":3}})", 0),
       {"entry \"step\" must be a string", "got 3"}},
      {"metadata_value_nested", raw_file(R"({"__metadata__":{"cfg":{"a":"b"}}})", 0), {"entry \"cfg\""}},
  };
  // A real file cut short: the header promises more data than there is.
  SafetensorsWriter writer;
  writer.add("x", test::patterned({16}, DType::F32, 1));
  auto truncated = writer.to_bytes();
  truncated.pop_back();
  c.push_back({"truncated_data", truncated, {"tensor \"x\"", "end past the data buffer of 63 bytes"}});
  auto extended = writer.to_bytes();
  extended.push_back(std::byte{0});
  c.push_back({"one_extra_byte", extended, {"1 trailing bytes"}});
  return c;
}

class MalformedFile : public ::testing::TestWithParam<Malformed> {};

TEST_P(MalformedFile, IsRejectedWithAClearMessage) {
  const Malformed& m = GetParam();
  try {
    SafetensorsFile::from_bytes(m.bytes, kLabel);
    FAIL() << m.name << " was accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_THAT(message, ::testing::StartsWith(kLabel));
    for (const auto& want : m.expected) EXPECT_THAT(message, ::testing::HasSubstr(want));
  }
}

INSTANTIATE_TEST_SUITE_P(Safetensors, MalformedFile, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

TEST(MalformedFile, LongNamesAreCutInMessages) {
  const std::string name(100'000, 'n');
  const auto bytes = raw_file(one(name, entry(R"("F32")", "[2]", "[0,4]")), 4);
  try {
    SafetensorsFile::from_bytes(bytes, kLabel);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 1000u);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("nnn..."));
  }
}

TEST(MalformedFile, ZeroByteTensorsMayShareAnOffset) {
  // Not malformed: empty tensors tile trivially, anywhere on the chain.
  const std::string header =
      R"({"a":)" + entry(R"("U8")", "[2]", "[0,2]") + R"(,"e1":)" + entry(R"("F32")", "[0,3]", "[2,2]") +
      R"(,"e2":)" + entry(R"("F64")", "[0]", "[2,2]") + R"(,"e0":)" + entry(R"("I32")", "[0]", "[0,0]") + "}";
  const auto file = SafetensorsFile::from_bytes(raw_file(header, 2), kLabel);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"a", "e0", "e1", "e2"}));
  EXPECT_EQ(file.read("e1").shape(), (Shape{0, 3}));
}

// Inputs found by fuzzing and hand-made files (tests/io/malformed/, listed in expected.tsv with a substring
// of the message each must produce): each is rejected, for the listed reason.
TEST(MalformedFile, KeptCorpusIsRejected) {
  const auto dir = std::filesystem::path(EXPAR_TESTS_DIR) / "io" / "malformed";
  std::map<std::string, std::string> expected;
  std::ifstream list(dir / "expected.tsv");
  ASSERT_TRUE(list.good()) << dir / "expected.tsv";
  for (std::string line; std::getline(list, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << line;
    expected.emplace(line.substr(0, tab), line.substr(tab + 1));
  }
  size_t files = 0;
  for (const auto& item : std::filesystem::directory_iterator(dir)) {
    const std::string name = item.path().filename().string();
    if (name == "expected.tsv") continue;
    ++files;
    SCOPED_TRACE(name);
    ASSERT_TRUE(expected.contains(name)) << "list it in expected.tsv";
    try {
      SafetensorsFile::open(item.path());
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::StartsWith(item.path().string()));
      EXPECT_THAT(e.what(), ::testing::HasSubstr(expected.at(name)));
    }
  }
  EXPECT_EQ(files, expected.size()) << "expected.tsv lists files that are missing";
}

}  // namespace
}  // namespace expar
