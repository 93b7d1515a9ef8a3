// batcher.cc -- see batcher.h.
#include "batcher.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "response.h"

namespace sp {

using ort::Engine;
using ort::Value;
using ort::input_element_type;
namespace {

using Clock = std::chrono::steady_clock;

// CLOCK_MONOTONIC in seconds: the clock of Python's time.monotonic(), which deadlines use.
double monotonic_now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

void observe(std::vector<int64_t>& counts, const std::vector<double>& bounds, double& sum, double value) {
  size_t i = size_t(std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin());
  counts[i] += 1;
  sum += value;
}

void append_int(std::string& key, int64_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); }

}  // namespace

struct Batcher::Ticket {
  const uint8_t* data = nullptr;
  size_t size = 0;
  ParsedRequest parsed;
  std::vector<int> fetch;
  std::vector<int> order;                    // parsed.inputs positions in signature order
  std::vector<std::vector<uint64_t>> values; // per parsed input, converted (8-byte aligned)
  int64_t rows = 0;
  double deadline = 0;
  Clock::time_point enqueued;
  std::string out;
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  Status status = Status::kNotTaken;
  int notify_fd = -1;  // an eventfd written once the ticket is answered (an event loop's), or -1
  Done on_done;        // set: the queue owns the ticket (enqueue_async); finish() runs it, then frees it
};

struct Batcher::Batch {
  std::string key;
  Clock::time_point opened;
  std::vector<Request*> requests;
  int64_t rows = 0;
};

Batcher::Batcher(const Engine* engine, Runner runner, int lanes, const Plan& plan, RowBudget& budget,
                 BatchSettings settings)
    : engine_(engine), runner_(std::move(runner)), lanes_(lanes), plan_(plan), budget_(budget),
      settings_(std::move(settings)) {
  stats_.size_counts.assign(settings_.size_bounds.size() + 1, 0);
  stats_.wait_counts.assign(settings_.wait_bounds.size() + 1, 0);
  for (int i = 0; i < settings_.threads; ++i) threads_.emplace_back(&Batcher::loop, this, i);
}

Batcher::~Batcher() { close(); }

void Batcher::TicketDeleter::operator()(Ticket* ticket) const {
  if (ticket->enqueued != Clock::time_point()) wait(*ticket);  // queued: the queue reads it until answered
  delete ticket;
}

Batcher::TicketPtr Batcher::enqueue(const uint8_t* data, size_t size, double deadline, Status& status,
                                    int notify_fd, bool counted) {
  return enqueue_with(data, size, deadline, status, notify_fd, counted, Done());
}

bool Batcher::enqueue_async(const uint8_t* data, size_t size, double deadline, Status& status, Done done) {
  enqueue_with(data, size, deadline, status, -1, false, std::move(done));
  return status == Status::kOk;
}

Batcher::TicketPtr Batcher::enqueue_with(const uint8_t* data, size_t size, double deadline, Status& status,
                                         int notify_fd, bool counted, Done done) {
  status = Status::kNotTaken;
  TicketPtr ticket(new Ticket);
  Request& r = *ticket;
  r.data = data;
  r.size = size;
  r.deadline = deadline;
  r.notify_fd = notify_fd;
  if (!parse_request(data, size, plan_, r.parsed) || !fetch_list(plan_, r.parsed, r.fetch)) return nullptr;
  const size_t n_in = r.parsed.inputs.size();
  if (n_in == 0) return nullptr;
  r.order.resize(n_in);
  for (size_t i = 0; i < n_in; ++i) r.order[i] = int(i);
  std::sort(r.order.begin(), r.order.end(),
            [&](int a, int b) { return r.parsed.inputs[a].spec < r.parsed.inputs[b].spec; });
  // The kind of request: which inputs with which dimensions after the first, which outputs.
  std::string key;
  r.values.resize(n_in);
  for (int i : r.order) {
    const ParsedInput& in = r.parsed.inputs[i];
    const InputSpec& spec = plan_.inputs[in.spec];
    if (in.shape.empty() || (engine_ != nullptr && input_element_type(spec) == 0)) return nullptr;
    if (r.rows == 0) r.rows = in.shape[0];
    if (in.shape[0] != r.rows) return nullptr;
    append_int(key, in.spec);
    append_int(key, int64_t(in.shape.size()));
    for (size_t d = 1; d < in.shape.size(); ++d) append_int(key, in.shape[d]);
    if (engine_ == nullptr) continue;  // a runner converts the values itself
    size_t bytes = size_t(in.count) * value_itemsize(spec);
    r.values[i].resize(bytes / 8 + 1);
    if (!fill_values(plan_, in, r.values[i].data(), data + size)) return nullptr;
  }
  if (r.rows <= 0 || r.rows > settings_.max_rows) return nullptr;
  append_int(key, -1);
  for (int k : r.fetch) append_int(key, k);

  std::lock_guard<std::mutex> lock(mutex_);
  if (closing_) {
    status = Status::kClosed;
    return nullptr;
  }
  if (unsplittable_.count(key)) return nullptr;
  if (deadline > 0 && monotonic_now() >= deadline) {
    if (counted) stats_.expired += 1;
    status = Status::kExpired;
    return nullptr;
  }
  if (!budget_.try_take(r.rows)) {  // the model's bound, across all its queues
    if (counted) stats_.rejected_queue_full += 1;
    status = Status::kFull;
    return nullptr;
  }
  r.enqueued = Clock::now();
  bool wake = false;
  auto it = open_.find(key);
  if (it != open_.end() && it->second->rows + r.rows > settings_.max_rows) {
    ready_.push_back(std::move(it->second));
    open_.erase(it);
    it = open_.end();
    wake = true;
  }
  if (it == open_.end()) {
    auto batch = std::make_unique<Batch>();
    batch->key = key;
    batch->opened = r.enqueued;
    it = open_.emplace(key, std::move(batch)).first;
    wake = true;  // an idle thread starts this batch's timeout
  }
  Batch& batch = *it->second;
  batch.requests.push_back(&r);
  batch.rows += r.rows;
  stats_.queued_rows += r.rows;
  stats_.queued_requests += 1;
  if (batch.rows >= settings_.max_rows) {
    ready_.push_back(std::move(it->second));
    open_.erase(it);
    wake = true;
  }
  if (wake) wake_.notify_one();
  status = Status::kOk;
  if (done) {  // the queue's from now on: released before the lock is (a batch thread frees it)
    r.on_done = std::move(done);
    ticket.release();
  }
  return ticket;
}

