// grpc_server.cc -- see grpc_server.h.
#include "grpc_server.h"

#include "transcode.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

namespace spg {

namespace {

constexpr size_t kMaxAccessRecords = 1 << 17;  // beyond, until Python's next fold: not logged

bool sane_request_id(grpc::string_ref id) {  // server/logs.py _VALID_ID
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '-'))
      return false;
  }
  return true;
}

std::string str(grpc::string_ref s) { return std::string(s.data(), s.size()); }

// The TLS material every TLS listener serves, replaced by set_tls; each listener's fetcher keeps
// the generation it handed to gRPC (gRPC asks on every handshake: one comparison).
struct TlsSource {
  std::mutex mutex;
  Tls tls;
  uint64_t generation = 1;
};

struct TlsFetcher {
  std::shared_ptr<TlsSource> source;
  uint64_t served = 0;
};

grpc_ssl_certificate_config_reload_status fetch_tls(void* user, grpc_ssl_server_certificate_config** config) {
  auto* fetcher = static_cast<TlsFetcher*>(user);
  TlsSource& source = *fetcher->source;
  std::lock_guard<std::mutex> lock(source.mutex);
  if (fetcher->served == source.generation) return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
  grpc_ssl_pem_key_cert_pair pair{source.tls.key.c_str(), source.tls.cert_chain.c_str()};
  *config = grpc_ssl_server_certificate_config_create(
      source.tls.client_ca.empty() ? nullptr : source.tls.client_ca.c_str(), &pair, 1);  // copies
  if (*config == nullptr) return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
  fetcher->served = source.generation;
  return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
}

// gRPC's dynamic SSL server credentials (what grpcio's dynamic_ssl_server_credentials makes),
// which the C++ API does not offer: the C core's credentials behind grpc::ServerCredentials.
class CoreServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit CoreServerCredentials(grpc_server_credentials* creds) : creds_(creds) {}
  ~CoreServerCredentials() override { grpc_server_credentials_release(creds_); }
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {}

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }
  grpc_server_credentials* creds_;
};

}  // namespace

const char* const kDirectMethods[kDirectApis] = {"/tensorflow.eas.ProcessorService/Predict",
                                                 "/tensorflow.serving.PredictionService/Predict",
                                                 "/inference.GRPCInferenceService/ModelInfer"};
const char* const kDirectApiNames[kDirectApis] = {"predict", "tfs_predict", "v2_infer"};

const char* grpc_version() {
  static const std::string version = grpc::Version();
  return version.c_str();
}

// --- the reactor --------------------------------------------------------------------------------

