#pragma once
// The three schedules of moe/waves.hpp as one runner, shared by the MoE layer's forward and backward.
// A pass of n waves is three kinds of step per wave:
//   bring(i)    the rows wave i's experts need   (forward: dispatch;          backward: combine backward)
//   compute(i)  the experts of wave i            (forward: expert MLP;        backward: expert backward)
//   send(i)     the rows wave i's experts made   (forward: combine gather;    backward: dispatch backward)
// no-wave and wave-sequential run bring, compute, send per wave on the calling thread. wave-overlapped runs
// every bring and send on a communication thread in the order b0, b1, s0, b2, s1, ..., s(n-1) (dispatch of
// wave i+1 and combine of wave i-1 while the experts compute wave i), and compute(i) on the calling thread as
// soon as bring(i) is done; send(i) waits for compute(i). Every rank runs the same order, so the
// collectives inside bring and send match across ranks. The sequential schedules book the barrier waits of
// the bound phase timer (phase::kWait, with sync_comm: every communication phase starts together with its
// peers) as `wait`, not as communication.
//
// The communication thread gets the caller's memory tracker and one compute thread (so the codecs' OpenMP
// loops stay on it); no phase timer is bound there (phase timers are per thread), its busy time is
// reported in WaveTimes. An exception on either side stops both (the other side is released, not left
// waiting) and is rethrown here; peers blocked in a collective are woken by the backend's failure handling.
//
// A WaveObserver bound to the calling thread sees every step begin and end, from the thread that runs it
// (the overlapped schedule hands the caller's observer to its communication thread): how a test checks the
// order of events, which bit-identical outputs cannot show. Unbound, a step costs one null check.
#include <functional>

#include "expar/moe/waves.hpp"

namespace expar {

// Seconds of one pass (one rank). comm: bring + send (and, for the layer, the pass's set-up and merge);
// experts: compute; wall: the whole pass; wait: the sequential schedules' booked barrier waits (see above),
// the communication thread's waits for compute when overlapped (its barriers inside bring/send, waiting
// for slower peers, stay in comm). Sequential: comm + experts + wait = wall (up to the clock reads);
// overlapped: wall < comm + experts of the sequential run is eq. 10.
struct WaveTimes {
  double comm = 0.0, experts = 0.0, wall = 0.0, wait = 0.0;
};

enum class WaveStep { Bring, Compute, Send };

const char* wave_step_name(WaveStep step);

// Called from the thread that runs the step, right before it starts (begin) and right after it returns
// (end; not after a step that throws). May block: the step waits for it, which lets a test hold one side
// of the overlapped schedule until the other side has reached a given step.
class WaveObserver {
 public:
  virtual ~WaveObserver() = default;
  virtual void begin(WaveStep step, int wave) = 0;
  virtual void end(WaveStep step, int wave) = 0;
};

// Binds `observer` to this thread for the binding's lifetime (restoring the previous one after).
class WaveObserverBinding {
 public:
  explicit WaveObserverBinding(WaveObserver& observer);
  ~WaveObserverBinding();
  WaveObserverBinding(const WaveObserverBinding&) = delete;
  WaveObserverBinding& operator=(const WaveObserverBinding&) = delete;

 private:
  WaveObserver* previous_;
};

// The observer bound to this thread, or nullptr.
WaveObserver* bound_wave_observer();

WaveTimes run_wave_schedule(WaveSchedule schedule, int waves, const std::function<void(int)>& bring,
                            const std::function<void(int)>& compute, const std::function<void(int)>& send);

}  // namespace expar
