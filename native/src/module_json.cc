// module_json.cc -- the JSON edges' native parts (TF Serving REST, KServe v2 JSON), in
// processor._native:
//
//   json_array(value, type_num, count=-1)   parsed JSON values (nested lists of int / float) ->
//                              a numpy array of type_num, or None
//   json_numbers(array)        a numeric numpy array -> the JSON text of array.tolist(), or None
//
// As for the codec (module.cc), None means "not taken": the caller runs the Python reference
// (server/http/tfs_json_values.py, server/open_inference.py, orjson), which gives the result or
// the exact error. So json_array takes only what the reference would accept, the same way:
// booleans, strings, empty lists, integers beyond int64, a value out of the type's range, a
// finite number that would become infinity are all left to it. json_numbers writes what
// orjson writes for the same Python values (the same doubles read back); non-finite floats
// are left to the reference (TF Serving's NaN tokens, v2's refusal).
//
// json_array reads Python objects, so it holds the GIL; json_numbers gives it up for large
// arrays. Both are thread-safe.
#include "module_json.h"

#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL SP_NATIVE_ARRAY_API
#define NO_IMPORT_ARRAY  // module.cc imports numpy's C API for the whole module
#include <numpy/arrayobject.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "gil.h"
#include "json_numbers.h"

namespace nb = nanobind;

namespace sp::py {
namespace {

constexpr int kMaxDepth = 64;                // numpy's most dimensions: the reference's bound

// The leaves of a JSON value, borrowed from the caller's lists (alive for the call).
struct Leaves {
  std::vector<PyObject*> items;
  bool has_float = false;
};

bool leaf(PyObject* v, Leaves& out) {
  if (PyFloat_CheckExact(v)) {
    out.has_float = true;
  } else if (!PyLong_CheckExact(v)) {  // bool, str, dict, None, a list where a number belongs
    return false;
  }
  out.items.push_back(v);
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

template <class T>
bool fill_int(const Leaves& l, T* dst) {
  if (l.has_float) return false;  // the reference refuses floats for an integer input
  for (size_t i = 0; i < l.items.size(); ++i) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(l.items[i], &overflow);
    if (overflow) return false;
    if constexpr (std::is_unsigned_v<T>) {
      if (x < 0 || static_cast<unsigned long long>(x) > std::numeric_limits<T>::max()) return false;
    } else {
      if (x < std::numeric_limits<T>::min() || x > std::numeric_limits<T>::max()) return false;
    }
    dst[i] = static_cast<T>(x);
  }
  return true;
}

// `via_double`: integers become doubles first (numpy's float64 array of mixed values, v2's
// astype(float64)); else an integer converts straight to T (numpy's int64 array's astype).
template <class T>
bool fill_float(const Leaves& l, T* dst, bool via_double) {
  for (size_t i = 0; i < l.items.size(); ++i) {
    PyObject* v = l.items[i];
    T x;
    if (PyFloat_CheckExact(v)) {
      double d = PyFloat_AS_DOUBLE(v);
      x = static_cast<T>(d);
      if (std::isinf(x) && std::isfinite(d)) return false;  // out of T's range: the reference decides
    } else {
      int overflow = 0;
      long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
      if (overflow) return false;
      x = via_double ? static_cast<T>(static_cast<double>(n)) : static_cast<T>(n);
    }
    dst[i] = x;
  }
  return true;
}

bool fill(int type, const Leaves& l, void* dst, bool via_double) {
  switch (type) {
    case NPY_FLOAT32: return fill_float(l, static_cast<float*>(dst), via_double);
    case NPY_FLOAT64: return fill_float(l, static_cast<double*>(dst), via_double);
    case NPY_INT64: return fill_int(l, static_cast<int64_t*>(dst));
    case NPY_INT32: return fill_int(l, static_cast<int32_t*>(dst));
    case NPY_INT16: return fill_int(l, static_cast<int16_t*>(dst));
    case NPY_INT8: return fill_int(l, static_cast<int8_t*>(dst));
    case NPY_UINT64: return fill_int(l, static_cast<uint64_t*>(dst));
    case NPY_UINT32: return fill_int(l, static_cast<uint32_t*>(dst));
    case NPY_UINT16: return fill_int(l, static_cast<uint16_t*>(dst));
    case NPY_UINT8: return fill_int(l, static_cast<uint8_t*>(dst));
    default: return false;
  }
}

bool supported(int type) {
  switch (type) {
    case NPY_FLOAT32: case NPY_FLOAT64: case NPY_INT64: case NPY_INT32: case NPY_INT16:
    case NPY_INT8: case NPY_UINT64: case NPY_UINT32: case NPY_UINT16: case NPY_UINT8:
      return true;
    default:
      return false;
  }
}

// count < 0: TF Serving's reading (numpy's shape of the nested lists; integers alone convert
// straight to the type, mixed with floats through float64). count >= 0: KServe v2's (the
// numbers of any nesting, exactly count of them, a flat array; through float64 for a float type).
nb::object json_array(nb::handle value, int type, int64_t count) {
  if (!supported(type) || !PyList_CheckExact(value.ptr())) return nb::none();
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
    leaves.items.reserve(size_t(count));
    if (!walk_flat(value.ptr(), 0, leaves) || leaves.items.size() != size_t(count)) return nb::none();
    shape.push_back(npy_intp(count));
  }
  PyObject* a = PyArray_SimpleNew(int(shape.size()), shape.data(), type);
  if (!a) throw nb::python_error();
  nb::object array = nb::steal(a);
  bool via_double = count >= 0 || leaves.has_float;
  if (!fill(type, leaves, PyArray_DATA(reinterpret_cast<PyArrayObject*>(a)), via_double)) return nb::none();
  return array;
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
  if ((!supported(type) && type != NPY_BOOL) || !PyArray_ISCARRAY_RO(a) || !PyArray_ISNOTSWAPPED(a))
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
  m.def("json_numbers", &json_numbers, nb::arg("array"),
        "The JSON text of array.tolist() for a numeric array (orjson's layout), or None.");
}

}  // namespace sp::py