class Reactor final : public grpc::ServerGenericBidiReactor {
 public:
  Reactor(Server* server, grpc::GenericCallbackServerContext* ctx)
      : server_(server), ctx_(ctx), started_(std::chrono::steady_clock::now()) {
    if (!server_->enter_call()) {
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!"));
      return;
    }
    counted_ = true;
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // cancelled, or the client closed without a (whole) message: its error, not ours
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the call sent no request message"));
      return;
    }
    const int api = server_->direct_api_of(ctx_->method());
    if (api >= 0 && try_direct(DirectApi(api))) return;
    bridge();
  }

  void OnWriteDone(bool ok) override {
    std::shared_ptr<BridgeCall> call;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      call = call_;
    }
    if (call) server_->post(Event{Event::kWriteDone, call->id, nullptr, ok});
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled_ = true;
    if (call_) server_->post(Event{Event::kCancel, call_->id, nullptr, false});
  }

  void OnDone() override {
    if (counted_) server_->exit_call();
    if (call_) server_->remove_bridged(call_->id);
    delete this;
  }

  // --- Python's actions (BridgeCall), on Python's loop thread, before finish ---------------
  void write_bridged(std::string data, const Metadata& initial) {
    if (!initial_sent_) {
      for (const auto& [k, v] : initial) ctx_->AddInitialMetadata(k, v);
      initial_sent_ = true;
    }
    grpc::Slice slice(data.data(), data.size());
    write_ = grpc::ByteBuffer(&slice, 1);
    StartWrite(&write_);
  }

  void finish_bridged(int code, const std::string& details, bool has_response, std::string response,
                      const Metadata& initial, const Metadata& trailing) {
    if (!initial_sent_) {
      for (const auto& [k, v] : initial) ctx_->AddInitialMetadata(k, v);
      initial_sent_ = true;
    }
    for (const auto& [k, v] : trailing) ctx_->AddTrailingMetadata(k, v);
    if (code < 0 || code > 16) code = grpc::StatusCode::UNKNOWN;
    if (code == 0 && has_response) {
      grpc::Slice slice(response.data(), response.size());
      response_ = grpc::ByteBuffer(&slice, 1);
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      Finish(grpc::Status(static_cast<grpc::StatusCode>(code), details));
    }
  }

  std::vector<std::pair<std::string, std::vector<std::string>>> auth_properties() const {
    std::vector<std::pair<std::string, std::vector<std::string>>> out;
    std::shared_ptr<const grpc::AuthContext> auth = ctx_->auth_context();
    if (!auth) return out;
    for (auto it = auth->begin(); it != auth->end(); ++it) {
      const auto& property = *it;
      std::string name = str(property.first);
      auto slot = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == name; });
      if (slot == out.end()) slot = out.insert(out.end(), {name, {}});
      slot->second.push_back(str(property.second));
    }
    return out;
  }

 private:
  // The request message as one contiguous block (a view into request_ when it is one slice).
  std::pair<const char*, size_t> contiguous() {
    if (!sliced_) {
      sliced_ = true;
      std::vector<grpc::Slice> slices;
      if (request_.Dump(&slices).ok()) {
        if (slices.size() == 1) {
          single_ = slices[0];
        } else {
          for (const auto& s : slices) joined_.append(reinterpret_cast<const char*>(s.begin()), s.size());
        }
        one_slice_ = slices.size() == 1;
      }
    }
    if (one_slice_) return {reinterpret_cast<const char*>(single_.begin()), single_.size()};
    return {joined_.data(), joined_.size()};
  }

  // A Predict-like call on the direct path (see grpc_server.h); false: bridge it. Once submit()
  // took the call, the batch thread may complete it (and this reactor be gone) before submit
  // returns.
  bool try_direct(DirectApi which) {
    const sp_direct_api* api = server_->direct_api();
    if (api == nullptr || api->abi < 2 || server_->draining()) return false;
    grpc::string_ref named_model, rid;
    bool named = false, has_rid = false;
    for (const auto& [key, value] : ctx_->client_metadata()) {
      if (key == "x-request-id") {
        if (!has_rid) rid = value, has_rid = true;
      } else if (which != kEasPredict) {
        continue;  // TF Serving and v2 name the model and version in the message
      } else if (key == "model-name" || key == "x-model-name") {
        if (!named) named_model = value, named = true;
      } else if (key == "x-model-version" || key == "x-model-label") {
        return false;  // a version named: Python resolves it
      }
    }
    auto [data, size] = contiguous();
    if (size == 0 || size > 0x7fffffff) return false;  // empty: DeepRec's ping, answered by Python
    std::shared_ptr<Route> route;
    const auto* bytes = reinterpret_cast<const uint8_t*>(data);
    if (which == kEasPredict) {
      route = server_->route_for(str(named_model));
    } else if (which == kTfsPredict) {
      TfsRequest request;
      if (!tfs_predict_request(bytes, size, request)) return false;
      route = server_->route_for(request.model);
      if (!route || (!request.signature.empty() && request.signature != route->signature)) return false;
      model_ = std::move(request.model);
      queued_ = std::move(request.eas);
    } else {
      V2Request request;
      if (!v2_infer_request(bytes, size, request)) return false;
      route = server_->route_for(request.model);
      if (!route || (!request.version.empty() && request.version != route->version)) return false;
      model_ = std::move(request.model);
      id_ = std::move(request.id);
      queued_ = std::move(request.eas);
    }
    if (!route) return false;
    if (which != kEasPredict) {
      data = queued_.data();
      size = queued_.size();
      if (size > 0x7fffffff) return false;
    }
    double deadline = 0;  // CLOCK_MONOTONIC seconds (the queue's clock); 0: none
    auto until = ctx_->deadline();
    if (until != std::chrono::system_clock::time_point::max()) {
      double left = std::chrono::duration<double>(until - std::chrono::system_clock::now()).count();
      if (left <= 0) return false;  // passed already: Python answers DEADLINE_EXCEEDED
      timespec now;
      clock_gettime(CLOCK_MONOTONIC, &now);
      deadline = double(now.tv_sec) + double(now.tv_nsec) * 1e-9 + left;
    }
    rid_ = has_rid && sane_request_id(rid) ? str(rid) : server_->new_request_id();
    if (!server_->enter_direct()) return false;
    route_ = std::move(route);
    which_ = which;
    void* front = route_->front;
    if (api->submit(front, data, int(size), deadline, &Reactor::direct_done, this) == 1) return true;
    route_.reset();
    server_->exit_direct();
    return false;
  }

  // The method's response of our PredictResponse `out`; false: a form transcode.h does not write.
  bool answer(const Route& route, const void* out, int out_size) {
    const auto* bytes = static_cast<const uint8_t*>(out);
    std::string body;
    if (which_ == kEasPredict) {
      ctx_->AddInitialMetadata("x-model-version", route.version);
      grpc::Slice slice(out, size_t(out_size));  // copied: `out` is the queue's
      response_ = grpc::ByteBuffer(&slice, 1);
      return true;
    }
    bool ok = which_ == kTfsPredict
                  ? tfs_predict_response(bytes, size_t(out_size), model_, route.number, route.signature,
                                         route.tensor_content, body)
                  : v2_infer_response(bytes, size_t(out_size), model_, route.version, id_, body);
    if (!ok) return false;
    grpc::Slice slice(body);  // copied (a response is small beside its request)
    response_ = grpc::ByteBuffer(&slice, 1);
    return true;
  }

  // On the batch thread that ran the call's batch (no Python, no GIL): the answer, DEADLINE_EXCEEDED
  // for a call its queue dropped unrun, or the bridge when the queue handed the call back.
  static void direct_done(void* user, int status, const void* out, int out_size) {
    auto* self = static_cast<Reactor*>(user);
    Server* server = self->server_;
    std::shared_ptr<Route> route = std::move(self->route_);
    const auto took = std::chrono::steady_clock::now() - self->started_;
    server->exit_direct();  // answered or handed on: the drain need not wait for the write
    // An answer transcode.h cannot write (none the queue's encoder writes today) goes to Python,
    // which runs the request again and answers it its own way rather than wrongly.
    if (status == 200 && self->answer(*route, out, out_size)) {
      self->ctx_->AddTrailingMetadata("x-request-id", self->rid_);
      server->count_direct();
      server->record(route->stats[self->which_], took, std::move(self->rid_));
      self->StartWriteAndFinish(&self->response_, grpc::WriteOptions(), grpc::Status::OK);
    } else if (status == 504) {  // as Python answers it
      self->ctx_->AddTrailingMetadata("x-request-id", self->rid_);
      const auto& expired = route->expired[self->which_];
      server->record(expired, took, std::move(self->rid_));
      self->Finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, expired->message));
    } else {
      self->bridge();  // not taken: Python answers it exactly
    }
  }

  void bridge() {
    auto call = std::make_shared<BridgeCall>(server_->next_call_id(), this);
    call->method = ctx_->method();
    call->peer = ctx_->peer();
    auto [data, size] = contiguous();
    call->request.assign(data, size);
    const auto& md = ctx_->client_metadata();
    call->metadata.reserve(md.size());
    for (const auto& [key, value] : md) call->metadata.emplace_back(str(key), str(value));
    auto deadline = ctx_->deadline();
    if (deadline != std::chrono::system_clock::time_point::max()) {
      call->deadline_remaining =
          std::max(0.0, std::chrono::duration<double>(deadline - std::chrono::system_clock::now()).count());
    }
    server_->count_bridged();
    server_->add_bridged(call);
    std::lock_guard<std::mutex> lock(mutex_);
    call_ = call;
    server_->post(Event{Event::kNew, call->id, call, true});
    if (cancelled_) server_->post(Event{Event::kCancel, call->id, nullptr, false});
  }

  Server* const server_;
  grpc::GenericCallbackServerContext* const ctx_;
  const std::chrono::steady_clock::time_point started_;
  grpc::ByteBuffer request_, response_, write_;
  bool counted_ = false, sliced_ = false, one_slice_ = false, initial_sent_ = false;
  grpc::Slice single_;
  std::string joined_, rid_;
  std::shared_ptr<Route> route_;
  DirectApi which_ = kEasPredict;
  std::string queued_, model_, id_;  // TF Serving's and v2's: the request as ours; what the answer names
  std::mutex mutex_;  // call_ and cancelled_: OnCancel runs on any thread
  std::shared_ptr<BridgeCall> call_;
  bool cancelled_ = false;
};

