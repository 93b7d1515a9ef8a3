// module_engine.cc -- processor._native's engine classes (nanobind bindings):
//
//   OrtEngine(library, model_path, parameters, ...)   ONNX Runtime sessions over the caller's
//                                                     parameter arrays (ort_engine.h)
//   OrtEngine.serve(plan, lane, data)                 a whole request without the GIL, or None
//   OrtEngine.serve_timed(plan, lane, data)           the same, with its stages' times (spans)
//   OrtEngine.run_arrays(lane, inputs, fetch)         numpy arrays in and out without the GIL, or None
//   RowBudget(capacity)                               one model's queue capacity in rows (batcher.h)
//   Batcher(plan, engine | runner, budget, ...)       one version's batching queue (batcher.h)
//   Batcher.submit(data, deadline, notify_fd=-1) -> BatchTicket  queue a request; ticket.wait() its answer
//   Batcher.stats() / close()
//   (the direct path's classes: module_direct.cc)
//
// None means "not taken": the caller serves the request through the Python reference path.
// Every method is thread-safe.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "numpy_api.h"

#include <cstring>
#include <memory>
#include <stdexcept>
#include <utility>

#include "batcher.h"
#include "module_engine.h"
#include "ort_engine.h"

namespace nb = nanobind;

namespace sp::py {
namespace {

// An Engine and the Python objects whose memory it uses (the parameter arrays).
struct PyEngine {
  std::unique_ptr<sp::ort::Engine> engine;
  std::vector<nb::object> keep;
};

int ort_type(PyArrayObject* a) {
  switch (PyArray_TYPE(a)) {
    case NPY_FLOAT32: return sp::ort::kFloat;
    case NPY_FLOAT64: return sp::ort::kDouble;
    case NPY_FLOAT16: return sp::ort::kFloat16;
    case NPY_INT8: return sp::ort::kInt8;
    case NPY_UINT8: return sp::ort::kUint8;
    case NPY_INT16: return sp::ort::kInt16;
    case NPY_UINT16: return sp::ort::kUint16;
    case NPY_INT32: return sp::ort::kInt32;
    case NPY_UINT32: return sp::ort::kUint32;
    case NPY_UINT64: return sp::ort::kUint64;
    case NPY_BOOL: return sp::ort::kBool;
    default:
      if (PyArray_ISSIGNED(a) && PyArray_ITEMSIZE(a) == 8) return sp::ort::kInt64;
      return 0;
  }
}

void make_engine(PyEngine* self, const std::string& library, const std::string& model_path, nb::list params,
                 nb::list sessions, std::vector<int> lane_session, std::vector<std::string> input_names,
                 std::vector<std::string> output_names, int global_intra, int global_inter) {
  std::string err;
  const sp::ort::Api* api = sp::ort::load_api(library, err);
  if (!api) throw std::runtime_error(err);
  std::vector<sp::ort::Parameter> ps;
  std::vector<nb::object> keep;
  for (nb::handle item : params) {  // (name, C-contiguous ndarray)
    nb::tuple t = nb::cast<nb::tuple>(item);
    if (!PyArray_Check(t[1].ptr())) throw std::runtime_error("a parameter is not a numpy array");
    auto* a = reinterpret_cast<PyArrayObject*>(t[1].ptr());
    int type = ort_type(a);
    if (!PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISNOTSWAPPED(a) || type == 0)
      throw std::runtime_error("parameter " + nb::cast<std::string>(t[0]) + " is not a contiguous numeric array");
    sp::ort::Parameter p;
    p.name = nb::cast<std::string>(t[0]);
    p.data = PyArray_DATA(a);
    p.bytes = size_t(PyArray_NBYTES(a));
    p.shape.assign(PyArray_DIMS(a), PyArray_DIMS(a) + PyArray_NDIM(a));
    p.element_type = type;
    ps.push_back(std::move(p));
    keep.push_back(nb::borrow(t[1]));
  }
  std::vector<sp::ort::SessionSpec> specs;
  for (nb::handle item : sessions) {  // (per_session_threads, intra, inter, affinities, cuda options)
    nb::tuple t = nb::cast<nb::tuple>(item);
    sp::ort::SessionSpec s;
    s.per_session_threads = nb::cast<bool>(t[0]);
    s.intra_threads = nb::cast<int>(t[1]);
    s.inter_threads = nb::cast<int>(t[2]);
    s.affinities = nb::cast<std::string>(t[3]);
    for (auto kv : nb::cast<nb::dict>(t[4])) s.cuda.emplace_back(nb::cast<std::string>(kv.first), nb::cast<std::string>(kv.second));
    specs.push_back(std::move(s));
  }
  std::unique_ptr<sp::ort::Engine> engine;
  {
    nb::gil_scoped_release nogil;  // session creation takes a while; the arrays are kept alive
    engine = std::make_unique<sp::ort::Engine>(api, model_path, ps, specs, std::move(lane_session),
                                               std::move(input_names), std::move(output_names),
                                               global_intra, global_inter);
  }
  new (self) PyEngine{std::move(engine), std::move(keep)};
}

nb::object as_bytes(const std::string& out) {
  return nb::steal(PyBytes_FromStringAndSize(out.data(), Py_ssize_t(out.size())));
}

nb::object engine_serve(const PyEngine& self, const PyPlan& pp, int lane, nb::handle data) {
  Borrowed in(data);
  std::string out, error;
  sp::ort::Engine::Result result;
  {
    nb::gil_scoped_release nogil;  // the whole request: parse, convert, run, encode
    result = self.engine->serve(pp.plan, lane, in.data(), in.size(), out, error);
  }
  if (result != sp::ort::Engine::Result::kOk) return nb::none();
  return as_bytes(out);
}

// serve() with its stages' end times: (response bytes or None, (start, decoded, ran, encoded,
// rows)) -- a traced request's spans (processor/dataplane/stages.py).
nb::object engine_serve_timed(const PyEngine& self, const PyPlan& pp, int lane, nb::handle data) {
  Borrowed in(data);
  std::string out, error;
  sp::ort::Engine::Stamps st;
  sp::ort::Engine::Result result;
  {
    nb::gil_scoped_release nogil;
    result = self.engine->serve(pp.plan, lane, in.data(), in.size(), out, error, &st);
  }
  if (result != sp::ort::Engine::Result::kOk) return nb::none();
  return nb::make_tuple(as_bytes(out), nb::make_tuple(st.start, st.decoded, st.ran, st.encoded, st.rows));
}

int numpy_type(sp::Elem elem) {
  switch (elem) {
    case sp::Elem::F32: return NPY_FLOAT32;
    case sp::Elem::F64: return NPY_FLOAT64;
    case sp::Elem::HALF: return NPY_FLOAT16;  // the engine's float16 values, as they are
    case sp::Elem::I8: return NPY_INT8;
    case sp::Elem::U8: return NPY_UINT8;
    case sp::Elem::I16: return NPY_INT16;
    case sp::Elem::U16: return NPY_UINT16;
    case sp::Elem::I32: return NPY_INT32;
    case sp::Elem::I64: return NPY_INT64;
    case sp::Elem::BOOL: return NPY_BOOL;
    default: return -1;  // strings: the binding session returns them
  }
}

// ONNX Runtime outputs, released when the scope ends.
struct Outputs {
  const sp::ort::Engine& engine;
  std::vector<sp::ort::Value*> values;
  ~Outputs() {
    for (sp::ort::Value* v : values) engine.release(v);
  }
};

// Arrays in, arrays out: `inputs` [(input index, array)] run on `lane` for the outputs `fetch`
// (indices), without the GIL over the arrays' own memory; the outputs copied into new arrays.
// None where the binding session must run the call: an array this path does not feed (not
// C-contiguous, byte-swapped, strings), an engine error (the binding reports it), an output of
// a type this path does not return.
nb::object engine_run_arrays(const PyEngine& self, int lane, nb::list inputs, const std::vector<int>& fetch) {
  const sp::ort::Engine& engine = *self.engine;
  size_t n = inputs.size();
  std::vector<const char*> names(n);
  std::vector<void*> data(n);
  std::vector<size_t> bytes(n);
  std::vector<std::vector<int64_t>> shapes(n);
  std::vector<int> types(n);
  for (size_t i = 0; i < n; ++i) {
    nb::tuple item = nb::cast<nb::tuple>(inputs[i]);  // (input index, array)
    int index = nb::cast<int>(item[0]);
    if (index < 0 || index >= engine.inputs() || !PyArray_Check(item[1].ptr())) return nb::none();
    auto* a = reinterpret_cast<PyArrayObject*>(item[1].ptr());
    types[i] = ort_type(a);
    if (!types[i] || !PyArray_ISCARRAY_RO(a) || !PyArray_ISNOTSWAPPED(a)) return nb::none();
    names[i] = engine.input_name(index).c_str();
    data[i] = PyArray_DATA(a);
    bytes[i] = size_t(PyArray_NBYTES(a));
    shapes[i].assign(PyArray_DIMS(a), PyArray_DIMS(a) + PyArray_NDIM(a));
  }
  for (int k : fetch)
    if (k < 0 || k >= engine.outputs()) return nb::none();
  Outputs outs{engine, {}};
  sp::ort::Engine::Result result = sp::ort::Engine::Result::kNotTaken;
  {
    nb::gil_scoped_release nogil;  // the arrays stay alive: `inputs` holds them
    std::vector<sp::ort::Value*> values(n, nullptr);
    bool ok = true;
    for (size_t i = 0; i < n && ok; ++i) {
      values[i] = engine.tensor(data[i], bytes[i], shapes[i], types[i]);
      ok = values[i] != nullptr;
    }
    std::string error;
    if (ok) result = engine.run(lane, names.data(), values.data(), n, fetch, outs.values, error);
    for (sp::ort::Value* v : values) engine.release(v);
  }
  if (result != sp::ort::Engine::Result::kOk) return nb::none();
  nb::list arrays;
  for (sp::ort::Value* v : outs.values) {
    sp::Output o;
    int type = engine.describe(v, o) ? numpy_type(o.elem) : -1;
    if (type < 0) return nb::none();
    std::vector<npy_intp> dims(o.shape.begin(), o.shape.end());
    PyObject* a = PyArray_SimpleNew(int(dims.size()), dims.data(), type);
    if (!a) throw nb::python_error();
    nb::object array = nb::steal(a);
    auto* dst = reinterpret_cast<PyArrayObject*>(a);
    std::memcpy(PyArray_DATA(dst), o.data, size_t(PyArray_NBYTES(dst)));
    arrays.append(array);
  }
  return arrays;
}

// A queued request: its ticket and the caller's buffer, held until the ticket is destroyed (the
// queue keeps views into it; the ticket's deleter waits until it is answered, without the GIL).
struct PyTicket {
  Borrowed in;
  sp::Batcher::TicketPtr ticket;
  explicit PyTicket(nb::handle data) : in(data) {}
  ~PyTicket() {
    nb::gil_scoped_release nogil;  // a batch thread may need the GIL (a runner) to answer it
    ticket.reset();
  }
};

// A Runner calling a Python callable `runner(requests, lane)` on the batch thread: `requests` a
// list of read-only memoryviews of the callers' buffers (valid during the call only: the
// callable must not keep them), answered by a list of bytes (or None: not taken) in order.
// An exception leaves the batch unanswered (its callers serve their requests another way).
sp::Runner python_runner(nb::handle runner) {
  PyObject* fn = runner.ptr();
  return [fn](std::vector<sp::BatchItem>& items, int lane) {
    nb::gil_scoped_acquire gil;
    try {
      nb::list views;
      for (const sp::BatchItem& item : items)
        views.append(nb::steal(PyMemoryView_FromMemory(
            reinterpret_cast<char*>(const_cast<uint8_t*>(item.data)), Py_ssize_t(item.size), PyBUF_READ)));
      nb::object answers = nb::borrow(fn)(views, lane);
      for (nb::handle v : views) v.attr("release")();  // a view kept past the call reads nothing
      size_t i = 0;
      for (nb::handle answer : answers) {
        if (i >= items.size()) break;
        if (PyBytes_Check(answer.ptr())) {
          char* p = nullptr;
          Py_ssize_t n = 0;
          PyBytes_AsStringAndSize(answer.ptr(), &p, &n);
          items[i].out->assign(p, size_t(n));
          items[i].answered = true;
        }
        ++i;
      }
    } catch (nb::python_error& e) {
      e.discard_as_unraisable("processor._native batch runner");
    }
  };
}

void make_batcher(PyBatcher* self, nb::handle plan, nb::handle engine, nb::handle runner, nb::handle budget,
                  int lanes, int64_t max_rows, int64_t timeout_us, int threads, std::vector<int64_t> allowed,
                  std::vector<double> size_bounds, std::vector<double> wait_bounds) {
  const PyPlan& p = nb::cast<const PyPlan&>(plan);
  sp::RowBudget& b = nb::cast<sp::RowBudget&>(budget);
  const sp::ort::Engine* e = engine.is_none() ? nullptr : nb::cast<const PyEngine&>(engine).engine.get();
  if ((e == nullptr) == runner.is_none()) throw std::invalid_argument("give an engine or a runner");
  if (e != nullptr) lanes = e->lanes();
  if (lanes < 1) throw std::invalid_argument("lanes must be >= 1");
  sp::BatchSettings s;
  s.max_rows = max_rows;
  s.timeout_us = timeout_us;
  s.threads = threads;
  s.allowed = std::move(allowed);
  s.size_bounds = std::move(size_bounds);
  s.wait_bounds = std::move(wait_bounds);
  sp::Runner run = runner.is_none() ? sp::Runner() : python_runner(runner);
  new (self) PyBatcher{std::make_unique<sp::Batcher>(e, std::move(run), lanes, p.plan, b, std::move(s)),
                       nb::borrow(plan), nb::borrow(engine), nb::borrow(runner), nb::borrow(budget)};
}

nb::object refused(sp::Batcher::Status status) {
  switch (status) {
    case sp::Batcher::Status::kFull: return nb::str("full");
    case sp::Batcher::Status::kClosed: return nb::str("closed");
    case sp::Batcher::Status::kExpired: return nb::str("expired");
    default: return nb::none();  // kNotTaken
  }
}

nb::object batcher_submit(PyBatcher& self, nb::handle data, double deadline, int notify_fd) {
  auto queued = std::make_unique<PyTicket>(data);
  sp::Batcher::Status status;
  {
    nb::gil_scoped_release nogil;  // parse, convert, queue
    queued->ticket = self.batcher->enqueue(queued->in.data(), queued->in.size(), deadline, status, notify_fd);
  }
  if (status != sp::Batcher::Status::kOk) return refused(status);
  return nb::cast(queued.release(), nb::rv_policy::take_ownership);
}

nb::object ticket_wait(PyTicket& self) {
  sp::Batcher::Status status;
  {
    nb::gil_scoped_release nogil;  // the batch runs on the batcher's threads
    status = sp::Batcher::wait(*self.ticket);
  }
  if (status == sp::Batcher::Status::kOk) return as_bytes(sp::Batcher::response(*self.ticket));
  return refused(status);
}

nb::dict batcher_stats(const PyBatcher& self) {
  using S = sp::BatchStats;
  static const std::pair<const char*, int64_t S::*> counters[] = {
      {"batches", &S::batches},
      {"requests", &S::requests},
      {"rows", &S::rows},
      {"padding_rows", &S::padding_rows},
      {"isolated_retries", &S::isolated_retries},
      {"rejected_queue_full", &S::rejected_queue_full},
      {"expired", &S::expired},
      {"queued_requests", &S::queued_requests},
      {"queued_rows", &S::queued_rows}};
  S s = self.batcher->stats();
  nb::dict d;
  for (const auto& [name, field] : counters) d[name] = s.*field;
  d["size_counts"] = s.size_counts;  // histograms: counts per bound (+Inf last) and the sum
  d["size_sum"] = s.size_sum;
  d["wait_counts"] = s.wait_counts;
  d["wait_sum"] = s.wait_sum;
  return d;
}

}  // namespace

void bind_engine(nb::module_& m) {
  nb::class_<PyEngine>(m, "OrtEngine")
      .def("__init__", &make_engine, nb::arg("library"), nb::arg("model_path"), nb::arg("parameters"),
           nb::arg("sessions"), nb::arg("lane_session"), nb::arg("input_names"), nb::arg("output_names"),
           nb::arg("global_intra"), nb::arg("global_inter"),
           "Sessions over the caller's parameter arrays (see native/src/ort_engine.h); RuntimeError "
           "naming what failed")
      .def("serve", &engine_serve, nb::arg("plan"), nb::arg("lane"), nb::arg("data"),
           "PredictRequest bytes -> PredictResponse bytes on `lane`, without the GIL; None when "
           "the request is for the reference path (invalid, rare forms, an engine error)")
      .def("serve_timed", &engine_serve_timed, nb::arg("plan"), nb::arg("lane"), nb::arg("data"),
           "serve, with its stages' end times: (response bytes, (start, decoded, ran, encoded, rows)) "
           "in ns since the epoch (rows -1: none per row), or None as serve")
      .def("run_arrays", &engine_run_arrays, nb::arg("lane"), nb::arg("inputs"), nb::arg("fetch"),
           "[(input index, array)] -> [output arrays] of the outputs `fetch` (indices) on `lane`, "
           "without the GIL; None when the binding session must run the call");
  nb::class_<sp::RowBudget>(m, "RowBudget")
      .def(nb::init<int64_t>(), nb::arg("capacity"),
           "One model's batching queue capacity in rows, shared by all its queues (lock-free)")
      .def("try_take", &sp::RowBudget::try_take, nb::arg("rows"), "take `rows` if they fit; False if not")
      .def("give", &sp::RowBudget::give, nb::arg("rows"), "give back rows taken")
      .def_prop_ro("used", &sp::RowBudget::used)
      .def_prop_ro("capacity", &sp::RowBudget::capacity);
  nb::class_<PyTicket>(m, "BatchTicket")
      .def("wait", &ticket_wait,
           "block (without the GIL) until the batch ran: PredictResponse bytes; None: handed back, "
           "serve it another way; 'expired': its deadline passed before it ran")
      .def_prop_ro(
          "done", [](PyTicket& self) { return sp::Batcher::done(*self.ticket); },
          "whether the batch ran (wait() returns at once); never blocks on the batch");
  nb::class_<PyBatcher>(m, "Batcher")
      .def("__init__", &make_batcher, nb::arg("plan"), nb::arg("engine").none(), nb::arg("runner").none(),
           nb::arg("budget"), nb::arg("lanes"), nb::arg("max_rows"), nb::arg("timeout_us"), nb::arg("threads"),
           nb::arg("allowed"), nb::arg("size_bounds"), nb::arg("wait_bounds"),
           "A batching queue running batches on an OrtEngine's lanes or through runner(requests, lane), "
           "taking its rows from a RowBudget (see native/src/batcher.h)")
      .def("submit", &batcher_submit, nb::arg("data"), nb::arg("deadline"), nb::arg("notify_fd") = -1,
           "queue PredictRequest bytes (kept until the ticket is gone) to merge with concurrent requests, "
           "without the GIL: a BatchTicket; None: not taken, serve it another way; 'full' / 'closed' / "
           "'expired': refused. notify_fd >= 0: an eventfd the batch thread adds 1 to once the ticket is "
           "answered (kept open until then)")
      .def("stats", &batcher_stats, "counters and histogram counts")
      .def("close",
           [](PyBatcher& self) {
             nb::gil_scoped_release nogil;
             self.batcher->close();
           },
           "run what is queued, refuse the rest, stop the threads");
}

}  // namespace sp::py
