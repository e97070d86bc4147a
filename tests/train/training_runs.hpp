#pragma once
// Shared by the training tests: a small corpus of repeated text, a small config, the products' precision
// (f32 or BF16), and a threads-backend run of train() (optionally on emulated nodes) that returns rank 0's
// step records and the layout text it printed at start.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "expar/comm/launcher.hpp"
#include "expar/core/matmul.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/train/trainer.hpp"

namespace expar::testing {

inline const TokenCorpus& repeated_text_corpus() {
  static const TokenCorpus c = [] {
    std::string text;
    for (int i = 0; i < 200; ++i)
      text +=
          "And God said, Let there be light: and there was light. And God saw the light, that it was good. ";
    return TokenCorpus::from_text(text);
  }();
  return c;
}

// The tiny preset, 8 sequences of 16 tokens per step, validation at the end only.
inline TrainConfig small_config(int ep, const std::string& path, int steps) {
  TrainConfig c;
  c.model = ModelConfig::preset("tiny");
  c.ep = ep;
  c.execution.moe.path = path;
  c.steps = steps;
  c.global_batch = 8;
  c.seq_len = 16;
  c.warmup = 2;
  c.lr = 5e-3;
  c.eval_every = 0;
  c.eval_sequences = 4;
  return c;
}

// The products' precision of a training test (issue #35): f32, or BF16 products (`expar train --precision
// bf16`) with, when `bf16_payloads`, the BF16 payloads that command then defaults to on the paths that move
// reduced precision.
enum class Products { F32, Bf16 };

inline std::string products_name(const ::testing::TestParamInfo<Products>& info) {
  return info.param == Products::Bf16 ? "bf16" : "f32";
}

inline TrainConfig with_products(TrainConfig c, Products products, bool bf16_payloads = true) {
  if (products == Products::F32) return c;
  c.execution.bf16_products = true;
  if (bf16_payloads && path_traits(c.execution.moe.path).reduced_precision)
    c.execution.moe.precision = PayloadPrecision::uniform(PayloadFormat::BF16);
  return c;
}

// Why a BF16 training test does not run here, or empty: the trainer refuses --precision bf16 on CPUs
// without BF16 dot products (core/matmul.hpp's check_bf16_native).
inline std::string bf16_training_skip(Products products) {
  if (products == Products::F32 || bf16_native()) return {};
  return "--precision bf16 needs BF16 dot products; oneDNN runs " + dnnl_isa_name() + " here";
}

struct TrainingRun {
  std::vector<StepRecord> steps;  // rank 0's
  std::string layout;             // TrainObserver::on_start's text
};

// ranks_per_node > 0: emulated nodes of that many ranks (rows between them are counted messages).
inline TrainingRun run_training(int ranks, const TrainConfig& cfg, int ranks_per_node = 0) {
  TrainingRun out;
  std::mutex m;
  TrainObserver observer;
  observer.on_start = [&](const std::string& text) { out.layout = text; };
  LaunchOptions o;
  o.ranks = ranks;
  o.ranks_per_node = ranks_per_node;
  run_ranks(o, [&](Comm& world) {
    TrainSummary s = train(cfg, world, repeated_text_corpus(), &observer);
    std::lock_guard lock(m);
    if (world.rank() == 0) out.steps = s.steps;
  });
  return out;
}

}  // namespace expar::testing
