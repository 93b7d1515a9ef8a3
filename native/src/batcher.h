// batcher.h -- server-side batching without Python on the request threads.
//
// enqueue() is called by request threads with the GIL released. It parses and checks the
// request (request.h) on the caller's thread, takes its rows from the model's RowBudget and
// queues it with the requests of the same kind (same inputs, same dimensions after the first,
// same outputs); the caller gets a Ticket and later wait()s on it, so one thread may queue many
// requests (the C ABI's batch_process) before it waits for any. A batch runs when it holds
// max_rows rows or timeout_us after its first request came, on one of `threads` threads, lane
// `thread index % lanes`; the callers wait without the GIL and wake with their responses.
//
// Two ways to run a batch:
// * an ONNX Runtime Engine (ort_engine.h): the inputs are converted on the callers' threads,
//   concatenated (padded to the next allowed size by repeating the first row), run in one Run,
//   every output split by rows and each PredictResponse written, all without Python; a failed
//   merged run is retried request by request, so only the culprit fails;
// * a Runner (any other engine): it gets the batch's request bytes and answers each with
//   response bytes, or leaves it unanswered (the caller then serves it another way).
//
// One queue per version: a Batcher belongs to one SessionGroup (a batch never mixes versions,
// and the Plan and Engine are that version's). It has no capacity of its own: every queue of a
// model, native or processor/batching/batcher.py (the reference, which serves what this path
// does not take), takes its rows from the model's one RowBudget, so the model's queue bound
// (max_enqueued_batches x max_batch_size rows) holds across all of them. Same settings,
// deadlines and drain on close() as the reference.
//
// Thread-safe. The Engine, Plan and RowBudget outlive the Batcher; a ticket's request buffer
// stays valid until the ticket is destroyed (the queue keeps views into it), and a ticket is
// destroyed only once answered (its deleter waits).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ort_engine.h"

namespace sp {

// One model's queue capacity in rows, shared by all its queues: a request takes its rows when it
// is queued and gives them back when its batch starts to run. Lock-free; thread-safe.
class RowBudget {
 public:
  explicit RowBudget(int64_t capacity) : capacity_(capacity) {}
  RowBudget(const RowBudget&) = delete;
  RowBudget& operator=(const RowBudget&) = delete;

  // Takes `rows` if they fit in what is left; false (nothing taken) if not.
  bool try_take(int64_t rows) {
    int64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (rows > capacity_ - used) return false;
    } while (!used_.compare_exchange_weak(used, used + rows, std::memory_order_acq_rel,
                                          std::memory_order_relaxed));
    return true;
  }
  void give(int64_t rows) { used_.fetch_sub(rows, std::memory_order_acq_rel); }
  int64_t used() const { return used_.load(std::memory_order_acquire); }
  int64_t capacity() const { return capacity_; }

 private:
  const int64_t capacity_;
  std::atomic<int64_t> used_{0};
};

struct BatchSettings {
  int64_t max_rows = 128;
  int64_t timeout_us = 1000;
  int threads = 2;
  std::vector<int64_t> allowed;   // allowed batch sizes, increasing, last == max_rows; empty: any
  std::vector<double> size_bounds, wait_bounds;  // histogram bounds (rows; seconds)
};

// Counters and cumulative histograms, as processor/batching/stats.py keeps them.
struct BatchStats {
  int64_t batches = 0, requests = 0, rows = 0, padding_rows = 0, isolated_retries = 0,
          rejected_queue_full = 0, expired = 0, queued_requests = 0, queued_rows = 0;
  std::vector<int64_t> size_counts, wait_counts;  // per bound, +Inf last
  double size_sum = 0, wait_sum = 0;
};

// One request of a batch handed to a Runner: its bytes, and where its answer goes.
struct BatchItem {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::string* out = nullptr;
  bool answered = false;  // set by the runner with *out holding the PredictResponse
};

// Runs a batch of requests of one kind on a lane; called on a batch thread.
using Runner = std::function<void(std::vector<BatchItem>& items, int lane)>;

