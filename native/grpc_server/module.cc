// module.cc -- server.grpc._native_grpc: the native gRPC server's Python bindings (nanobind).
//
//   Server(channel_args, max_concurrent_rpcs, latency_buckets, io_threads_batch)
//     .add_port(address, tls | None)     before start(); tls: (key, cert_chain, client_ca, require)
//     .start() / .bound_ports() / .shutdown(grace)   shutdown blocks without the GIL
//     .set_tls(tls)                      new material for new handshakes
//     .set_direct_api(capsule)           processor._native.direct_api (direct_api.h)
//     .set_route(model, front | None, version, label, expired_message, signature, tensor_content)
//                                        a DirectFront capsule: the model's direct path; the
//                                        DEADLINE_EXCEEDED message of a call its queue dropped; the
//                                        default signature's name and the model's
//                                        enable_serialization_as_tensor_content (TF Serving's answers)
//     .set_direct_methods([path, ...])   the methods that may take the direct path (DIRECT_METHODS)
//     .set_sole_model(name) / .set_draining(bool) / .set_access_log(bool)
//     .event_fd / .take()                the bridge's events: [(kind, id, Call | None, ok)]
//     .fold() / .take_access() / .stats()   what the server answered itself
//   tfs_request / tfs_response / v2_request / v2_response: transcode.h's functions (for tests)
//   Call: one bridged call: id, method, peer, request, metadata, deadline_remaining,
//     write(data, initial), finish(code, details, response | None, initial, trailing), auth_context()
//
// See grpc_server.h. Everything that touches a Python object runs with the GIL here; the gRPC
// threads never do: a released route's capsule waits in a list until Python's next call here.
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "grpc_server.h"
#include "transcode.h"

namespace nb = nanobind;