Batcher::Status Batcher::wait(Ticket& r) {
  std::unique_lock<std::mutex> lock(r.mutex);
  r.cv.wait(lock, [&] { return r.done; });
  return r.status;
}

bool Batcher::done(Ticket& r) {
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.done;
}

const std::string& Batcher::response(const Ticket& ticket) { return ticket.out; }

int64_t Batcher::padded_rows(int64_t rows) const {
  for (int64_t size : settings_.allowed)
    if (size >= rows) return size;
  return rows;
}

void Batcher::finish(Request& r, Status status) {
  if (r.on_done) {  // nobody waits: the queue owns it
    r.on_done(status, r.out);
    delete &r;
    return;
  }
  std::lock_guard<std::mutex> lock(r.mutex);  // the caller may free r as soon as it is released
  r.status = status;
  r.done = true;
  r.cv.notify_one();
  if (r.notify_fd >= 0) {  // under the lock: the waiter keeps the fd open while it has tickets
    const uint64_t one = 1;
    ssize_t written;
    do {
      written = ::write(r.notify_fd, &one, sizeof one);
    } while (written < 0 && errno == EINTR);  // EAGAIN: the counter is full, a wake-up is due anyway
  }
}

void Batcher::loop(int index) {
  for (;;) {
    std::unique_ptr<Batch> batch = next_batch();
    if (!batch) return;
    execute(*batch, index);
  }
}

std::unique_ptr<Batcher::Batch> Batcher::next_batch() {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto timeout = std::chrono::microseconds(settings_.timeout_us);
  std::unique_ptr<Batch> batch;
  for (;;) {
    if (!ready_.empty()) {
      batch = std::move(ready_.front());
      ready_.pop_front();
      break;
    }
    if (!open_.empty()) {
      auto oldest = std::min_element(open_.begin(), open_.end(), [](const auto& a, const auto& b) {
        return a.second->opened < b.second->opened;
      });
      auto due = oldest->second->opened + timeout;
      if (!closing_ && Clock::now() < due) {
        wake_.wait_until(lock, due);
        continue;
      }
      batch = std::move(oldest->second);
      open_.erase(oldest);
      break;
    }
    if (closing_) return nullptr;
    wake_.wait(lock);
  }
  stats_.queued_rows -= batch->rows;
  stats_.queued_requests -= int64_t(batch->requests.size());
  budget_.give(batch->rows);
  if (!ready_.empty() || !open_.empty()) wake_.notify_one();  // more work: another idle thread looks
  return batch;
}

