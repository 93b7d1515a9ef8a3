// direct_front.h -- a model's native batching queue reached without Python (the C ABI's direct
// path, direct_api.h).
//
// With batching on, a blocking caller that goes through Python takes the GIL to queue its
// request and again to collect the answer: with many caller threads the GIL changes hands
// several times per request, each a sleep and a wake-up. The direct path queues the request
// bytes on the served version's Batcher and waits for its batch with no Python at all; Python
// keeps every decision: it publishes the lane of the version a plain call may take (or none:
// traced or logged models, a request shape the queue does not take) and serves whatever the
// direct path does not take.
//
// DirectLane: one version's door, in front of its Batcher (borrowed: the lane is closed, and
// every caller inside has left, before the Batcher is closed). An update closes it while it
// writes (callers then go through Python, which waits at the update gate), then opens it again.
// DirectFront: the lane a model's direct calls use now, replaced on every version swap.
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "batcher.h"
#include "direct_api.h"

namespace sp {

class DirectLane {
 public:
  explicit DirectLane(Batcher* batcher) : batcher_(batcher) {}
  DirectLane(const DirectLane&) = delete;
  DirectLane& operator=(const DirectLane&) = delete;

  // A caller comes in; false (it did not) while the lane is closed.
  bool enter();
  void exit();
  // No caller comes in any more; returns once every caller inside has left. Idempotent.
  void close();
  void open();
  Batcher& batcher() const { return *batcher_; }

 private:
  Batcher* const batcher_;
  std::atomic<int> inside_{0};
  std::atomic<bool> open_{true};
  std::mutex mutex_;
  std::condition_variable left_;
};

class DirectFront {
 public:
  // The lane direct calls take from now on (null: none; they go through Python).
  void publish(std::shared_ptr<DirectLane> lane);
  // See direct_api.h: 200 once `take` was given the response (and returned true), or 0: not
  // taken. `take` runs while the lane is held: it copies the response out.
  int serve(const void* data, size_t size, const std::function<bool(const std::string&)>& take);
  // The asynchronous serve (direct_api.h's submit): 1 when queued (`done` runs once, on a batch
  // thread, the lane held until it returned), 0 when not. `deadline`: CLOCK_MONOTONIC seconds,
  // <= 0: none. The front need not outlive the queued call.
  int submit(const void* data, size_t size, double deadline, sp_direct_done done, void* user);
  int64_t served() const { return counters_->served.load(std::memory_order_relaxed); }
  int64_t not_taken() const { return counters_->not_taken.load(std::memory_order_relaxed); }

 private:
  std::shared_ptr<DirectLane> lane();  // the published one
  struct Counters {
    std::atomic<int64_t> served{0}, not_taken{0};
  };
  std::mutex mutex_;
  std::shared_ptr<DirectLane> lane_;
  const std::shared_ptr<Counters> counters_ = std::make_shared<Counters>();  // shared with queued calls
};

// The table processor._native exports as the capsule SP_DIRECT_API_CAPSULE.
extern const sp_direct_api kDirectApi;

}  // namespace sp