namespace {

// Capsules no route holds any more, decref'd with the GIL (release_garbage).
std::mutex g_garbage_mutex;
std::vector<PyObject*> g_garbage;

void release_later(void* owner) {
  std::lock_guard<std::mutex> lock(g_garbage_mutex);
  g_garbage.push_back(static_cast<PyObject*>(owner));
}

void release_garbage() {  // with the GIL
  std::vector<PyObject*> dead;
  {
    std::lock_guard<std::mutex> lock(g_garbage_mutex);
    dead.swap(g_garbage);
  }
  for (PyObject* o : dead) Py_DECREF(o);
}

nb::object text(const std::string& key, const std::string& value) {
  bool binary = key.size() >= 4 && key.compare(key.size() - 4, 4, "-bin") == 0;
  if (binary) return nb::bytes(value.data(), value.size());
  return nb::steal(PyUnicode_DecodeLatin1(value.data(), Py_ssize_t(value.size()), "replace"));
}

std::string bytes_of(nb::handle h) {  // str (UTF-8) or bytes-like
  if (PyUnicode_Check(h.ptr())) return nb::cast<std::string>(h);
  Py_buffer view;
  if (PyObject_GetBuffer(h.ptr(), &view, PyBUF_SIMPLE) != 0) throw nb::python_error();
  std::string out(static_cast<const char*>(view.buf), size_t(view.len));
  PyBuffer_Release(&view);
  return out;
}

spg::Metadata metadata_of(nb::handle seq) {
  spg::Metadata out;
  if (seq.is_none()) return out;
  for (nb::handle item : seq) {
    nb::sequence pair = nb::borrow<nb::sequence>(item);
    out.emplace_back(nb::cast<std::string>(pair[0]), bytes_of(pair[1]));
  }
  return out;
}

spg::Tls tls_of(nb::handle t) {
  nb::tuple tuple = nb::borrow<nb::tuple>(t);
  spg::Tls tls;
  tls.key = bytes_of(tuple[0]);
  tls.cert_chain = bytes_of(tuple[1]);
  tls.client_ca = tuple[2].is_none() ? std::string() : bytes_of(tuple[2]);
  tls.require_client_cert = nb::cast<bool>(tuple[3]);
  return tls;
}

struct PyServer {
  std::unique_ptr<spg::Server> server;
  nb::object api_capsule;
  size_t ports = 0;
  // Never stopped (an error path, the interpreter's exit): stopping waits for the calls in
  // progress, and a batch may need the GIL to end one.
  ~PyServer() {
#if PY_VERSION_HEX >= 0x030D0000
    const bool finalizing = Py_IsFinalizing();
#else
    const bool finalizing = _Py_IsFinalizing();
#endif
    if (finalizing) {
      server.reset();
    } else {
      nb::gil_scoped_release nogil;
      server.reset();
    }
  }
};

void make_server(PyServer* self, nb::list channel_args, int max_concurrent_rpcs, std::vector<double> buckets,
                 bool io_threads_batch) {
  spg::Options options;
  for (nb::handle item : channel_args) {
    nb::tuple pair = nb::borrow<nb::tuple>(item);
    spg::ChannelArg arg;
    arg.key = nb::cast<std::string>(pair[0]);
    if (PyLong_Check(pair[1].ptr())) {
      arg.is_int = true;
      arg.int_value = nb::cast<long long>(pair[1]);
    } else {
      arg.is_int = false;
      arg.str_value = nb::cast<std::string>(pair[1]);
    }
    options.channel_args.push_back(std::move(arg));
  }
  options.max_concurrent_rpcs = max_concurrent_rpcs;
  options.latency_buckets = std::move(buckets);
  options.io_threads_batch = io_threads_batch;
  new (self) PyServer{std::make_unique<spg::Server>(std::move(options)), nb::none(), 0};
}

nb::list take(PyServer& self) {
  std::vector<spg::Event> events;
  {
    nb::gil_scoped_release nogil;
    events = self.server->take_events();
  }
  nb::list out;
  for (auto& e : events) {
    nb::object call = e.call ? nb::cast(e.call) : nb::none();
    out.append(nb::make_tuple(int(e.kind), e.id, call, e.ok));
  }
  return out;
}

nb::list fold(PyServer& self) {
  release_garbage();
  nb::list out;
  for (const auto& s : self.server->all_stats()) {
    uint64_t count = s->count.exchange(0, std::memory_order_acquire);
    if (count == 0) continue;
    // the rest was added before its count (a request counted next time keeps its share)
    double sum = double(s->sum_ns.exchange(0, std::memory_order_relaxed)) / 1e9;
    nb::list buckets;
    for (auto& c : s->counts) buckets.append(c.exchange(0, std::memory_order_relaxed));
    out.append(nb::make_tuple(s->model, s->label, s->api, s->code, count, sum, buckets));
  }
  return out;
}

nb::list take_access(PyServer& self) {
  nb::list out;
  for (auto& r : self.server->take_access_records())
    out.append(nb::make_tuple(r.stats->model, r.stats->label, r.stats->api, r.stats->code, r.stats->message,
                              r.seconds, r.request_id));
  return out;
}

const uint8_t* data_of(const nb::bytes& b) { return reinterpret_cast<const uint8_t*>(b.c_str()); }

nb::object maybe_bytes(bool ok, const std::string& s) {
  return ok ? nb::object(nb::bytes(s.data(), s.size())) : nb::none();
}

void bind_transcoders(nb::module_& m) {
  m.def("tfs_request", [](nb::bytes data) -> nb::object {
    spg::TfsRequest r;
    if (!spg::tfs_predict_request(data_of(data), data.size(), r)) return nb::none();
    return nb::make_tuple(r.model, r.signature, nb::bytes(r.eas.data(), r.eas.size()));
  }, "(model, signature, our PredictRequest) of a TF Serving PredictRequest; None: not taken");
  m.def("tfs_response", [](nb::bytes eas, const std::string& model, int64_t version, const std::string& signature,
                           bool tensor_content) {
    std::string out;
    bool ok = spg::tfs_predict_response(data_of(eas), eas.size(), model, version, signature, tensor_content, out);
    return maybe_bytes(ok, out);
  });
  m.def("v2_request", [](nb::bytes data) -> nb::object {
    spg::V2Request r;
    if (!spg::v2_infer_request(data_of(data), data.size(), r)) return nb::none();
    return nb::make_tuple(r.model, r.version, r.id, nb::bytes(r.eas.data(), r.eas.size()));
  }, "(model, version, id, our PredictRequest) of a ModelInferRequest; None: not taken");
  m.def("v2_response", [](nb::bytes eas, const std::string& model, const std::string& version, const std::string& id) {
    std::string out;
    return maybe_bytes(spg::v2_infer_response(data_of(eas), eas.size(), model, version, id, out), out);
  });
}

}  // namespace