// --- BridgeCall ---------------------------------------------------------------------------------
// Python calls these from its loop thread only (under the GIL), so they never race each other;
// the reactor lives until Finish, which only finish() calls.

bool BridgeCall::write(std::string data, const Metadata& initial) {
  if (finished_.load(std::memory_order_acquire)) return false;
  reactor_->write_bridged(std::move(data), initial);
  return true;
}

bool BridgeCall::finish(int code, const std::string& details, bool has_response, std::string response,
                        const Metadata& initial, const Metadata& trailing) {
  if (finished_.exchange(true, std::memory_order_acq_rel)) return false;
  reactor_->finish_bridged(code, details, has_response, std::move(response), initial, trailing);
  return true;
}

std::vector<std::pair<std::string, std::vector<std::string>>> BridgeCall::auth_context() {
  if (finished_.load(std::memory_order_acquire)) return {};
  return reactor_->auth_properties();
}

// --- Server -------------------------------------------------------------------------------------

struct Server::Impl {
  class Service final : public grpc::CallbackGenericService {
   public:
    explicit Service(Server* server) : server_(server) {}
    grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
      return new Reactor(server_, ctx);
    }

   private:
    Server* server_;
  };

  explicit Impl(Server* server) : service(server) {}
  Service service;
  grpc::ServerBuilder builder;
  std::unique_ptr<grpc::Server> server;
  std::vector<std::unique_ptr<int>> ports;
  std::vector<std::string> addresses;
  std::shared_ptr<TlsSource> tls;
  std::vector<std::unique_ptr<TlsFetcher>> fetchers;
};

