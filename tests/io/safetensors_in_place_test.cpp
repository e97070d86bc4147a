// SafetensorsFile views keep the mapping alive (it goes with the last view), and release_rows gives the
// resident pages of copied rows back without changing what the file reads as.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <string>

#include "common/resident_bytes.hpp"
#include "common/temp_dir.hpp"
#include "expar/io/safetensors_file.hpp"
#include "expar/io/safetensors_writer.hpp"
#include "io/io_test_util.hpp"

namespace expar {
namespace {

using test::patterned;
using test::resident_bytes_of;
using test::TempDir;

// Reads one byte of every page of t (volatile: the reads must happen).
void touch(const Tensor& t) {
  const auto* p = static_cast<const volatile uint8_t*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); i += 4096) static_cast<void>(p[i]);
}

TEST(SafetensorsInPlace, AViewOutlivesTheFileAndTheMappingGoesWithTheLastView) {
  TempDir dir("in_place");
  const std::string path = (dir.path() / "w.safetensors").string();
  const Tensor want = patterned({512, 256}, DType::F32, 3);  // 512 KiB
  write_safetensors(path, std::map<std::string, Tensor>{{"w", want}});
  Tensor rows;
  {
    SafetensorsFile f = SafetensorsFile::open(path);
    EXPECT_TRUE(f.mapped());
    rows = f.view_rows("w", 100, 300);
  }
  bool mapped = false;
  resident_bytes_of(path, &mapped);
  EXPECT_TRUE(mapped) << "the view holds the mapping";
  EXPECT_EQ(std::memcmp(rows.raw(), static_cast<const float*>(want.raw()) + 100 * 256, rows.nbytes()), 0);
  rows = Tensor();
  resident_bytes_of(path, &mapped);
  EXPECT_FALSE(mapped) << "the last view is gone: the mapping is released";
}

TEST(SafetensorsInPlace, ReleaseRowsDropsTheirPagesAndTheyReadTheSameAfterwards) {
  TempDir dir("release");
  const std::string path = (dir.path() / "w.safetensors").string();
  const Tensor want = patterned({1024, 1024}, DType::F32, 5);  // 4 MiB
  write_safetensors(path, std::map<std::string, Tensor>{{"w", want}});
  SafetensorsFile f = SafetensorsFile::open(path);
  const Tensor all = f.view("w");
  touch(all);
  const int64_t before = resident_bytes_of(path);
  EXPECT_GE(before, int64_t{4} << 20);
  f.release_rows("w", 0, 1024);
  const int64_t after = resident_bytes_of(path);
  EXPECT_LE(after, int64_t{64} << 10) << "resident before " << before;  // the header page and the edges
  EXPECT_EQ(std::memcmp(all.raw(), want.raw(), all.nbytes()), 0);       // read from the file again
  // Part of the rows: only the pages wholly inside them go.
  touch(all);
  f.release_rows("w", 0, 512);
  const int64_t half = resident_bytes_of(path);
  EXPECT_GE(half, int64_t{2} << 20);
  EXPECT_LE(half, (int64_t{2} << 20) + (int64_t{64} << 10));
}

TEST(SafetensorsInPlace, ReleaseRowsLeavesAFileInMemoryAlone) {
  TempDir dir("release_memory");
  const std::string path = (dir.path() / "w.safetensors").string();
  const Tensor want = patterned({256, 1024}, DType::F32, 7);
  write_safetensors(path, std::map<std::string, Tensor>{{"w", want}});
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  SafetensorsFile f =
      SafetensorsFile::from_bytes({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()}, "memory");
  EXPECT_FALSE(f.mapped());
  f.release_rows("w", 0, 256);  // MADV_DONTNEED on heap memory would zero it
  EXPECT_EQ(std::memcmp(f.view("w").raw(), want.raw(), want.nbytes()), 0);
}

}  // namespace
}  // namespace expar
