// Several rank threads look tensors up in one ShardedCheckpoint at once: each shard is opened exactly once
// and every thread reads the right bytes (run under ThreadSanitizer too, through the "threads" label).
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "common/temp_dir.hpp"
#include "expar/io/sharded_checkpoint.hpp"
#include "io/io_test_util.hpp"

namespace expar {
namespace {

TEST(ShardedCheckpointThreads, ConcurrentLookupsOpenEachShardOnce) {
  test::TempDir dir("threads");
  std::map<std::string, Tensor> tensors;
  for (int i = 0; i < 8; ++i) tensors.emplace(fmt::format("t{}", i), test::patterned({4, 4}, DType::F32, i));
  write_sharded_checkpoint(dir.path(), tensors, 64);  // one tensor per shard
  const auto ckpt = ShardedCheckpoint::open_directory(dir.path());
  ASSERT_EQ(ckpt.shard_names().size(), 8u);

  std::atomic<int> mismatches{0};
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 4; ++rank) {
    ranks.emplace_back([&, rank] {
      for (int round = 0; round < 3; ++round) {
        for (int i = 0; i < 8; ++i) {
          const std::string name = fmt::format("t{}", (i + rank) % 8);
          const Tensor rows = ckpt.read_rows(name, rank % 4, rank % 4 + 1);
          if (test::tensor_bytes(rows) != test::tensor_bytes(tensors.at(name).rows(rank % 4, rank % 4 + 1))) {
            ++mismatches;
          }
        }
      }
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(ckpt.shards_opened(), 8u);
}

}  // namespace
}  // namespace expar