void Batcher::execute(Batch& batch, int index) {
  const double now = monotonic_now();
  const auto started = Clock::now();
  std::vector<Request*> live;
  int64_t expired = 0;
  for (Request* r : batch.requests) {
    if (r->deadline > 0 && now >= r->deadline) {
      ++expired;
      finish(*r, Status::kExpired);
    } else {
      live.push_back(r);
    }
  }
  batch.requests = live;
  batch.rows = 0;
  for (Request* r : live) batch.rows += r->rows;
  const int64_t padded = padded_rows(batch.rows);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.expired += expired;
    if (!live.empty()) {
      stats_.batches += 1;
      stats_.requests += int64_t(live.size());
      stats_.rows += batch.rows;
      stats_.padding_rows += padded - batch.rows;
      observe(stats_.size_counts, settings_.size_bounds, stats_.size_sum, double(batch.rows));
      for (Request* r : live)
        observe(stats_.wait_counts, settings_.wait_bounds, stats_.wait_sum,
                std::chrono::duration<double>(started - r->enqueued).count());
    }
  }
  if (live.empty()) return;
  const int lane = index % lanes_;
  if (engine_ == nullptr) {
    run_with_runner(batch, lane);
    return;
  }
  if (run_merged(batch, lane)) return;
  if (live.size() > 1) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.isolated_retries += int64_t(live.size());
  }
  // Only the culprit may fail: each request again, alone (its errors are the reference's).
  for (Request* r : live) {
    std::string error;
    Engine::Result result = engine_->serve(plan_, lane, r->data, r->size, r->out, error);
    finish(*r, result == Engine::Result::kOk ? Status::kOk : Status::kNotTaken);
  }
}

bool Batcher::run_merged(Batch& batch, int lane) {
  const std::vector<Request*>& live = batch.requests;
  const int64_t padded = padded_rows(batch.rows);
  const Request& first = *live.front();
  const size_t n_in = first.order.size();
  std::vector<std::vector<uint64_t>> buffers(n_in);
  std::vector<const char*> names(n_in);
  std::vector<Value*> inputs(n_in, nullptr);
  std::vector<Value*> outputs;
  struct Release {  // inputs and outputs go back to ONNX Runtime on every return
    const Engine& e;
    std::vector<Value*>& a;
    std::vector<Value*>& b;
    ~Release() {
      for (Value* v : a) e.release(v);
      for (Value* v : b) e.release(v);
    }
  } release{*engine_, inputs, outputs};

  for (size_t j = 0; j < n_in; ++j) {
    const ParsedInput& in = first.parsed.inputs[first.order[j]];
    const InputSpec& spec = plan_.inputs[in.spec];
    const size_t row_bytes = size_t(in.count / first.rows) * value_itemsize(spec);
    std::vector<uint64_t>& buffer = buffers[j];
    buffer.resize((size_t(padded) * row_bytes) / 8 + 1);
    char* dst = reinterpret_cast<char*>(buffer.data());
    size_t at = 0;
    for (const Request* r : live) {
      const size_t bytes = size_t(r->rows) * row_bytes;
      std::memcpy(dst + at, r->values[r->order[j]].data(), bytes);
      at += bytes;
    }
    for (int64_t p = batch.rows; p < padded; ++p, at += row_bytes) std::memcpy(dst + at, dst, row_bytes);
    std::vector<int64_t> shape = in.shape;
    shape[0] = padded;
    inputs[j] = engine_->tensor(buffer.data(), size_t(padded) * row_bytes, shape, input_element_type(spec));
    if (inputs[j] == nullptr) return false;
    names[j] = engine_->input_name(in.spec).c_str();
  }
  std::string error;
  if (engine_->run(lane, names.data(), inputs.data(), n_in, first.fetch, outputs, error) != Engine::Result::kOk)
    return false;
  std::vector<Output> merged(outputs.size());
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!engine_->describe(outputs[k], merged[k])) return false;
    if (merged[k].shape.empty() || merged[k].shape[0] != padded) {  // outputs not per row
      std::lock_guard<std::mutex> lock(mutex_);
      unsplittable_[batch.key] = true;
      return false;
    }
  }
  int64_t start = 0;
  for (Request* r : live) {
    std::vector<Output> own(merged.size());
    for (size_t k = 0; k < merged.size(); ++k) {
      const Output& m = merged[k];
      const size_t row_elems = m.count / size_t(padded);
      Output& o = own[k];
      o.key = output_key(plan_, r->parsed, r->fetch, k);
      o.dtype = m.dtype;
      o.elem = m.elem;
      o.shape = m.shape;
      o.shape[0] = r->rows;
      o.data = static_cast<const char*>(m.data) + size_t(start) * row_elems * elem_size(m.elem);
      o.count = size_t(r->rows) * row_elems;
    }
    start += r->rows;
    r->out.resize(response_size(own));
    write_response(own, reinterpret_cast<uint8_t*>(r->out.data()));
    finish(*r, Status::kOk);
  }
  return true;
}

void Batcher::run_with_runner(Batch& batch, int lane) {
  std::vector<BatchItem> items(batch.requests.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const Request& r = *batch.requests[i];
    items[i].data = r.data;
    items[i].size = r.size;
    items[i].out = &batch.requests[i]->out;
  }
  runner_(items, lane);
  for (size_t i = 0; i < items.size(); ++i)
    finish(*batch.requests[i], items[i].answered ? Status::kOk : Status::kNotTaken);
}

void Batcher::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_)
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
}

BatchStats Batcher::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace sp