namespace {

// The calling thread under SCHED_BATCH while it lives (when `on`), so that the threads it makes
// inherit it; its own policy back after. Linux: a thread takes its creator's policy. Needs no
// capability; where the system refuses, nothing changes.
class BatchPolicyScope {
 public:
  explicit BatchPolicyScope(bool on) {
    if (!on) return;
    policy_ = sched_getscheduler(0);
    if (policy_ < 0 || policy_ == SCHED_BATCH || sched_getparam(0, &param_) != 0) return;
    sched_param zero{};
    set_ = sched_setscheduler(0, SCHED_BATCH, &zero) == 0;
  }
  ~BatchPolicyScope() {
    if (set_) sched_setscheduler(0, policy_, &param_);
  }
  BatchPolicyScope(const BatchPolicyScope&) = delete;
  BatchPolicyScope& operator=(const BatchPolicyScope&) = delete;

 private:
  int policy_ = -1;
  sched_param param_{};
  bool set_ = false;
};

}  // namespace

Server::Server(Options options) : options_(std::move(options)) {
  {
    BatchPolicyScope batch(options_.io_threads_batch);  // the threads grpc_init starts
    grpc_init();
  }
  impl_ = std::make_unique<Impl>(this);
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  std::random_device random;
  rid_prefix_ = random();
  next_rid_ = (uint64_t(random()) << 32 | random()) & 0xffffffffu;
}

Server::~Server() {
  shutdown(0);
  impl_.reset();
  if (event_fd_ >= 0) close(event_fd_);
  grpc_shutdown();
}

int Server::add_port(const std::string& address, const Tls* tls) {
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (tls == nullptr) {
    creds = grpc::InsecureServerCredentials();
  } else {
    if (!impl_->tls) {
      impl_->tls = std::make_shared<TlsSource>();
      impl_->tls->tls = *tls;
    }
    auto fetcher = std::make_unique<TlsFetcher>(TlsFetcher{impl_->tls, 0});
    grpc_ssl_server_credentials_options* options = grpc_ssl_server_credentials_create_options_using_config_fetcher(
        tls->require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                 : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        &fetch_tls, fetcher.get());
    grpc_server_credentials* core = options ? grpc_ssl_server_credentials_create_with_options(options) : nullptr;
    if (core == nullptr) return 0;
    creds = std::make_shared<CoreServerCredentials>(core);
    impl_->fetchers.push_back(std::move(fetcher));
  }
  impl_->ports.push_back(std::make_unique<int>(0));
  impl_->addresses.push_back(address);
  impl_->builder.AddListeningPort(address, creds, impl_->ports.back().get());
  return 1;
}

