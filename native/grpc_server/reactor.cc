// reactor.cc -- see reactor.h.
#include "reactor.h"

#include "transcode.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <time.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <mutex>

namespace spg {

namespace {

bool sane_request_id(grpc::string_ref id) {  // server/logs.py _VALID_ID
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '-'))
      return false;
  }
  return true;
}

std::string str(grpc::string_ref s) { return std::string(s.data(), s.size()); }

}  // namespace

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

grpc::ServerGenericBidiReactor* new_reactor(Server* server, grpc::GenericCallbackServerContext* ctx) {
  return new Reactor(server, ctx);
}

}  // namespace spg
