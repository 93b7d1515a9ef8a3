// module.cc -- processor._native: the request path's native codec (nanobind module).
//
//   Plan(inputs, outputs)      a signature compiled for decode(); immutable, shared by threads
//   decode(plan, data)         PredictRequest bytes -> (feeds, response keys, output aliases), or None
//   encode(keys, arrays)       response keys + output arrays -> PredictResponse bytes, or None
//   fingerprint64(values, num_buckets=0)   object array of bytes/str -> uint64 Fingerprint64 array
//                              (num_buckets: int64 StringToHashBucketFast), or None
//   OrtEngine, Batcher         whole requests on ONNX Runtime and the batching queue: module_engine.cc
//   predict_log_tail(request, response, aliases)  a served wire call -> PredictionLog bytes, or None
//   find_rows, TableSet, RowCache, CacheSet  the embedding stores' index probe, row gather, hot-row cache:
//                              module_store.cc
//
// None always means "not taken by the fast path": the caller runs the Python reference
// (processor/codec.py, processor/engine/string_hash.py), which produces the result or the exact
// error. Parsing, value conversion, hashing and response writing run without the GIL once a
// request or response is large enough for the hand-over to pay (kReleaseBytes); numpy arrays and
// Python objects are made with it. Every function is thread-safe.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL SP_NATIVE_ARRAY_API  // the name numpy_api.h gives it too
#include <numpy/arrayobject.h>

#include <cstring>
#include <memory>
#include <optional>

#include "fingerprint.h"
#include "gil.h"
#include "module_engine.h"
#include "module_json.h"
#include "module_otlp.h"
#include "module_store.h"
#include "predict_log.h"
#include "request.h"
#include "response.h"

namespace nb = nanobind;
using sp::py::kReleaseBytes;
using sp::py::MaybeRelease;
using sp::py::PyPlan;

