// module_direct.cc -- processor._native's classes of the direct path (nanobind bindings):
//
//   DirectLane(batcher).close() / open()         one version's door for the C ABI's direct path
//   DirectFront().publish(lane | None) / serve(data) / submit(data, deadline) / capsule() / stats()
//                                                a model's current lane (direct_front.h)
//   direct_api                                   the C table the C shim and the native gRPC server
//                                                call (direct_api.h)
//
// None means "not taken": the caller serves the request through the Python reference path.
// Every method is thread-safe.
#include <nanobind/nanobind.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "direct_front.h"
#include "module_engine.h"

namespace nb = nanobind;

namespace sp::py {
namespace {

// A DirectLane and the Batcher object it is in front of (kept alive with it).
struct PyDirectLane {
  std::shared_ptr<sp::DirectLane> lane;
  nb::object batcher;
};

struct PyDirectFront {
  sp::DirectFront front;
};

void make_lane(PyDirectLane* self, nb::handle batcher) {
  PyBatcher& b = nb::cast<PyBatcher&>(batcher);
  new (self) PyDirectLane{std::make_shared<sp::DirectLane>(b.batcher.get()), nb::borrow(batcher)};
}

// The front's address as a capsule for the C shim, which keeps the front alive by holding it
// (the capsule's context is a reference to the front's Python object).
nb::object front_capsule(nb::pointer_and_handle<PyDirectFront> self) {
  PyObject* capsule = PyCapsule_New(&self.p->front, SP_DIRECT_FRONT_CAPSULE, [](PyObject* c) {
    Py_XDECREF(static_cast<PyObject*>(PyCapsule_GetContext(c)));
  });
  if (capsule == nullptr) throw nb::python_error();
  Py_INCREF(self.h.ptr());
  if (PyCapsule_SetContext(capsule, self.h.ptr()) != 0) {
    Py_DECREF(self.h.ptr());
    Py_DECREF(capsule);
    throw nb::python_error();
  }
  return nb::steal(capsule);
}

}  // namespace

void bind_direct(nb::module_& m) {
  nb::class_<PyDirectLane>(m, "DirectLane")
      .def("__init__", &make_lane, nb::arg("batcher"),
           "one version's door to its Batcher for the C ABI's direct path (native/src/direct_front.h)")
      .def("close",
           [](PyDirectLane& self) {
             nb::gil_scoped_release nogil;  // the callers inside may wait for a batch that needs the GIL
             self.lane->close();
           },
           "let no direct call in; returns once every call inside has left")
      .def("open", [](PyDirectLane& self) { self.lane->open(); }, "let direct calls in again");
  nb::class_<PyDirectFront>(m, "DirectFront")
      .def(nb::init<>())
      .def("publish",
           [](PyDirectFront& self, nb::handle lane) {
             self.front.publish(lane.is_none() ? nullptr : nb::cast<PyDirectLane&>(lane).lane);
           },
           nb::arg("lane").none(), "the lane direct calls take from now on (None: none)")
      .def("capsule", &front_capsule, "the front for the C shim (a capsule that keeps it alive)")
      .def("serve",
           [](PyDirectFront& self, nb::handle data) -> nb::object {
             Borrowed in(data);
             std::string response;
             int status;
             {
               nb::gil_scoped_release nogil;  // queued and awaited without Python
               status = self.front.serve(in.data(), in.size(), [&](const std::string& r) {
                 response = r;
                 return true;
               });
             }
             if (status != 200) return nb::none();
             return nb::bytes(response.data(), response.size());
           },
           nb::arg("data"),
           "serialized PredictRequest bytes on the published lane, without the GIL: the "
           "PredictResponse bytes, or None: not taken (serve it through Python)")
      .def("submit",
           [](PyDirectFront& self, nb::handle data, double deadline) -> nb::object {
             Borrowed in(data);
             struct Wait {
               std::mutex mutex;
               std::condition_variable cv;
               bool done = false;
               int status = 0;
               std::string response;
             } wait;
             {
               nb::gil_scoped_release nogil;
               auto done = [](void* user, int status, const void* out, int size) {
                 auto* w = static_cast<Wait*>(user);
                 std::lock_guard<std::mutex> lock(w->mutex);
                 if (status == 200) w->response.assign(static_cast<const char*>(out), size_t(size));
                 w->status = status;
                 w->done = true;
                 w->cv.notify_one();
               };
               if (self.front.submit(in.data(), in.size(), deadline, done, &wait) == 1) {
                 std::unique_lock<std::mutex> lock(wait.mutex);
                 wait.cv.wait(lock, [&] { return wait.done; });
               }
             }
             if (wait.status == 504) return nb::str("expired");
             if (wait.status != 200) return nb::none();
             return nb::bytes(wait.response.data(), wait.response.size());
           },
           nb::arg("data"), nb::arg("deadline") = 0.0,
           "serve() through the asynchronous path (direct_api.h's submit, completed on the batch "
           "thread), awaited here without the GIL; `deadline`: time.monotonic() seconds (<= 0: "
           "none). The PredictResponse bytes; 'expired': its deadline passed before its batch ran "
           "(dropped unrun); None: not taken or handed back (serve it through Python)")
      .def("stats", [](const PyDirectFront& self) {
        nb::dict d;
        d["served"] = self.front.served();
        d["not_taken"] = self.front.not_taken();
        return d;
      }, "direct calls answered, and not taken (served through Python)");
  m.attr("direct_api") = nb::steal(PyCapsule_New(const_cast<sp_direct_api*>(&sp::kDirectApi),
                                                 SP_DIRECT_API_CAPSULE, nullptr));
}

}  // namespace sp::py