class Batcher {
 public:
  // kNotTaken: the caller serves the request another way (invalid or rare requests, requests
  // that cannot merge, outputs this path does not write, engine errors: the reference path
  // reports them). kFull / kClosed: refused at once. kExpired: the deadline passed first.
  enum class Status { kOk, kNotTaken, kFull, kClosed, kExpired };

  // A queued request, owned by its caller. The deleter waits until it is answered, so the
  // queue never reads a freed request.
  struct Ticket;
  struct TicketDeleter {
    void operator()(Ticket* ticket) const;
  };
  using TicketPtr = std::unique_ptr<Ticket, TicketDeleter>;

  // Exactly one of `engine` and `runner`; `lanes`: the lanes the threads share; `budget`: the
  // model's queue capacity, shared with its other queues.
  Batcher(const ort::Engine* engine, Runner runner, int lanes, const Plan& plan, RowBudget& budget,
          BatchSettings settings);
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Queues the request in `data` (which must stay valid until the ticket is destroyed) and
  // returns its ticket with `status` kOk; else nullptr and why (kNotTaken, kFull, kClosed,
  // kExpired), at once. `deadline`: a CLOCK_MONOTONIC time in seconds (Python's
  // time.monotonic()); <= 0: none. `notify_fd` >= 0: an eventfd the batch thread adds 1 to once
  // the ticket is answered (an event loop waits on it instead of a thread on wait()); it must
  // stay open until the ticket is done.
  // `counted` false: a refusal (kFull, kExpired) is not counted in stats(): the caller hands
  // the request to another path that counts it when it refuses it too (the direct path).
  TicketPtr enqueue(const uint8_t* data, size_t size, double deadline, Status& status, int notify_fd = -1,
                    bool counted = true);

  // What runs once an asynchronous request is answered: its status (kOk, kNotTaken, kExpired)
  // and, with kOk, its PredictResponse (valid during the call only). On a batch thread; quick.
  using Done = std::function<void(Status status, const std::string& response)>;
  // enqueue() for a caller that does not wait: true (status kOk) when queued: the queue owns
  // the request from then on and runs `done` exactly once, on a batch thread (possibly before
  // enqueue_async has returned), then frees it; false (status says why) when not, and `done`
  // never runs. `data` must stay valid until `done` ran. Its refusals are not counted (see
  // enqueue's `counted`): its callers hand them on.
  bool enqueue_async(const uint8_t* data, size_t size, double deadline, Status& status, Done done);

  // Blocks until the ticket's batch ran: kOk (response() holds the PredictResponse), kNotTaken
  // (handed back: serve it another way) or kExpired. Any thread; may be called again.
  static Status wait(Ticket& ticket);
  // Whether the ticket is answered (wait() would return at once). Never blocks on the batch.
  static bool done(Ticket& ticket);
  static const std::string& response(const Ticket& ticket);

  // Refuses new requests, runs the queued ones, joins the threads. Idempotent.
  void close();

  BatchStats stats() const;

 private:
  using Request = Ticket;
  struct Batch;

  void loop(int index);
  std::unique_ptr<Batch> next_batch();
  void execute(Batch& batch, int index);
  bool run_merged(Batch& batch, int lane);
  void run_with_runner(Batch& batch, int lane);
  // enqueue() and enqueue_async(): with `done`, a queued ticket is the queue's (nullptr back).
  TicketPtr enqueue_with(const uint8_t* data, size_t size, double deadline, Status& status, int notify_fd,
                         bool counted, Done done);
  void finish(Request& r, Status status);
  int64_t padded_rows(int64_t rows) const;

  const ort::Engine* engine_;
  const Runner runner_;
  const int lanes_;
  const Plan& plan_;
  RowBudget& budget_;
  const BatchSettings settings_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::map<std::string, std::unique_ptr<Batch>> open_;
  std::deque<std::unique_ptr<Batch>> ready_;
  std::map<std::string, bool> unsplittable_;
  bool closing_ = false;
  BatchStats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace sp
