// Token files (io/token_file.hpp): text bytes, little-endian uint16/uint32 with a FILE.json sidecar, .npy;
// every malformed input refused with a message naming the path and the rule.
#include "expar/io/token_file.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "common/temp_dir.hpp"
#include "core/expect_error.hpp"
#include "expar/core/error.hpp"

namespace expar {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

class TokenFileTest : public ::testing::Test {
 protected:
  const test::TempDir temp{"token_file"};
  const fs::path dir = temp.path();
  fs::path write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return dir / name;
  }
};

std::string le(uint64_t v, int width) {
  std::string s;
  for (int b = 0; b < width; ++b) s.push_back(static_cast<char>((v >> (8 * b)) & 0xff));
  return s;
}

// A version-1 .npy file: magic, header length, the header dict padded with spaces to 64 bytes, then data.
std::string npy(const std::string& descr, const std::string& shape, const std::string& data,
                const std::string& order = "False") {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': " + order + ", 'shape': (" + shape + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  return std::string("\x93NUMPY\x01\x00", 8) + le(header.size(), 2) + header + data;
}

TEST_F(TokenFileTest, TextIsItsBytes) {
  const TokenFile f = read_token_file(write("a.txt", "ab\xff"));
  EXPECT_EQ(f.kind, "text");
  EXPECT_EQ(f.vocab, 256);
  EXPECT_EQ(f.tokens, (std::vector<int32_t>{97, 98, 255}));
}

TEST_F(TokenFileTest, RawTokensWithASidecar) {
  const fs::path p16 = write("t16.bin", le(1, 2) + le(50000, 2) + le(7, 2));
  write("t16.bin.json", R"({"dtype": "uint16", "vocab_size": 50304})");
  TokenFile f = read_token_file(p16);
  EXPECT_EQ(f.kind, "uint16");
  EXPECT_EQ(f.vocab, 50304);
  EXPECT_EQ(f.tokens, (std::vector<int32_t>{1, 50000, 7}));
  const fs::path p32 = write("t32.bin", le(151935, 4) + le(0, 4));
  write("t32.bin.json", R"({"dtype": "uint32", "vocab_size": 151936})");
  f = read_token_file(p32);
  EXPECT_EQ(f.tokens, (std::vector<int32_t>{151935, 0}));
  // A token not below the stated vocabulary: its index and value.
  write("t32.bin.json", R"({"dtype": "uint32", "vocab_size": 1000})");
  expect_error([&] { read_token_file(p32); }, {"t32.bin", "token 0", "151935", "1000"});
  // Not a whole number of tokens.
  write("t16.bin", le(1, 2) + "x");
  expect_error([&] { read_token_file(p16); }, {"t16.bin", "3 bytes", "2-byte"});
  // Sidecars that do not say what the file holds.
  write("t16.bin", le(1, 2));
  write("t16.bin.json", R"({"dtype": "int16", "vocab_size": 10})");
  expect_error([&] { read_token_file(p16); }, {"t16.bin.json", "dtype", "uint16"});
  write("t16.bin.json", R"({"dtype": "uint16"})");
  expect_error([&] { read_token_file(p16); }, {"vocab_size"});
  write("t16.bin.json", R"({"dtype": "uint16", "vocab_size": 10, "bos": 1})");
  expect_error([&] { read_token_file(p16); }, {"bos", "not known"});
  write("t16.bin.json", R"({"dtype": "uint16", "dtype": "uint32", "vocab_size": 10})");
  expect_error([&] { read_token_file(p16); }, {"t16.bin.json"});  // duplicate key
  write("t16.bin.json", "not json");
  expect_error([&] { read_token_file(p16); }, {"t16.bin.json"});
}

TEST_F(TokenFileTest, NpyArrays) {
  TokenFile f = read_token_file(write("a.npy", npy("<u2", "3,", le(5, 2) + le(65535, 2) + le(0, 2))));
  EXPECT_EQ(f.kind, "npy <u2");
  EXPECT_EQ(f.vocab, 0);  // not stated
  EXPECT_EQ(f.tokens, (std::vector<int32_t>{5, 65535, 0}));
  f = read_token_file(write("b.npy", npy("<i8", "2, 2", le(1, 8) + le(2, 8) + le(3, 8) + le(4, 8))));
  EXPECT_EQ(f.tokens, (std::vector<int32_t>{1, 2, 3, 4}));  // flattened in C order
  f = read_token_file(write("c.npy", npy("|u1", "2,", "\x01\x02")));
  EXPECT_EQ(f.tokens, (std::vector<int32_t>{1, 2}));
  f = read_token_file(write("d.npy", npy("<i4", "1,", le(123456, 4))));
  EXPECT_EQ(f.tokens, (std::vector<int32_t>{123456}));
  expect_error([&] { read_token_file(write("e.npy", npy("<i8", "2,", le(1, 8) + le(~uint64_t{0}, 8)))); },
               {"e.npy", "token 1", "-1"});
  expect_error([&] { read_token_file(write("f.npy", npy("<f4", "1,", le(0, 4)))); }, {"f.npy", "<f4"});
  expect_error([&] { read_token_file(write("g.npy", npy("<u2", "4,", le(1, 2)))); }, {"g.npy", "truncated"});
  expect_error([&] { read_token_file(write("h.npy", npy("<u2", "1,", le(1, 2), "True"))); },
               {"h.npy", "Fortran"});
  expect_error([&] { read_token_file(write("i.npy", "NUMPY....")); }, {"i.npy", "magic"});
}

TEST_F(TokenFileTest, MissingPathsAndDirectoriesAreNamed) {
  expect_error([&] { read_token_file(dir); }, {dir.string().c_str(), "is a directory"});
  expect_error([&] { read_token_file(dir / "nope.bin"); }, {"nope.bin", "does not exist"});
}

TEST(TokenRange, NamesTheIndexAndValue) {
  EXPECT_NO_THROW(check_tokens_below({0, 5, 9}, 10, "x"));
  expect_error([] { check_tokens_below({0, 5, 10}, 10, "x", 100); }, {"x", "token 102", "value 10", "10"});
}

}  // namespace
}  // namespace expar
