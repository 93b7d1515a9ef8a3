// grpc_server.h -- the native gRPC server (issue 50): gRPC's C++ library serving the gRPC port,
// our ProcessorService/Predict, TF Serving's PredictionService/Predict and KServe v2's ModelInfer
// answered on the direct path with no Python and no GIL, every other call handed to the Python
// handlers through one generic bridge.
//
// Server: a grpc::Server with one CallbackGenericService (raw ByteBuffers, no generated stubs).
// Each call gets a Reactor (reactor.h); once its request message has arrived it is either
//   * served on the direct path: a Predict-like method Python serves (DirectApi) to a model Python
//     has published a Route for (a batching model whose plan is plain: native/src/direct_front.h),
//     naming no version or label (TF Serving: no signature but the default; v2: the route's
//     version or none), while the server is not draining: the request bytes (TF Serving's and
//     v2's transcoded into ours first: transcode.h, which hands anything uncommon on) are queued
//     on the model's batching queue through the C table of direct_api.h (its ABI 2 submit(),
//     which returns at once) right on the gRPC thread, with the call's deadline; the batch thread
//     that ran the batch completes the call (StartWriteAndFinish), so no thread waits for a batch.
//     The answer goes back (transcoded into the method's response) with `x-request-id` (trailing)
//     and, for ours, `x-model-version` (initial), as Python answers each; a call whose deadline
//     passed before its batch ran is dropped unrun and answered
//     DEADLINE_EXCEEDED with Python's message. Anything the direct path does not take (submit()
//     answers 0, or hands the call back: a request its queue cannot merge) continues on the
//     bridge, so Python answers it exactly, its errors included;
//   * or bridged: a BridgeCall is posted on the event queue (an eventfd tells Python's event loop)
//     and Python answers it with BridgeCall::finish (unary) or write() then finish() (server
//     streaming: the health service's Watch).
// The server counts what it answered itself per (model, version, api) (RouteStats: count, latency
// histogram on Python's buckets) and, when asked, keeps an access record per answer; Python folds
// both into its metrics and access log.
//
// Nothing here includes Python.h: the bindings (module.cc) own every Python object; a Route's
// `owner` (the capsule that keeps the DirectFront alive) is released through its `release`,
// which the bindings set (they decref it under the GIL later).
//
// Thread-safety: every public method may be called from any thread unless it says otherwise.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../src/direct_api.h"