NB_MODULE(_native_grpc, m) {
  m.doc() = "The native gRPC server (issue 50): native/grpc_server/grpc_server.h";
  m.attr("NEW") = int(spg::Event::kNew);
  m.attr("WRITE_DONE") = int(spg::Event::kWriteDone);
  m.attr("CANCEL") = int(spg::Event::kCancel);
  m.attr("GRPC_VERSION") = spg::grpc_version();
  nb::list methods;
  for (const char* path : spg::kDirectMethods) methods.append(path);
  m.attr("DIRECT_METHODS") = nb::tuple(methods);
  bind_transcoders(m);

  nb::class_<spg::BridgeCall>(m, "Call")
      .def_ro("id", &spg::BridgeCall::id)
      .def_ro("method", &spg::BridgeCall::method)
      .def_ro("peer", &spg::BridgeCall::peer)
      .def_prop_ro("request",
                   [](const spg::BridgeCall& c) { return nb::bytes(c.request.data(), c.request.size()); })
      .def_prop_ro("metadata",
                   [](const spg::BridgeCall& c) {
                     nb::list items;
                     for (const auto& [k, v] : c.metadata)
                       items.append(nb::make_tuple(nb::str(k.data(), k.size()), text(k, v)));
                     return nb::tuple(items);
                   })
      .def_prop_ro("deadline_remaining",
                   [](const spg::BridgeCall& c) -> nb::object {
                     if (c.deadline_remaining < 0) return nb::none();
                     return nb::float_(c.deadline_remaining);
                   })
      .def_prop_ro("finished", &spg::BridgeCall::finished)
      .def("write",
           [](spg::BridgeCall& c, nb::handle data, nb::handle initial) {
             return c.write(bytes_of(data), metadata_of(initial));
           },
           nb::arg("data"), nb::arg("initial").none())
      .def("finish",
           [](spg::BridgeCall& c, int code, const std::string& details, nb::handle response, nb::handle initial,
              nb::handle trailing) {
             bool has = !response.is_none();
             return c.finish(code, details, has, has ? bytes_of(response) : std::string(), metadata_of(initial),
                             metadata_of(trailing));
           },
           nb::arg("code"), nb::arg("details"), nb::arg("response").none(), nb::arg("initial").none(),
           nb::arg("trailing").none())
      .def("auth_context", [](spg::BridgeCall& c) {
        nb::dict out;
        for (const auto& [name, values] : c.auth_context()) {
          nb::list vs;
          for (const auto& v : values) vs.append(nb::bytes(v.data(), v.size()));
          out[nb::str(name.data(), name.size())] = vs;
        }
        return out;
      });

  nb::class_<PyServer>(m, "Server")
      .def("__init__", &make_server, nb::arg("channel_args"), nb::arg("max_concurrent_rpcs"),
           nb::arg("latency_buckets"), nb::arg("io_threads_batch") = false)
      .def("add_port",
           [](PyServer& self, const std::string& address, nb::handle tls) {
             if (tls.is_none()) return self.server->add_port(address, nullptr) ? self.ports++ : -1;
             spg::Tls t = tls_of(tls);
             return self.server->add_port(address, &t) ? self.ports++ : -1;
           },
           nb::arg("address"), nb::arg("tls").none(), "the listener's index, or -1 (no credentials)")
      .def("start",
           [](PyServer& self) {
             std::string error;
             bool ok;
             {
               nb::gil_scoped_release nogil;
               ok = self.server->start(error);
             }
             if (!ok) throw std::runtime_error(error);
           })
      .def("bound_ports",
           [](PyServer& self) {
             std::vector<int> out;
             for (size_t i = 0; i < self.ports; ++i) out.push_back(self.server->bound_port(i));
             return out;
           })
      .def("shutdown",
           [](PyServer& self, double grace) {
             {
               nb::gil_scoped_release nogil;
               self.server->shutdown(grace);
             }
             release_garbage();
           },
           nb::arg("grace"))
      .def("wait_direct_idle",
           [](PyServer& self, double seconds) {
             nb::gil_scoped_release nogil;
             return self.server->wait_direct_idle(seconds);
           },
           nb::arg("seconds"), "draining: wait until no call is on the direct path; False: some still are")
      .def("set_tls", [](PyServer& self, nb::handle tls) { self.server->set_tls(tls_of(tls)); })
      .def("set_direct_api",
           [](PyServer& self, nb::handle capsule) {
             if (capsule.is_none()) {
               self.server->set_direct_api(nullptr);
               return;
             }
             auto* api = static_cast<const sp_direct_api*>(PyCapsule_GetPointer(capsule.ptr(), SP_DIRECT_API_CAPSULE));
             if (api == nullptr) throw nb::python_error();
             if (api->abi < 2)  // submit(), the asynchronous serve
               throw std::runtime_error("processor._native.direct_api: ABI " + std::to_string(api->abi) +
                                        ", this server needs 2 or later");
             self.api_capsule = nb::borrow(capsule);
             self.server->set_direct_api(api);
           },
           nb::arg("capsule").none())
      .def("set_route",
           [](PyServer& self, const std::string& model, nb::handle front, const std::string& version,
              const std::string& label, const std::string& expired_message, const std::string& signature,
              bool tensor_content) {
             release_garbage();
             if (front.is_none()) {
               self.server->set_route(model, nullptr);
               return;
             }
             void* p = PyCapsule_GetPointer(front.ptr(), SP_DIRECT_FRONT_CAPSULE);
             if (p == nullptr) throw nb::python_error();
             auto route = std::make_shared<spg::Route>();
             route->front = p;
             route->version = version;
             route->number = std::strtoll(version.c_str(), nullptr, 10);
             route->signature = signature;
             route->tensor_content = tensor_content;
             for (int i = 0; i < spg::kDirectApis; ++i) {
               const char* api = spg::kDirectApiNames[i];
               route->stats[i] = self.server->stats_of(model, label, api, "OK", "");
               route->expired[i] = self.server->stats_of(model, label, api, "DEADLINE_EXCEEDED", expired_message);
             }
             Py_INCREF(front.ptr());
             route->owner = front.ptr();
             route->release = &release_later;
             self.server->set_route(model, std::move(route));
             release_garbage();
           },
           nb::arg("model"), nb::arg("front").none(), nb::arg("version"), nb::arg("label"),
           nb::arg("expired_message") = "", nb::arg("signature") = "", nb::arg("tensor_content") = false)
      .def("set_direct_methods",
           [](PyServer& self, const std::vector<std::string>& paths) {
             unsigned mask = 0;
             for (const auto& path : paths)
               for (int i = 0; i < spg::kDirectApis; ++i)
                 if (path == spg::kDirectMethods[i]) mask |= 1u << i;
             self.server->set_direct_methods(mask);
           })
      .def("set_sole_model", [](PyServer& self, const std::string& m) { self.server->set_sole_model(m); })
      .def("set_draining", [](PyServer& self, bool d) { self.server->set_draining(d); })
      .def("set_access_log", [](PyServer& self, bool on) { self.server->set_access_log(on); })
      .def_prop_ro("event_fd", [](PyServer& self) { return self.server->event_fd(); })
      .def("take", &take, "the events posted since the last call: [(kind, id, Call | None, ok)]")
      .def("fold", &fold, "[(model, label, code, count, seconds, bucket counts)] since the last fold")
      .def("take_access", &take_access,
           "[(model, label, code, message, seconds, request id)] since the last call")
      .def("stats", [](PyServer& self) {
        nb::dict d;
        d["direct"] = self.server->direct_served();
        d["bridged"] = self.server->bridged();
        return d;
      });
}
