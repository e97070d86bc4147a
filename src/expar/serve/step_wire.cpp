#include "expar/serve/step_wire.hpp"

#include <bit>

#include "expar/core/assert.hpp"

namespace expar::serve {
namespace {

class Reader {
 public:
  Reader(const int64_t* data, size_t size) : data_(data), size_(size) {}
  int64_t next() {
    EXPAR_ASSERT(at_ < size_, "a step message of {} values ends early", size_);
    return data_[at_++];
  }
  size_t count() {  // a length, checked against what is left so that a bad one cannot allocate wildly
    const int64_t n = next();
    EXPAR_ASSERT(n >= 0 && static_cast<size_t>(n) <= size_ - at_, "a step message has a bad length {}", n);
    return static_cast<size_t>(n);
  }
  double real() { return std::bit_cast<double>(next()); }
  void finish() const {
    EXPAR_ASSERT(at_ == size_, "a step message has {} values after its end", size_ - at_);
  }

 private:
  const int64_t* data_;
  size_t size_, at_ = 0;
};

void put_real(std::vector<int64_t>& w, double x) {
  w.push_back(std::bit_cast<int64_t>(x));
}

}  // namespace

std::vector<int64_t> encode_plan(const StepPlan& plan) {
  std::vector<int64_t> w{plan.prefill, plan.runs_engine, static_cast<int64_t>(plan.replicas.size())};
  for (const ReplicaStep& r : plan.replicas) {
    w.push_back(static_cast<int64_t>(r.add.size()));
    for (const auto& [slot, capacity] : r.add) w.insert(w.end(), {slot, capacity});
    w.push_back(static_cast<int64_t>(r.remove.size()));
    w.insert(w.end(), r.remove.begin(), r.remove.end());
    w.push_back(static_cast<int64_t>(r.sequences.size()));
    for (const SequenceStep& s : r.sequences) {
      w.push_back(s.slot);
      w.push_back(static_cast<int64_t>(s.tokens.size()));
      w.insert(w.end(), s.tokens.begin(), s.tokens.end());
      w.push_back(s.sample);
      put_real(w, s.sampling.temperature);
      put_real(w, s.sampling.top_p);
      w.push_back(s.sampling.top_k);
      w.push_back(static_cast<int64_t>(s.seed));
      w.push_back(static_cast<int64_t>(s.index));
      w.push_back(s.trace_logits);
    }
  }
  w.push_back(static_cast<int64_t>(plan.expert_tables.size()));
  for (const LayerSlotTable& t : plan.expert_tables) {
    w.push_back(t.layer);
    w.push_back(static_cast<int64_t>(t.slot_experts.size()));
    w.insert(w.end(), t.slot_experts.begin(), t.slot_experts.end());
  }
  return w;
}

StepPlan decode_plan(const std::vector<int64_t>& wire) {
  Reader in(wire.data(), wire.size());
  StepPlan plan;
  plan.prefill = in.next() != 0;
  plan.runs_engine = in.next() != 0;
  plan.replicas.resize(in.count());
  for (ReplicaStep& r : plan.replicas) {
    r.add.resize(in.count());
    for (auto& [slot, capacity] : r.add) {
      slot = in.next();
      capacity = in.next();
    }
    r.remove.resize(in.count());
    for (int64_t& slot : r.remove) slot = in.next();
    r.sequences.resize(in.count());
    for (SequenceStep& s : r.sequences) {
      s.slot = in.next();
      s.tokens.resize(in.count());
      for (int32_t& t : s.tokens) t = static_cast<int32_t>(in.next());
      s.sample = in.next() != 0;
      s.sampling.temperature = in.real();
      s.sampling.top_p = in.real();
      s.sampling.top_k = in.next();
      s.seed = static_cast<uint64_t>(in.next());
      s.index = static_cast<uint64_t>(in.next());
      s.trace_logits = in.next() != 0;
    }
  }
  plan.expert_tables.resize(in.count());
  for (LayerSlotTable& t : plan.expert_tables) {
    t.layer = static_cast<int>(in.next());
    t.slot_experts.resize(in.count());
    for (int& e : t.slot_experts) e = static_cast<int>(in.next());
  }
  in.finish();
  return plan;
}

std::vector<int64_t> encode_result(const RankResult& r) {
  std::vector<int64_t> w{r.dp_rank, r.samples, static_cast<int64_t>(r.tokens.tokens.size())};
  w.insert(w.end(), r.tokens.tokens.begin(), r.tokens.tokens.end());
  w.push_back(static_cast<int64_t>(r.tokens.logits_hashes.size()));
  for (uint64_t h : r.tokens.logits_hashes) w.push_back(static_cast<int64_t>(h));
  w.push_back(static_cast<int64_t>(r.layer_expert_tokens.size()));
  for (const std::vector<int64_t>& layer : r.layer_expert_tokens) {
    w.push_back(static_cast<int64_t>(layer.size()));
    w.insert(w.end(), layer.begin(), layer.end());
  }
  w.push_back(static_cast<int64_t>(r.layer_rows.size()));
  w.insert(w.end(), r.layer_rows.begin(), r.layer_rows.end());
  w.push_back(r.moved_bytes);
  put_real(w, r.move_seconds);
  return w;
}

RankResult decode_result(const int64_t* wire, size_t size) {
  Reader in(wire, size);
  RankResult r;
  r.dp_rank = static_cast<int>(in.next());
  r.samples = in.next() != 0;
  r.tokens.tokens.resize(in.count());
  for (int32_t& t : r.tokens.tokens) t = static_cast<int32_t>(in.next());
  r.tokens.logits_hashes.resize(in.count());
  for (uint64_t& h : r.tokens.logits_hashes) h = static_cast<uint64_t>(in.next());
  r.layer_expert_tokens.resize(in.count());
  for (std::vector<int64_t>& layer : r.layer_expert_tokens) {
    layer.resize(in.count());
    for (int64_t& e : layer) e = in.next();
  }
  r.layer_rows.resize(in.count());
  for (int64_t& n : r.layer_rows) n = in.next();
  r.moved_bytes = in.next();
  r.move_seconds = in.real();
  in.finish();
  return r;
}

}  // namespace expar::serve
