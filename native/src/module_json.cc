// module_json.cc -- the JSON edges' native parts (TF Serving REST, KServe v2 JSON), in
// processor._native:
//
//   json_array(value, type_num, count=-1)   parsed JSON values (nested lists of int / float) ->
//                              a numpy array of type_num, or None
//   json_numbers(array)        a numeric numpy array -> the JSON text of array.tolist(), or None
//   scan_tfs(body) -> TfsScan  a TF Serving REST predict body read into numbers per input
//                              (tfs_scan.h), or None; TfsScan.arrays(type_nums) its arrays, or None
//   json_depth(body, limit)    how deeply body nests arrays and objects, counted up to
//                              limit + 1 (json_depth.h)
//
// As for the codec (module.cc), None means "not taken": the caller runs the Python reference
// (server/tfserving/rest_json_values.py, server/kserve/open_inference.py, orjson), which gives the result or
// the exact error. So json_array takes only what the reference would accept, the same way:
// booleans, strings, empty lists, integers beyond int64, a value out of the type's range, a
// finite number that would become infinity are all left to it. json_numbers writes what
// orjson writes for the same Python values (the same doubles read back); non-finite floats
// are left to the reference (TF Serving's NaN tokens, v2's refusal).
//
// json_array reads Python objects with the GIL held (it gives the GIL up to convert a large
// value's numbers); scan_tfs, TfsScan.arrays and json_numbers give it up for large inputs. All
// are thread-safe.
#include "module_json.h"

#include <nanobind/stl/vector.h>

#include "numpy_api.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gil.h"
#include "json_depth.h"
#include "json_numbers.h"
#include "json_values.h"
#include "tfs_scan.h"

namespace nb = nanobind;

namespace sp::py {
namespace {

constexpr int kMaxDepth = 64;  // numpy's most dimensions: the reference's bound

// The numbers of a JSON value, read from the caller's lists.
using Leaves = sp::json::Numbers;

bool leaf(PyObject* v, Leaves& out) {
  if (PyFloat_CheckExact(v)) {
    out.add_real(PyFloat_AS_DOUBLE(v));
  } else if (PyLong_CheckExact(v)) {
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) return false;  // past int64: numpy reads it otherwise
    out.add_int(n);
  } else {  // bool, str, dict, None, a list where a number belongs
    return false;
  }
  return true;
}

// numpy's reading of nested lists (np.asarray): every list at one depth of the same length.
bool walk_natural(PyObject* v, size_t depth, const std::vector<npy_intp>& shape, Leaves& out) {
  if (depth == shape.size()) return leaf(v, out);
  if (!PyList_CheckExact(v) || PyList_GET_SIZE(v) != shape[depth]) return false;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); ++i)
    if (!walk_natural(PyList_GET_ITEM(v, i), depth + 1, shape, out)) return false;
  return true;
}

// KServe v2's reading: every number of any nesting, in order.
bool walk_flat(PyObject* v, int depth, Leaves& out) {
  if (!PyList_CheckExact(v)) return leaf(v, out);
  if (depth >= kMaxDepth) return false;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); ++i)
    if (!walk_flat(PyList_GET_ITEM(v, i), depth + 1, out)) return false;
  return true;
}

// The element type a numpy type number converts to; false for the types the reference converts.
bool elem_of(int type, sp::json::Elem& elem) {
  using sp::json::Elem;
  switch (type) {
    case NPY_FLOAT32: elem = Elem::F32; return true;
    case NPY_FLOAT64: elem = Elem::F64; return true;
    case NPY_INT64: elem = Elem::I64; return true;
    case NPY_INT32: elem = Elem::I32; return true;
    case NPY_INT16: elem = Elem::I16; return true;
    case NPY_INT8: elem = Elem::I8; return true;
    case NPY_UINT64: elem = Elem::U64; return true;
    case NPY_UINT32: elem = Elem::U32; return true;
    case NPY_UINT16: elem = Elem::U16; return true;
    case NPY_UINT8: elem = Elem::U8; return true;
    default: return false;
  }
}