bool Server::start(std::string& error) {
  grpc::ServerBuilder& builder = impl_->builder;
  for (const ChannelArg& arg : options_.channel_args) {
    if (arg.is_int) {
      builder.AddChannelArgument(arg.key, int(std::clamp<long long>(arg.int_value, INT32_MIN, INT32_MAX)));
    } else {
      builder.AddChannelArgument(arg.key, arg.str_value);
    }
  }
  builder.RegisterCallbackGenericService(&impl_->service);
  {
    BatchPolicyScope batch(options_.io_threads_batch);  // the pollers and callback threads
    impl_->server = builder.BuildAndStart();
  }
  if (!impl_->server) {
    error = "gRPC could not start a server on";
    for (const auto& a : impl_->addresses) error += " " + a;
    error += " (a port in use, an address that does not resolve, or bad channel arguments)";
    return false;
  }
  return true;
}

int Server::bound_port(size_t i) const { return i < impl_->ports.size() ? *impl_->ports[i] : 0; }

void Server::shutdown(double grace_seconds) {
  if (stopped_.exchange(true)) return;
  draining_.store(true);
  if (impl_ && impl_->server) {
    grace_seconds = std::max(0.0, grace_seconds);
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    std::thread last_resort([&] {
      std::unique_lock<std::mutex> lock(mutex);
      if (done_cv.wait_for(lock, std::chrono::duration<double>(grace_seconds + kShutdownSlack), [&] { return done; }))
        return;
      lock.unlock();
      std::vector<std::shared_ptr<BridgeCall>> left;
      {
        std::lock_guard<std::mutex> live(live_mutex_);
        for (auto& [_, weak] : live_)
          if (auto call = weak.lock()) left.push_back(std::move(call));
      }
      for (auto& call : left)
        call->finish(grpc::StatusCode::UNAVAILABLE, "the server is stopping", false, std::string(), {}, {});
    });
    auto grace = std::chrono::duration_cast<std::chrono::system_clock::duration>(
        std::chrono::duration<double>(grace_seconds));
    impl_->server->Shutdown(std::chrono::system_clock::now() + grace);
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
    }
    done_cv.notify_all();
    last_resort.join();
  }
}

void Server::add_bridged(const std::shared_ptr<BridgeCall>& call) {
  std::lock_guard<std::mutex> lock(live_mutex_);
  live_.emplace(call->id, call);
}

void Server::remove_bridged(uint64_t id) {
  std::lock_guard<std::mutex> lock(live_mutex_);
  live_.erase(id);
}

void Server::set_tls(const Tls& tls) {
  if (!impl_->tls) return;
  std::lock_guard<std::mutex> lock(impl_->tls->mutex);
  impl_->tls->tls = tls;
  ++impl_->tls->generation;
}

void Server::set_route(const std::string& model, std::shared_ptr<Route> route) {
  std::shared_ptr<Route> old;  // released outside the lock
  std::lock_guard<std::mutex> lock(routes_mutex_);
  auto it = routes_.find(model);
  if (it != routes_.end()) {
    old = std::move(it->second);
    if (route) {
      it->second = std::move(route);
    } else {
      routes_.erase(it);
    }
  } else if (route) {
    routes_.emplace(model, std::move(route));
  }
}

void Server::set_sole_model(const std::string& model) {
  std::lock_guard<std::mutex> lock(routes_mutex_);
  sole_model_ = model;
}

std::shared_ptr<Route> Server::route_for(const std::string& model) {
  std::lock_guard<std::mutex> lock(routes_mutex_);
  auto it = routes_.find(model.empty() ? sole_model_ : model);
  return it == routes_.end() ? nullptr : it->second;
}

