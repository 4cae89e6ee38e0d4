#pragma once
// EventOutbox: the events the engine produced, held until it hands them to their callbacks.
//
// Why hold them (issue 16): a callback is the edge's (the server copies the event and posts it to
// the request's strand, which takes locks and wakes an I/O thread). At 256 running requests,
// calling them as tokens were sampled took 640 of the 990 us between two steps (the GPU idle), in
// bench/engine_host_step_bench.cpp, as on the H200 through `ossrt serve`. On a backend with
// asynchronous steps (CUDA: run_step only enqueues) the engine now builds the step's events,
// plans and enqueues the next step, and only then flushes the outbox, while the device computes
// (Engine::execute). A synchronous backend (the CPU) has nothing running meanwhile: its events go at
// the end of their own step, so its streams are never a step late.
//
// What stays the same for a request: its events arrive in the order they were made, on the engine
// thread, and its final event is its last; every event made before the engine goes idle is
// delivered before it reports idle (drain() relies on it).
#include <memory>
#include <string>
#include <vector>

#include "engine/request.h"

namespace ossrt {

// Where a request's events go; shared by the sequence and the events waiting in the outbox, so a
// request that finishes (and whose sequence is freed) still has its last events delivered.
struct EventSink {
  EventCallback callback;
  std::string request_id;  // for the log line when the callback throws
};

class EventOutbox {
 public:
  void push(std::shared_ptr<const EventSink> sink, GenerationEvent event) {
    held_.push_back(Held{std::move(sink), std::move(event)});
  }
  bool empty() const { return held_.empty(); }
  // Calls each held event's callback in order; a callback that throws is logged and skipped.
  // Callbacks may call the engine's thread-safe API (submit, cancel, stats), not run_step.
  void flush();

 private:
  struct Held {
    std::shared_ptr<const EventSink> sink;
    GenerationEvent event;
  };
  std::vector<Held> held_, delivering_;  // two buffers, reused: no allocation per step for the list
};

}  // namespace ossrt