// A new array of `type` and `shape` holding `numbers` (sp::json::convert's rules), or None
// where the reference decides.
nb::object make_array(int type, const std::vector<npy_intp>& shape, const sp::json::Numbers& numbers,
                      bool ints_via_double) {
  sp::json::Elem elem;
  if (!elem_of(type, elem)) return nb::none();
  PyObject* a = PyArray_SimpleNew(int(shape.size()), shape.data(), type);
  if (!a) throw nb::python_error();
  nb::object array = nb::steal(a);
  if (size_t(PyArray_SIZE(reinterpret_cast<PyArrayObject*>(a))) != numbers.size()) return nb::none();  // never past it
  bool ok;
  {
    MaybeRelease nogil(numbers.size() * 8 >= kReleaseBytes);
    ok = sp::json::convert(numbers, elem, ints_via_double, PyArray_DATA(reinterpret_cast<PyArrayObject*>(a)));
  }
  return ok ? array : nb::none();
}

// count < 0: TF Serving's reading (numpy's shape of the nested lists; integers alone convert
// straight to the type, mixed with floats through float64). count >= 0: KServe v2's (the
// numbers of any nesting, exactly count of them, a flat array; through float64 for a float type).
nb::object json_array(nb::handle value, int type, int64_t count) {
  sp::json::Elem elem;
  if (!elem_of(type, elem) || !PyList_CheckExact(value.ptr())) return nb::none();
  Leaves leaves;
  std::vector<npy_intp> shape;
  if (count < 0) {
    PyObject* v = value.ptr();
    while (PyList_CheckExact(v)) {
      if (PyList_GET_SIZE(v) == 0 || shape.size() >= size_t(kMaxDepth)) return nb::none();
      shape.push_back(PyList_GET_SIZE(v));
      v = PyList_GET_ITEM(v, 0);
    }
    if (!walk_natural(value.ptr(), 0, shape, leaves)) return nb::none();
  } else {
    leaves.ints.reserve(size_t(count));
    if (!walk_flat(value.ptr(), 0, leaves) || leaves.size() != size_t(count)) return nb::none();
    shape.push_back(npy_intp(count));
  }
  return make_array(type, shape, leaves, count >= 0);
}

// A TF Serving REST predict body read natively (tfs_scan.h), for Python.
struct PyTfsScan {
  sp::json::TfsScan scan;
};

nb::object scan_tfs(nb::handle body) {
  Py_buffer view;
  if (PyObject_GetBuffer(body.ptr(), &view, PyBUF_SIMPLE) != 0) throw nb::python_error();
  std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> guard(&view, PyBuffer_Release);
  auto out = std::make_unique<PyTfsScan>();
  bool ok;
  {
    MaybeRelease nogil(size_t(view.len) >= kReleaseBytes);  // the request's own buffer, which nothing writes to
    ok = sp::json::scan_tfs(static_cast<const char*>(view.buf), size_t(view.len), out->scan);
  }
  if (!ok) return nb::none();
  return nb::cast(out.release(), nb::rv_policy::take_ownership);
}

size_t json_depth(nb::handle body, size_t limit) {
  Py_buffer view;
  if (PyObject_GetBuffer(body.ptr(), &view, PyBUF_SIMPLE) != 0) throw nb::python_error();
  std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> guard(&view, PyBuffer_Release);
  MaybeRelease nogil(size_t(view.len) >= kReleaseBytes);  // the request's own buffer, which nothing writes to
  return sp::json::nesting_depth(static_cast<const char*>(view.buf), size_t(view.len), limit);
}

nb::list scan_names(const PyTfsScan& self) {
  nb::list names;
  for (const auto& in : self.scan.inputs) names.append(nb::str(in.name.data(), in.name.size()));
  return names;
}

nb::object scan_signature_name(const PyTfsScan& self) {
  if (!self.scan.has_signature_name) return nb::none();
  return nb::str(self.scan.signature_name.data(), self.scan.signature_name.size());
}

// The inputs' arrays, input k as numpy type type_nums[k]; None where the reference decides.
nb::object scan_arrays(const PyTfsScan& self, const std::vector<int>& type_nums) {
  if (type_nums.size() != self.scan.inputs.size()) return nb::none();
  nb::list arrays;
  for (size_t k = 0; k < type_nums.size(); ++k) {
    const sp::json::ScannedInput& in = self.scan.inputs[k];
    std::vector<npy_intp> shape(in.shape.begin(), in.shape.end());
    nb::object array = make_array(type_nums[k], shape, in.numbers, false);
    if (array.is_none()) return nb::none();
    arrays.append(array);
  }
  return arrays;
}