namespace spg {

using Metadata = std::vector<std::pair<std::string, std::string>>;

// A channel argument of the server (server/grpc/server.py grpc_options: ints and strings).
struct ChannelArg {
  std::string key;
  bool is_int = true;
  long long int_value = 0;
  std::string str_value;
};

struct Options {
  std::vector<ChannelArg> channel_args;
  int max_concurrent_rpcs = 1000;      // beyond: RESOURCE_EXHAUSTED, as grpcio's server
  std::vector<double> latency_buckets; // upper bounds (seconds) of the latency histogram
  // gRPC's own threads (its pollers, callback and executor threads, made by grpc_init and the
  // server's start) are made under SCHED_BATCH: a network read that wakes one does not preempt
  // the engine's batch on the core (they inherit it from the thread that makes them)
  bool io_threads_batch = false;
};

// The methods the direct path serves (their metrics' api names: kDirectApiNames).
enum DirectApi { kEasPredict = 0, kTfsPredict = 1, kV2Infer = 2, kDirectApis = 3 };
extern const char* const kDirectMethods[kDirectApis];  // "/tensorflow.eas.ProcessorService/Predict", ...
extern const char* const kDirectApiNames[kDirectApis];  // "predict", "tfs_predict", "v2_infer"

// What one (model, version) answered on the direct path for one api with one status code ("OK",
// or "DEADLINE_EXCEEDED": dropped by its queue), since the last fold; `message`: the error's.
struct RouteStats {
  RouteStats(std::string m, std::string l, std::string a, std::string c, std::string msg, size_t buckets)
      : model(std::move(m)), label(std::move(l)), api(std::move(a)), code(std::move(c)), message(std::move(msg)),
        counts(buckets + 1) {}
  const std::string model, label, api, code, message;
  std::atomic<uint64_t> count{0}, sum_ns{0};
  std::vector<std::atomic<uint64_t>> counts;  // per bucket (not cumulative); the last: +Inf
};

// One model's direct path as Python published it: a DirectFront (borrowed; `owner` keeps it
// alive), the version its lane serves and what TF Serving's answers name.
struct Route {
  void* front = nullptr;
  std::string version;    // its number: x-model-version, v2's model_version
  int64_t number = 0;     // the same, TF Serving's model_spec.version
  std::string signature;  // the default signature's name (TF Serving's model_spec.signature_name)
  bool tensor_content = false;  // TF Serving's outputs as tensor_content (the model's config)
  // per DirectApi: answered; dropped by the queue (DEADLINE_EXCEEDED)
  std::shared_ptr<RouteStats> stats[kDirectApis], expired[kDirectApis];
  void* owner = nullptr;
  std::function<void(void*)> release;
  ~Route() {
    if (owner != nullptr && release) release(owner);
  }
};

struct AccessRecord {
  std::shared_ptr<RouteStats> stats;  // model and version label
  double seconds;
  std::string request_id;
};

class Reactor;
class Server;

// gRPC's version string ("1.51.1").
const char* grpc_version();

// One call handed to Python (see the file comment). Python's actions on it (write, finish,
// auth_context) come from its event loop's thread only, under the GIL (never concurrently), and
// are refused (false / empty) once finish() was called: the reactor lives until its Finish.
class BridgeCall {
 public:
  BridgeCall(uint64_t id, Reactor* reactor) : id(id), reactor_(reactor) {}
  const uint64_t id;
  std::string method, peer, request;
  Metadata metadata;
  double deadline_remaining = -1;  // seconds left when handed over; < 0: no deadline

  // One message of a server-streaming answer (initial metadata first, once); an event
  // (kWriteDone) follows when it was sent or failed. False: the call is finished.
  bool write(std::string data, const Metadata& initial);
  // The status, the response (unary: `has_response`), the metadata. False: finished already.
  bool finish(int code, const std::string& details, bool has_response, std::string response,
              const Metadata& initial, const Metadata& trailing);
  // The peer's authentication properties (TLS: x509_common_name, ...); empty when none.
  std::vector<std::pair<std::string, std::vector<std::string>>> auth_context();
  bool finished() const { return finished_.load(std::memory_order_acquire); }

 private:
  Reactor* const reactor_;
  std::atomic<bool> finished_{false};
};

struct Event {
  enum Kind { kNew = 0, kWriteDone = 1, kCancel = 2 };
  Kind kind;
  uint64_t id;
  std::shared_ptr<BridgeCall> call;  // kNew
  bool ok = true;
};

struct Tls {
  std::string key, cert_chain, client_ca;
  bool require_client_cert = false;
};

class Server {
 public:
  explicit Server(Options options);
  ~Server();

  // Before start(): listen on `address` ("host:port", "[::1]:port", "unix:/path"), TLS with
  // `tls` (its material replaced later by set_tls), else plaintext; the bound port (0: failed).
  int add_port(const std::string& address, const Tls* tls);
  // Start serving; false (and `error`) when gRPC could not start.
  bool start(std::string& error);
  // After start(): the port the i-th add_port bound (0: none).
  int bound_port(size_t i) const;
  // Stop accepting calls, give those in progress until `grace_seconds` (then cancel them).
  // Blocks until every call is done: bridged ones finish through Python
  // (cancelled at the grace's end); any Python has not finished kShutdownSlack later (its loop
  // gone, a handler ignoring its cancellation) is finished here, UNAVAILABLE. Idempotent.
  void shutdown(double grace_seconds);
  static constexpr double kShutdownSlack = 2.0;