namespace {

std::string key_of(nb::handle h) { return nb::cast<std::string>(h); }

PyPlan* make_plan(nb::list inputs, nb::list outputs) {
  auto p = std::make_unique<PyPlan>();
  for (nb::handle item : inputs) {
    nb::tuple t = nb::cast<nb::tuple>(item);  // (alias, name, dtype, shape | None, fingerprint)
    sp::InputSpec spec;
    spec.alias = key_of(t[0]);
    spec.dtype = nb::cast<int32_t>(t[2]);
    if (!t[3].is_none()) {
      spec.has_shape = true;
      for (nb::handle d : t[3]) spec.shape.push_back(nb::cast<int64_t>(d));
    }
    spec.fingerprint = nb::cast<bool>(t[4]);
    int index = int(p->plan.inputs.size());
    p->plan.input_keys[key_of(t[1])] = index;
    p->input_aliases.push_back(nb::borrow(t[0]));
    p->plan.inputs.push_back(std::move(spec));
  }
  for (size_t i = 0; i < p->plan.inputs.size(); ++i) p->plan.input_keys[p->plan.inputs[i].alias] = int(i);
  std::vector<std::string> names;
  for (nb::handle item : outputs) {
    nb::tuple t = nb::cast<nb::tuple>(item);  // (alias, name)
    p->plan.output_aliases.push_back(key_of(t[0]));
    names.push_back(key_of(t[1]));
    p->output_aliases.push_back(nb::borrow(t[0]));
  }
  for (size_t i = 0; i < names.size(); ++i) p->plan.output_keys[names[i]] = int(i);
  for (size_t i = 0; i < names.size(); ++i) p->plan.output_keys[p->plan.output_aliases[i]] = int(i);
  nb::list all;
  for (const nb::object& alias : p->output_aliases) all.append(alias);
  p->all_aliases = nb::tuple(all);
  return p.release();
}

int numpy_type(const sp::InputSpec& spec) {
  if (spec.fingerprint) return NPY_UINT64;
  switch (spec.dtype) {
    case sp::DT_FLOAT: return NPY_FLOAT32;
    case sp::DT_DOUBLE: return NPY_FLOAT64;
    case sp::DT_INT32: return NPY_INT32;
    case sp::DT_UINT8: return NPY_UINT8;
    case sp::DT_INT16: return NPY_INT16;
    case sp::DT_INT8: return NPY_INT8;
    case sp::DT_UINT16: return NPY_UINT16;
    case sp::DT_INT64: return NPY_INT64;
    case sp::DT_BOOL: return NPY_BOOL;
    default: return NPY_OBJECT;
  }
}

nb::object new_array(const std::vector<int64_t>& shape, int type) {
  std::vector<npy_intp> dims(shape.begin(), shape.end());
  PyObject* a = PyArray_SimpleNew(int(dims.size()), dims.data(), type);
  if (!a) throw nb::python_error();
  return nb::steal(a);
}

nb::object decode(const PyPlan& pp, nb::handle data) {
  Py_buffer view;
  if (PyObject_GetBuffer(data.ptr(), &view, PyBUF_SIMPLE) != 0) throw nb::python_error();
  std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> guard(&view, PyBuffer_Release);
  const sp::Plan& plan = pp.plan;
  const auto* bytes = static_cast<const uint8_t*>(view.buf);
  size_t size = size_t(view.len);
  bool release = size >= kReleaseBytes;

  sp::ParsedRequest req;
  bool ok;
  {
    MaybeRelease nogil(release);
    ok = sp::parse_request(bytes, size, plan, req);
  }
  if (!ok) return nb::none();

  nb::dict feeds;
  std::vector<void*> targets(req.inputs.size(), nullptr);
  for (size_t i = 0; i < req.inputs.size(); ++i) {
    const sp::ParsedInput& in = req.inputs[i];
    const sp::InputSpec& spec = plan.inputs[in.spec];
    int type = numpy_type(spec);
    nb::object array = new_array(in.shape, type);
    auto* arr = reinterpret_cast<PyArrayObject*>(array.ptr());
    if (type == NPY_OBJECT) {  // a string input the engine takes as bytes objects
      auto** slots = static_cast<PyObject**>(PyArray_DATA(arr));
      for (size_t k = 0; k < in.strings.size(); ++k) {
        PyObject* b = PyBytes_FromStringAndSize(reinterpret_cast<const char*>(in.strings[k].p),
                                                Py_ssize_t(in.strings[k].n));
        if (!b) throw nb::python_error();
        Py_XSETREF(slots[k], b);
      }
    } else {
      targets[i] = PyArray_DATA(arr);
    }
    feeds[pp.input_aliases[in.spec]] = array;
  }
  {
    MaybeRelease nogil(release);
    for (size_t i = 0; i < req.inputs.size() && ok; ++i)
      if (targets[i]) ok = sp::fill_values(plan, req.inputs[i], targets[i], bytes + size);
  }
  if (!ok) return nb::none();

  if (req.output_filter.empty()) return nb::make_tuple(feeds, pp.all_aliases, pp.all_aliases);
  nb::list keys, aliases;
  for (size_t k = 0; k < req.output_filter.size(); ++k) {
    const sp::Span& s = req.output_filter[k];
    keys.append(nb::str(reinterpret_cast<const char*>(s.p), s.n));
    aliases.append(pp.output_aliases[req.output_index[k]]);
  }
  return nb::make_tuple(feeds, nb::tuple(keys), nb::tuple(aliases));
}

// The wire form of one output array; false for what the reference must encode.
bool describe_output(PyArrayObject* a, sp::Output& o) {
  PyArray_Descr* d = PyArray_DESCR(a);
  if (!PyArray_ISNOTSWAPPED(a)) return false;
  char kind = d->kind;
  npy_intp item = PyArray_ITEMSIZE(a);
  using sp::Elem;
  if (kind == 'f' && item == 4) o.elem = Elem::F32, o.dtype = sp::DT_FLOAT;
  else if (kind == 'f' && item == 8) o.elem = Elem::F64, o.dtype = sp::DT_DOUBLE;
  else if (kind == 'f' && item == 2) o.elem = Elem::HALF, o.dtype = sp::DT_HALF;
  else if (kind == 'i' && item == 4) o.elem = Elem::I32, o.dtype = sp::DT_INT32;
  else if (kind == 'i' && item == 8) o.elem = Elem::I64, o.dtype = sp::DT_INT64;
  else if (kind == 'i' && item == 2) o.elem = Elem::I16, o.dtype = sp::DT_INT16;
  else if (kind == 'i' && item == 1) o.elem = Elem::I8, o.dtype = sp::DT_INT8;
  else if (kind == 'u' && item == 1) o.elem = Elem::U8, o.dtype = sp::DT_UINT8;
  else if (kind == 'u' && item == 2) o.elem = Elem::U16, o.dtype = sp::DT_UINT16;
  else if (kind == 'b') o.elem = Elem::BOOL, o.dtype = sp::DT_BOOL;
  else if (kind == 'O') o.elem = Elem::BYTES, o.dtype = sp::DT_STRING;
  else return false;
  int nd = PyArray_NDIM(a);
  npy_intp* dims = PyArray_DIMS(a);
  o.shape.assign(dims, dims + nd);
  o.count = size_t(PyArray_SIZE(a));
  o.data = PyArray_DATA(a);
  if (o.elem == Elem::BYTES) {
    auto** items = static_cast<PyObject**>(PyArray_DATA(a));
    o.strings.reserve(o.count);
    for (size_t i = 0; i < o.count; ++i) {
      if (!items[i] || !PyBytes_Check(items[i])) return false;
      sp::Span s;
      s.p = reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(items[i]));
      s.n = size_t(PyBytes_GET_SIZE(items[i]));
      o.strings.push_back(s);
    }
  }
  return true;
}