class Writer {
 public:
  Writer(const char* data, int type, const npy_intp* dims, int nd) : p_(data), type_(type), dims_(dims), nd_(nd) {}

  // The nested lists of dims[depth:], from p_ on; false at a non-finite float.
  bool write(std::string& out, int depth) {
    if (depth == nd_) return scalar(out);
    out += '[';
    for (npy_intp i = 0; i < dims_[depth]; ++i) {
      if (i) out += ',';
      if (!write(out, depth + 1)) return false;
    }
    out += ']';
    return true;
  }

 private:
  template <class T>
  T next() {
    T v;
    std::memcpy(&v, p_, sizeof v);
    p_ += sizeof v;
    return v;
  }

  bool scalar(std::string& out) {
    switch (type_) {
      case NPY_FLOAT32: return real(out, double(next<float>()));
      case NPY_FLOAT64: return real(out, next<double>());
      case NPY_INT64: append_int(out, next<int64_t>()); return true;
      case NPY_INT32: append_int(out, next<int32_t>()); return true;
      case NPY_INT16: append_int(out, next<int16_t>()); return true;
      case NPY_INT8: append_int(out, next<int8_t>()); return true;
      case NPY_UINT64: append_uint(out, next<uint64_t>()); return true;
      case NPY_UINT32: append_uint(out, next<uint32_t>()); return true;
      case NPY_UINT16: append_uint(out, next<uint16_t>()); return true;
      case NPY_UINT8: append_uint(out, next<uint8_t>()); return true;
      case NPY_BOOL: out += next<npy_bool>() ? "true" : "false"; return true;
      default: return false;
    }
  }

  static bool real(std::string& out, double v) {
    if (!std::isfinite(v)) return false;
    append_double(out, v);
    return true;
  }

  const char* p_;
  int type_;
  const npy_intp* dims_;
  int nd_;
};

nb::object json_numbers(nb::handle obj) {
  if (!PyArray_Check(obj.ptr())) return nb::none();
  auto* a = reinterpret_cast<PyArrayObject*>(obj.ptr());
  int type = PyArray_TYPE(a);
  sp::json::Elem elem;
  if ((!elem_of(type, elem) && type != NPY_BOOL) || !PyArray_ISCARRAY_RO(a) || !PyArray_ISNOTSWAPPED(a))
    return nb::none();
  std::string out;
  bool ok;
  {
    // the array is the caller's (an engine output nobody writes to any more)
    MaybeRelease nogil(size_t(PyArray_NBYTES(a)) >= kReleaseBytes);
    out.reserve(size_t(PyArray_SIZE(a)) * 8 + 16);
    Writer writer(static_cast<const char*>(PyArray_DATA(a)), type, PyArray_DIMS(a), PyArray_NDIM(a));
    ok = writer.write(out, 0);
  }
  if (!ok) return nb::none();
  return nb::bytes(out.data(), out.size());
}

}  // namespace

void bind_json(nb::module_& m) {
  m.def("json_array", &json_array, nb::arg("value"), nb::arg("type_num"), nb::arg("count") = -1,
        "Parsed JSON values (nested lists of int / float) as a numpy array of type_num: count < 0, "
        "numpy's shape of the lists (TF Serving REST); else exactly count numbers of any nesting, "
        "flat (KServe v2). None where the Python reference must decide.");
  nb::class_<PyTfsScan>(m, "TfsScan")
      .def_prop_ro("columnar", [](const PyTfsScan& s) { return s.scan.columnar; })
      .def_prop_ro("signature_name", &scan_signature_name)
      .def_prop_ro("names", &scan_names)
      .def("arrays", &scan_arrays, nb::arg("type_nums"),
           "the inputs' arrays, input k as numpy type type_nums[k]; None where the reference decides");
  m.def("scan_tfs", &scan_tfs, nb::arg("body"),
        "A TF Serving REST predict body read straight into numbers per input (native/src/tfs_scan.h), "
        "or None where the Python reference must parse it.");
  m.def("json_depth", &json_depth, nb::arg("body"), nb::arg("limit"),
        "How deeply the JSON text body nests arrays and objects (outside strings), counted up to "
        "limit + 1 (native/src/json_depth.h).");
  m.def("json_numbers", &json_numbers, nb::arg("array"),
        "The JSON text of array.tolist() for a numeric array (orjson's layout), or None.");
}

}  // namespace sp::py
