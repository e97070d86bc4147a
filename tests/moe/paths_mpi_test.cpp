// The EP paths under Open MPI (processes, not threads): block, rowwise and agrs over the whole world as the
// EP group, with uneven token counts, against the local reference that every rank computes by itself over
// all ranks' tokens (the inputs come from the shared seed). rowwise runs on both heap kinds: the
// shared-memory window (peer_ptr) and the across-node path (EXPAR_MPI_FORCE_REMOTE=1: MPI_Put/MPI_Get), and
// so does every registered path that moves block's rows (under scripts/mpirun-nodes the world spans nodes).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/mpi_test_main.hpp"
#include "common/close.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/moe_layer.hpp"
#include "moe/solo_comm.hpp"

namespace expar {
namespace {

using expar::testing::mpi_world;

constexpr int64_t kDim = 16;

MoeConfig config() {
  MoeConfig c;
  c.router.num_experts = 12;  // divisible by 2, 3 and 4 ranks
  c.router.top_k = 2;
  c.model_dim = kDim;
  c.hidden_dim = 24;
  return c;
}

MoeExecution execution(const std::string& path) {
  MoeExecution e;
  e.path = path;
  return e;
}

int64_t tokens_of(int rank) {
  return 5 + 3 * rank;
}  // uneven

Tensor rows_of(int rank, uint64_t stream) {
  Tensor t = Tensor::empty({tokens_of(rank), kDim});
  fill_normal(t, 2024, stream * 16 + static_cast<uint64_t>(rank), 1.0f);
  return t;
}

Tensor concat(int ranks, uint64_t stream) {
  int64_t total = 0;
  for (int r = 0; r < ranks; ++r) total += tokens_of(r);
  Tensor all = Tensor::empty({total, kDim});
  int64_t at = 0;
  for (int r = 0; r < ranks; ++r) {
    Tensor part = rows_of(r, stream);
    std::copy(part.data<float>(), part.data<float>() + part.numel(), all.data<float>() + at * kDim);
    at += tokens_of(r);
  }
  return all;
}

// f32 rounding of another summation order: 1e-5 of the element, absolute 1e-5 below 1.
const test::Tolerance kClose = test::Tolerance::relative(1e-5, 1.0);

// n elements of the reference from `want`.
std::span<const float> part(const float* want, int64_t n) {
  return {want, static_cast<size_t>(n)};
}

struct Outputs {
  std::vector<float> y, grad_x, grad_router, grad_w1, grad_w2;
};

Outputs run_path(const std::string& path) {
  auto& world = mpi_world();
  const int me = world.rank(), n = world.size();
  MoeLayer layer(config(), execution(path), world, "moe");
  layer.init_params(7);
  layer.zero_grads();
  MoeState state;
  Tensor y = layer.forward(rows_of(me, 1), state);
  Tensor grad_x = layer.backward(rows_of(me, 2), state);
  Outputs out;
  out.y.assign(y.data<float>(), y.data<float>() + y.numel());
  out.grad_x.assign(grad_x.data<float>(), grad_x.data<float>() + grad_x.numel());
  // The router is replicated: its full gradient is the sum of every rank's part.
  Tensor router = layer.grads().w_router.clone();
  world.all_reduce(router.raw(), static_cast<size_t>(router.numel()), DType::F32, ReduceOp::Sum);
  out.grad_router.assign(router.data<float>(), router.data<float>() + router.numel());
  const Tensor& w1 = layer.grads().experts.w1;
  const Tensor& w2 = layer.grads().experts.w2;
  out.grad_w1.assign(w1.data<float>(), w1.data<float>() + w1.numel());
  out.grad_w2.assign(w2.data<float>(), w2.data<float>() + w2.numel());

  // The reference: the local path on one rank over every rank's tokens, computed here.
  testing::SoloComm solo;
  MoeLayer ref(config(), execution("local"), solo, "moe");
  ref.init_params(7);
  ref.zero_grads();
  MoeState ref_state;
  Tensor ref_y = ref.forward(concat(n, 1), ref_state);
  Tensor ref_grad_x = ref.backward(concat(n, 2), ref_state);
  int64_t first = 0;
  for (int r = 0; r < me; ++r) first += tokens_of(r);
  const int64_t rows = tokens_of(me);
  EXPECT_TRUE(test::close(out.y, part(ref_y.data<float>() + first * kDim, rows * kDim), kClose))
      << path << " y";
  EXPECT_TRUE(test::close(out.grad_x, part(ref_grad_x.data<float>() + first * kDim, rows * kDim), kClose))
      << path << " grad_x";
  EXPECT_TRUE(test::close(out.grad_router,
                          part(ref.grads().w_router.data<float>(), ref.grads().w_router.numel()), kClose))
      << path << " grad router";
  // This rank's experts (contiguous placement) are a slice of the reference's.
  const int64_t per_expert_w1 = w1.numel() / w1.dim(0), per_expert_w2 = w2.numel() / w2.dim(0);
  const int64_t first_expert = me * w1.dim(0);
  EXPECT_TRUE(test::close(
      out.grad_w1, part(ref.grads().experts.w1.data<float>() + first_expert * per_expert_w1, w1.numel()),
      kClose))
      << path << " grad w1";
  EXPECT_TRUE(test::close(
      out.grad_w2, part(ref.grads().experts.w2.data<float>() + first_expert * per_expert_w2, w2.numel()),
      kClose))
      << path << " grad w2";
  return out;
}

TEST(PathsMpi, BlockMatchesTheLocalReference) {
  run_path("block");
}

TEST(PathsMpi, AgrsMatchesTheLocalReference) {
  run_path("agrs");
}

TEST(PathsMpi, RowwiseOnTheSharedWindowIsBitIdenticalToBlock) {
  unsetenv("EXPAR_MPI_FORCE_REMOTE");
  Outputs block = run_path("block");
  Outputs rowwise = run_path("rowwise");
  EXPECT_EQ(block.y, rowwise.y);
  EXPECT_EQ(block.grad_x, rowwise.grad_x);
  EXPECT_EQ(block.grad_w1, rowwise.grad_w1);
  EXPECT_EQ(block.grad_w2, rowwise.grad_w2);
  EXPECT_EQ(block.grad_router, rowwise.grad_router);
}

TEST(PathsMpi, RowwiseOverMpiPutAndGetIsBitIdenticalToBlock) {
  setenv("EXPAR_MPI_FORCE_REMOTE", "1", 1);
  Outputs rowwise = run_path("rowwise");
  unsetenv("EXPAR_MPI_FORCE_REMOTE");
  Outputs block = run_path("block");
  EXPECT_EQ(block.y, rowwise.y);
  EXPECT_EQ(block.grad_x, rowwise.grad_x);
  EXPECT_EQ(block.grad_w1, rowwise.grad_w1);
  EXPECT_EQ(block.grad_w2, rowwise.grad_w2);
}

// Every registered path whose traits say it moves block's rows into block's places, on both heap kinds.
TEST(PathsMpi, EveryPathWithBlocksRowsIsBitIdenticalToBlock) {
  unsetenv("EXPAR_MPI_FORCE_REMOTE");
  Outputs block = run_path("block");
  int checked = 0;
  for (const PathTraits& t : path_registry()) {
    if (!t.same_rows_as_block || t.name == "block") continue;
    for (bool remote : {false, true}) {
      SCOPED_TRACE(t.name + (remote ? " over MPI_Put/MPI_Get" : " on the shared window"));
      if (remote) setenv("EXPAR_MPI_FORCE_REMOTE", "1", 1);
      Outputs other = run_path(t.name);
      unsetenv("EXPAR_MPI_FORCE_REMOTE");
      EXPECT_EQ(block.y, other.y);
      EXPECT_EQ(block.grad_x, other.grad_x);
      EXPECT_EQ(block.grad_w1, other.grad_w1);
      EXPECT_EQ(block.grad_w2, other.grad_w2);
      EXPECT_EQ(block.grad_router, other.grad_router);
      ++checked;
    }
  }
  EXPECT_GE(checked, 4) << "rowwise and aggregated, each on both heap kinds";
}

}  // namespace
}  // namespace expar

int main(int argc, char** argv) {
  return expar::testing::mpi_test_main(argc, argv);
}