nb::object encode(nb::handle keys, nb::handle arrays) {
  nb::object key_seq = nb::steal(PySequence_Fast(keys.ptr(), "keys must be a sequence"));
  nb::object array_seq = nb::steal(PySequence_Fast(arrays.ptr(), "arrays must be a sequence"));
  if (!key_seq || !array_seq) throw nb::python_error();
  Py_ssize_t n = PySequence_Fast_GET_SIZE(key_seq.ptr());
  if (PySequence_Fast_GET_SIZE(array_seq.ptr()) != n) return nb::none();
  PyObject** key_items = PySequence_Fast_ITEMS(key_seq.ptr());
  PyObject** array_items = PySequence_Fast_ITEMS(array_seq.ptr());
  std::vector<sp::Output> outputs;
  std::vector<nb::object> keep;  // contiguous arrays whose memory the outputs point into
  outputs.reserve(size_t(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!PyUnicode_Check(key_items[i]) || !PyArray_Check(array_items[i])) return nb::none();
    Py_ssize_t klen;
    const char* k = PyUnicode_AsUTF8AndSize(key_items[i], &klen);
    if (!k) throw nb::python_error();
    for (const sp::Output& seen : outputs)  // the reference keeps one entry per key: the last
      if (seen.key == std::string_view(k, size_t(klen))) return nb::none();
    PyObject* c = reinterpret_cast<PyObject*>(
        PyArray_GETCONTIGUOUS(reinterpret_cast<PyArrayObject*>(array_items[i])));
    if (!c) throw nb::python_error();
    keep.push_back(nb::steal(c));
    sp::Output o;
    o.key = std::string_view(k, size_t(klen));  // the key str lives in `keys`
    if (!describe_output(reinterpret_cast<PyArrayObject*>(c), o)) return nb::none();
    outputs.push_back(std::move(o));
  }
  size_t size = sp::response_size(outputs);
  PyObject* out = PyBytes_FromStringAndSize(nullptr, Py_ssize_t(size));
  if (!out) throw nb::python_error();
  {
    // The bytes object is not shared yet and every source is kept alive by `keep` / `items`.
    MaybeRelease nogil(size >= kReleaseBytes);
    sp::write_response(outputs, reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(out)));
  }
  return nb::steal(out);
}

