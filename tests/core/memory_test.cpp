// MemoryTracker accounting: a tensor charges its bytes to its category of the tracker bound when it was
// allocated, peaks are the high-water marks since the last reset, and the bytes come back when the last view
// of the storage goes, whichever thread drops it.
#include "expar/core/memory.hpp"

#include <gtest/gtest.h>

#include <thread>

#include "expar/core/tensor.hpp"

namespace expar {
namespace {

TEST(MemoryTracker, AddAndSubKeepCurrentAndPeakPerCategory) {
  MemoryTracker m;
  m.add(MemCategory::Gradients, 100);
  m.add(MemCategory::Activations, 40);
  m.sub(MemCategory::Gradients, 70);
  m.add(MemCategory::Gradients, 20);
  MemorySnapshot s = m.snapshot();
  EXPECT_EQ(s.current_of(MemCategory::Gradients), 50);
  EXPECT_EQ(s.peak_of(MemCategory::Gradients), 100);
  EXPECT_EQ(s.current_of(MemCategory::Activations), 40);
  EXPECT_EQ(s.peak_of(MemCategory::Activations), 40);
  EXPECT_EQ(s.current_of(MemCategory::DenseWeights), 0);
  EXPECT_EQ(s.total_current, 90);
  EXPECT_EQ(s.total_peak, 140);  // 100 + 40 before the sub
  m.reset_peaks();
  s = m.snapshot();
  EXPECT_EQ(s.peak_of(MemCategory::Gradients), 50);
  EXPECT_EQ(s.total_peak, 90);
}

TEST(MemoryTracker, TensorsChargeTheBoundTrackerUntilTheLastViewGoes) {
  MemoryTracker m;
  TrackerBinding bind(m);
  EXPECT_EQ(&current_tracker(), &m);
  {
    Tensor a = Tensor::empty({10, 3}, DType::F32, MemCategory::OptimizerState);
    Tensor b = Tensor::zeros({8}, DType::I64, MemCategory::CommScratch);
    EXPECT_EQ(m.snapshot().current_of(MemCategory::OptimizerState), 120);
    EXPECT_EQ(m.snapshot().current_of(MemCategory::CommScratch), 64);
    EXPECT_EQ(m.snapshot().total_current, 184);
    Tensor view = a.rows(2, 5);
    a = Tensor();
    EXPECT_EQ(m.snapshot().current_of(MemCategory::OptimizerState), 120) << "a view keeps the storage";
    view = Tensor();
    EXPECT_EQ(m.snapshot().current_of(MemCategory::OptimizerState), 0);
  }
  EXPECT_EQ(m.snapshot().total_current, 0);
  EXPECT_EQ(m.snapshot().total_peak, 184);
}

TEST(MemoryTracker, AFreeOnAnotherThreadCreditsTheOwner) {
  MemoryTracker owner, other;
  Tensor t;
  {
    TrackerBinding bind(owner);
    t = Tensor::empty({16}, DType::F32, MemCategory::Activations);
  }
  EXPECT_EQ(owner.snapshot().current_of(MemCategory::Activations), 64);
  std::thread([&] {
    TrackerBinding bind(other);
    t = Tensor();
  }).join();
  EXPECT_EQ(owner.snapshot().current_of(MemCategory::Activations), 0);
  EXPECT_EQ(other.snapshot().total_current, 0);
  EXPECT_EQ(other.snapshot().total_peak, 0);
}

TEST(MemoryTracker, BindingRestoresThePreviousTracker) {
  MemoryTracker outer, inner;
  MemoryTracker& before = current_tracker();
  {
    TrackerBinding a(outer);
    {
      TrackerBinding b(inner);
      EXPECT_EQ(&current_tracker(), &inner);
    }
    EXPECT_EQ(&current_tracker(), &outer);
  }
  EXPECT_EQ(&current_tracker(), &before);
}

}  // namespace
}  // namespace expar