int Server::direct_api_of(const std::string& method) const {
  const unsigned mask = direct_methods_.load(std::memory_order_acquire);
  for (int i = 0; i < kDirectApis; ++i)
    if ((mask >> i & 1) && method == kDirectMethods[i]) return i;
  return -1;
}

std::shared_ptr<RouteStats> Server::stats_of(const std::string& model, const std::string& label,
                                             const std::string& api, const std::string& code,
                                             const std::string& message) {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  std::string key = model + '\0' + label + '\0' + api + '\0' + code;
  auto it = stats_.find(key);
  if (it != stats_.end()) return it->second;
  auto stats = std::make_shared<RouteStats>(model, label, api, code, message, options_.latency_buckets.size());
  stats_.emplace(std::move(key), stats);
  return stats;
}

std::vector<std::shared_ptr<RouteStats>> Server::all_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  std::vector<std::shared_ptr<RouteStats>> out;
  out.reserve(stats_.size());
  for (const auto& [_, s] : stats_) out.push_back(s);
  return out;
}

std::vector<AccessRecord> Server::take_access_records() {
  std::vector<AccessRecord> out;
  std::lock_guard<std::mutex> lock(access_mutex_);
  out.swap(access_);
  return out;
}

void Server::record(const std::shared_ptr<RouteStats>& stats, std::chrono::steady_clock::duration took,
                    std::string request_id) {
  double seconds = std::chrono::duration<double>(took).count();
  const auto& bounds = options_.latency_buckets;
  size_t bucket = std::lower_bound(bounds.begin(), bounds.end(), seconds) - bounds.begin();
  stats->counts[bucket].fetch_add(1, std::memory_order_relaxed);
  stats->sum_ns.fetch_add(uint64_t(seconds * 1e9), std::memory_order_relaxed);
  stats->count.fetch_add(1, std::memory_order_release);
  if (access_log()) {
    std::lock_guard<std::mutex> lock(access_mutex_);
    if (access_.size() < kMaxAccessRecords) access_.push_back(AccessRecord{stats, seconds, std::move(request_id)});
  }
}

std::string Server::new_request_id() {  // server/logs.py's form: 16 hex digits
  char id[17];
  std::snprintf(id, sizeof id, "%08x%08x", rid_prefix_,
                unsigned(next_rid_.fetch_add(1, std::memory_order_relaxed) & 0xffffffffu));
  return std::string(id, 16);
}

void Server::post(Event event) {
  bool was_empty;
  {
    std::lock_guard<std::mutex> lock(events_mutex_);
    was_empty = events_.empty();
    events_.push_back(std::move(event));
  }
  if (was_empty) {
    uint64_t one = 1;
    ssize_t n;
    do {
      n = ::write(event_fd_, &one, sizeof one);
    } while (n < 0 && errno == EINTR);
  }
}

std::vector<Event> Server::take_events() {
  uint64_t value;
  ssize_t n;
  do {
    n = ::read(event_fd_, &value, sizeof value);  // first: a post after this one writes it again
  } while (n < 0 && errno == EINTR);
  std::vector<Event> out;
  std::lock_guard<std::mutex> lock(events_mutex_);
  out.swap(events_);
  return out;
}

bool Server::enter_direct() {
  direct_inflight_.fetch_add(1, std::memory_order_seq_cst);
  if (!draining_.load(std::memory_order_seq_cst)) return true;
  exit_direct();
  return false;
}

void Server::exit_direct() {
  if (direct_inflight_.fetch_sub(1, std::memory_order_seq_cst) == 1 && draining_.load(std::memory_order_seq_cst)) {
    std::lock_guard<std::mutex> lock(idle_mutex_);  // under the lock: the waiter cannot miss it
    idle_.notify_all();
  }
}

bool Server::wait_direct_idle(double seconds) {
  draining_.store(true, std::memory_order_seq_cst);
  std::unique_lock<std::mutex> lock(idle_mutex_);
  return idle_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, seconds)),
                        [&] { return direct_inflight_.load(std::memory_order_seq_cst) == 0; });
}

bool Server::enter_call() {
  if (active_.fetch_add(1, std::memory_order_relaxed) >= options_.max_concurrent_rpcs) {
    active_.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  return true;
}

}  // namespace spg