// num_buckets > 0: TensorFlow's StringToHashBucketFast instead, int64 Fingerprint64 % num_buckets.
nb::object fingerprint64(nb::handle values, uint64_t num_buckets) {
  if (!PyArray_Check(values.ptr())) return nb::none();
  auto* a = reinterpret_cast<PyArrayObject*>(values.ptr());
  if (PyArray_TYPE(a) != NPY_OBJECT) return nb::none();
  nb::object contiguous = nb::steal(reinterpret_cast<PyObject*>(PyArray_GETCONTIGUOUS(a)));
  if (!contiguous) throw nb::python_error();
  auto* c = reinterpret_cast<PyArrayObject*>(contiguous.ptr());
  size_t n = size_t(PyArray_SIZE(c));
  auto** items = static_cast<PyObject**>(PyArray_DATA(c));
  std::vector<sp::Span> spans(n);
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    PyObject* v = items[i];
    if (v && PyBytes_Check(v)) {
      spans[i].p = reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(v));
      spans[i].n = size_t(PyBytes_GET_SIZE(v));
    } else if (v && PyUnicode_Check(v)) {
      Py_ssize_t len;
      const char* u = PyUnicode_AsUTF8AndSize(v, &len);  // cached in the str object
      if (!u) {
        PyErr_Clear();
        return nb::none();
      }
      spans[i].p = reinterpret_cast<const uint8_t*>(u);
      spans[i].n = size_t(len);
    } else {
      return nb::none();  // the reference raises the TypeError
    }
    total += spans[i].n;
  }
  std::vector<int64_t> shape(PyArray_DIMS(c), PyArray_DIMS(c) + PyArray_NDIM(c));
  nb::object out = new_array(shape, num_buckets ? NPY_INT64 : NPY_UINT64);
  auto* dst = static_cast<uint64_t*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(out.ptr())));
  {
    MaybeRelease nogil(total + n * 16 >= kReleaseBytes);
    for (size_t i = 0; i < n; ++i) dst[i] = sp::fingerprint64(spans[i].p, spans[i].n);
    if (num_buckets)  // < num_buckets <= 2**64 - 1: the int64 cast keeps TensorFlow's bits
      for (size_t i = 0; i < n; ++i) dst[i] %= num_buckets;
  }
  return out;
}

nb::object predict_log_tail(nb::bytes request, nb::bytes response, nb::dict aliases) {
  std::unordered_map<std::string, std::string> names;
  for (auto [key, alias] : aliases) names.emplace(key_of(key), key_of(alias));
  sp::Span req{reinterpret_cast<const uint8_t*>(request.c_str()), request.size()};
  sp::Span resp{reinterpret_cast<const uint8_t*>(response.c_str()), response.size()};
  std::string out;
  bool ok;
  {
    MaybeRelease unlocked(req.n + resp.n >= kReleaseBytes);  // bytes are immutable: safe unlocked
    ok = sp::predict_log_tail(req, resp, names, out);
  }
  if (!ok) return nb::none();
  return nb::bytes(out.data(), out.size());
}

// Whether the request decoder packs varints with pext (sp::varint_pext()); `on` switches it, for
// the tests that check both paths against the reference. False where the build has no pext path.
bool varint_pext(std::optional<bool> on) {
#ifdef SP_VARINT_PEXT
  if (on) sp::varint_pext().store(*on && sp::pext_is_fast());
  return sp::varint_pext().load();
#else
  (void)on;
  return false;
#endif
}

}  // namespace

NB_MODULE(_native, m) {
  if (_import_array() < 0) throw nb::python_error();
  m.doc() = "The request path's native codec, engine and batcher; see native/src/module*.cc.";
  m.attr("RELEASE_GIL_BYTES") = kReleaseBytes;
  nb::class_<PyPlan>(m, "Plan")
      .def("__init__",
           [](PyPlan* self, nb::list inputs, nb::list outputs) {
             std::unique_ptr<PyPlan> p(make_plan(inputs, outputs));
             new (self) PyPlan(std::move(*p));
           },
           nb::arg("inputs"), nb::arg("outputs"),
           "inputs: [(alias, tensor name, dtype, shape or None, fingerprint)], outputs: "
           "[(alias, tensor name)]");
  sp::py::bind_engine(m);
  sp::py::bind_direct(m);
  sp::py::bind_store(m);
  sp::py::bind_json(m);
  sp::py::bind_otlp(m);
  m.def("decode", &decode, nb::arg("plan"), nb::arg("data"));
  m.def("encode", &encode, nb::arg("keys"), nb::arg("arrays"));
  m.def("fingerprint64", &fingerprint64, nb::arg("values"), nb::arg("num_buckets") = 0);
  m.def("predict_log_tail", &predict_log_tail, nb::arg("request"), nb::arg("response"), nb::arg("aliases"));
  m.def("varint_pext", &varint_pext, nb::arg("on") = nb::none(),
        "Whether int varints are decoded with BMI2's pext (set from the CPU); on: switch it (tests)");
}
