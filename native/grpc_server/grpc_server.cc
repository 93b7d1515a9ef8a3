// grpc_server.cc -- see grpc_server.h.
#include "grpc_server.h"

#include "reactor.h"

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

// --- Server -------------------------------------------------------------------------------------

struct Server::Impl {
  class Service final : public grpc::CallbackGenericService {
   public:
    explicit Service(Server* server) : server_(server) {}
    grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
      return new_reactor(server_, ctx);
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
