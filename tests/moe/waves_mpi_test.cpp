// The MoE layer's wave schedules under Open MPI (processes, not threads; moe/waves.hpp): wave-sequential and
// wave-overlapped steps of block, rowwise and aggregated (on the shared-memory window and over
// MPI_Put/MPI_Get) give the no-wave bits, forward and backward. The overlapped schedule calls MPI from its
// communication thread (run_mpi asks for MPI_THREAD_SERIALIZED), so this is also the test of that.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "comm/mpi_test_main.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/moe_layer.hpp"

namespace expar {
namespace {

using expar::testing::mpi_world;

constexpr int64_t kDim = 32;
constexpr int kExperts = 12;  // E_L = 6, 4, 3 on 2, 3, 4 ranks

struct Outputs {
  std::vector<float> y, grad_x, grad_router, grad_w1, grad_w2, grad_w3;
};

std::vector<float> values(const Tensor& t) {
  return {t.data<float>(), t.data<float>() + t.numel()};
}

Outputs run(const std::string& path, WaveConfig waves) {
  auto& world = mpi_world();
  MoeConfig c;
  c.router.num_experts = kExperts;
  c.router.top_k = 3;
  c.model_dim = kDim;
  c.hidden_dim = 24;
  MoeExecution e;
  e.path = path;
  e.waves = waves;
  e.precision = {PayloadFormat::MXFP8, PayloadFormat::BF16, PayloadFormat::F32, PayloadFormat::BF16};
  MoeLayer layer(c, e, world, "moe");
  layer.init_params(11);
  layer.zero_grads();
  const int me = world.rank();
  Tensor x = Tensor::empty({4 + 5 * me, kDim}), grad_y = Tensor::empty({4 + 5 * me, kDim});
  fill_normal(x, 99, 10 + static_cast<uint64_t>(me), 1.0f);
  fill_normal(grad_y, 99, 20 + static_cast<uint64_t>(me), 1.0f);
  MoeState state;
  Outputs out;
  out.y = values(layer.forward(x, state));
  out.grad_x = values(layer.backward(grad_y, state));
  out.grad_router = values(layer.grads().w_router);
  out.grad_w1 = values(layer.grads().experts.w1);
  out.grad_w2 = values(layer.grads().experts.w2);
  out.grad_w3 = values(layer.grads().experts.w3);
  return out;
}

void expect_same(const Outputs& a, const Outputs& b, const std::string& what) {
  EXPECT_EQ(a.y, b.y) << what;
  EXPECT_EQ(a.grad_x, b.grad_x) << what;
  EXPECT_EQ(a.grad_router, b.grad_router) << what;
  EXPECT_EQ(a.grad_w1, b.grad_w1) << what;
  EXPECT_EQ(a.grad_w2, b.grad_w2) << what;
  EXPECT_EQ(a.grad_w3, b.grad_w3) << what;
}

void every_schedule(const std::string& path) {
  const int local = kExperts / mpi_world().size();
  const Outputs none = run(path, {});
  for (WaveConfig w : {WaveConfig{2, false}, WaveConfig{2, true}, WaveConfig{local, true}})
    expect_same(run(path, w), none,
                path + " " + wave_schedule_name(w.schedule()) + " " + std::to_string(w.waves));
}

TEST(WavesMpi, BlockSchedulesGiveTheNoWaveBits) {
  every_schedule("block");
}

TEST(WavesMpi, RowwiseOnTheSharedWindowSchedulesGiveTheNoWaveBits) {
  unsetenv("EXPAR_MPI_FORCE_REMOTE");
  every_schedule("rowwise");
}

TEST(WavesMpi, RowwiseOverMpiPutAndGetSchedulesGiveTheNoWaveBits) {
  setenv("EXPAR_MPI_FORCE_REMOTE", "1", 1);
  every_schedule("rowwise");
  unsetenv("EXPAR_MPI_FORCE_REMOTE");
}

// Under scripts/mpirun-nodes the world spans nodes: the blocks travel to their proxies by MPI_Put and back
// by MPI_Get.
TEST(WavesMpi, AggregatedSchedulesGiveTheNoWaveBits) {
  unsetenv("EXPAR_MPI_FORCE_REMOTE");
  every_schedule("aggregated");
}

TEST(WavesMpi, AggregatedOverMpiPutAndGetSchedulesGiveTheNoWaveBits) {
  setenv("EXPAR_MPI_FORCE_REMOTE", "1", 1);
  every_schedule("aggregated");
  unsetenv("EXPAR_MPI_FORCE_REMOTE");
}

}  // namespace
}  // namespace expar

int main(int argc, char** argv) {
  return expar::testing::mpi_test_main(argc, argv);
}