  // New TLS material for new handshakes (the reload of server/tls.py).
  void set_tls(const Tls& tls);
  // The direct path's table (direct_api.h); null: no direct path.
  void set_direct_api(const sp_direct_api* api) { api_.store(api, std::memory_order_release); }
  // Model `model`'s route (null: none, its calls are bridged).
  void set_route(const std::string& model, std::shared_ptr<Route> route);
  // The model a Predict naming none runs on ("": none; Python's rule: the one model served).
  void set_sole_model(const std::string& model);
  // Which DirectApis may take the direct path (bit i: kDirectMethods[i]): those Python serves.
  void set_direct_methods(unsigned mask) { direct_methods_.store(mask, std::memory_order_release); }
  // The DirectApi of a method path that may take the direct path now; -1: none.
  int direct_api_of(const std::string& method) const;
  void set_draining(bool draining) { draining_.store(draining, std::memory_order_release); }
  void set_access_log(bool on) { access_log_.store(on, std::memory_order_release); }
  // The stats object of (model, label, api, code): made once, kept (folded by Python);
  // `message`: the error's (a code but OK).
  std::shared_ptr<RouteStats> stats_of(const std::string& model, const std::string& label, const std::string& api,
                                       const std::string& code, const std::string& message);
  std::vector<std::shared_ptr<RouteStats>> all_stats();
  std::vector<AccessRecord> take_access_records();

  int event_fd() const { return event_fd_; }
  // Every event posted since the last call (read the eventfd first).
  std::vector<Event> take_events();
  // Wait (up to `seconds`) until no call is on the direct path any more; false: some still are.
  // Call it once draining: no new call takes the direct path then.
  bool wait_direct_idle(double seconds);
  int64_t direct_served() const { return direct_served_.load(std::memory_order_relaxed); }
  int64_t bridged() const { return bridged_.load(std::memory_order_relaxed); }

  // --- for the reactors --------------------------------------------------------------------
  void post(Event event);
  bool enter_call();  // false: over max_concurrent_rpcs
  void exit_call() { active_.fetch_sub(1, std::memory_order_relaxed); }
  bool enter_direct();  // false: draining (the call is bridged, where the drain gate answers it)
  void exit_direct();
  std::shared_ptr<Route> route_for(const std::string& model);
  const sp_direct_api* direct_api() const { return api_.load(std::memory_order_acquire); }
  bool draining() const { return draining_.load(std::memory_order_acquire); }
  bool access_log() const { return access_log_.load(std::memory_order_acquire); }
  uint64_t next_call_id() { return next_id_.fetch_add(1, std::memory_order_relaxed); }
  std::string new_request_id();
  void record(const std::shared_ptr<RouteStats>& stats, std::chrono::steady_clock::duration took,
              std::string request_id);
  void count_direct() { direct_served_.fetch_add(1, std::memory_order_relaxed); }
  void count_bridged() { bridged_.fetch_add(1, std::memory_order_relaxed); }
  void add_bridged(const std::shared_ptr<BridgeCall>& call);
  void remove_bridged(uint64_t id);

  struct Impl;  // gRPC's objects (grpc_server.cc)

 private:
  Options options_;
  std::unique_ptr<Impl> impl_;
  std::atomic<const sp_direct_api*> api_{nullptr};
  std::mutex routes_mutex_;
  std::unordered_map<std::string, std::shared_ptr<Route>> routes_;
  std::string sole_model_;
  std::mutex stats_mutex_;
  std::unordered_map<std::string, std::shared_ptr<RouteStats>> stats_;
  std::mutex access_mutex_;
  std::vector<AccessRecord> access_;
  std::mutex live_mutex_;  // the bridged calls not done yet (shutdown's last resort)
  std::unordered_map<uint64_t, std::weak_ptr<BridgeCall>> live_;
  std::mutex events_mutex_;
  std::vector<Event> events_;
  int event_fd_ = -1;
  std::atomic<bool> draining_{false}, access_log_{false}, stopped_{false};
  std::atomic<unsigned> direct_methods_{0};
  std::atomic<int> active_{0}, direct_inflight_{0};
  std::mutex idle_mutex_;
  std::condition_variable idle_;
  std::atomic<uint64_t> next_id_{1}, next_rid_{0};
  std::atomic<int64_t> direct_served_{0}, bridged_{0};
  uint32_t rid_prefix_ = 0;
};

}  // namespace spg
