// direct_front.cc -- see direct_front.h.
#include "direct_front.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

namespace sp {

bool DirectLane::enter() {
  inside_.fetch_add(1, std::memory_order_seq_cst);
  if (open_.load(std::memory_order_seq_cst)) return true;
  exit();  // closed: close() may be waiting for this count to drop
  return false;
}

void DirectLane::exit() {
  if (inside_.fetch_sub(1, std::memory_order_seq_cst) == 1 && !open_.load(std::memory_order_seq_cst)) {
    std::lock_guard<std::mutex> lock(mutex_);  // under the lock: close() cannot miss the wake-up
    left_.notify_all();
  }
}

void DirectLane::close() {
  open_.store(false, std::memory_order_seq_cst);
  std::unique_lock<std::mutex> lock(mutex_);
  left_.wait(lock, [&] { return inside_.load(std::memory_order_seq_cst) == 0; });
}

void DirectLane::open() { open_.store(true, std::memory_order_seq_cst); }

void DirectFront::publish(std::shared_ptr<DirectLane> lane) {
  std::lock_guard<std::mutex> lock(mutex_);
  lane_ = std::move(lane);
}

std::shared_ptr<DirectLane> DirectFront::lane() {
  std::lock_guard<std::mutex> lock(mutex_);
  return lane_;
}

int DirectFront::serve(const void* data, size_t size, const std::function<bool(const std::string&)>& take) {
  std::shared_ptr<DirectLane> lane = this->lane();
  int status = 0;
  if (lane && size > 0 && lane->enter()) {
    {
      Batcher::Status queued;
      Batcher::TicketPtr ticket =  // a refusal goes on to Python, which counts it
          lane->batcher().enqueue(static_cast<const uint8_t*>(data), size, 0, queued, -1, false);
      if (ticket && Batcher::wait(*ticket) == Batcher::Status::kOk && take(Batcher::response(*ticket)))
        status = 200;
    }  // the ticket is gone (answered) before the lane is left
    lane->exit();
  }
  (status == 200 ? counters_->served : counters_->not_taken).fetch_add(1, std::memory_order_relaxed);
  return status;
}

int DirectFront::submit(const void* data, size_t size, double deadline, sp_direct_done done, void* user) {
  std::shared_ptr<DirectLane> lane = this->lane();
  if (!lane || size == 0 || !lane->enter()) {
    counters_->not_taken.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  // The counters live in the front, which the caller may release once `done` ran: shared with
  // the completion instead.
  std::shared_ptr<Counters> counters = counters_;
  Batcher::Status queued;
  bool ok = lane->batcher().enqueue_async(
      static_cast<const uint8_t*>(data), size, deadline, queued,
      [lane, counters, done, user](Batcher::Status status, const std::string& response) {
        if (status == Batcher::Status::kOk) {
          counters->served.fetch_add(1, std::memory_order_relaxed);
          done(user, 200, response.data(), int(response.size()));
        } else if (status == Batcher::Status::kExpired) {  // dropped unrun, counted by the queue
          done(user, 504, nullptr, 0);
        } else {
          counters->not_taken.fetch_add(1, std::memory_order_relaxed);
          done(user, 0, nullptr, 0);
        }
        lane->exit();  // after done: an update waits for the answers it did not let out yet
      });
  if (!ok) {
    lane->exit();
    counters_->not_taken.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  return 1;
}

namespace {
int submit_front(void* front, const void* data, int size, double deadline, sp_direct_done done, void* user) {
  if (size <= 0 || done == nullptr) return 0;
  return static_cast<DirectFront*>(front)->submit(data, size_t(size), deadline, done, user);
}

int serve_front(void* front, const void* data, int size, void** out, int* out_size) {
  if (size <= 0) return 0;
  return static_cast<DirectFront*>(front)->serve(data, size_t(size), [&](const std::string& response) {
    void* copy = std::malloc(response.empty() ? 1 : response.size());  // the host frees it
    if (copy == nullptr) return false;
    std::memcpy(copy, response.data(), response.size());
    *out = copy;
    *out_size = int(response.size());
    return true;
  });
}
}  // namespace

const sp_direct_api kDirectApi = {SP_DIRECT_ABI, &serve_front, &submit_front};

}  // namespace sp
