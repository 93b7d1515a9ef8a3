// module_otlp.cc -- processor._native.SpanQueue: finished OpenTelemetry spans encoded as OTLP
// protobuf when they end (otlp_spans.h), for the server's tracing (server/otel_export.py, whose
// PySpanQueue is the reference this is tested against).
//
//   SpanQueue(capacity)
//   .add(trace_id, span_id, parent_id, flags, kind, start_ns, end_ns, name, attributes,
//        status_code, status_message, trace_state, links) -> int: the spans queued with it
//        (0: the queue was full, the span dropped)
//        trace_id a 128-bit int, ids 64-bit ints (parent 0: a root); attributes a dict of str
//        to str / bool / int / float / bytes / a list or tuple of those (anything else is
//        written as its str()), or None; links None or [(trace_id, span_id, flags)]
//   .take(max_spans) -> (bytes, count)   the oldest spans, each framed as ScopeSpans field 2
//   len(queue)
//
// add reads its Python arguments with the GIL held (microseconds: it never gives it up); the
// queue itself is thread-safe.
#include "module_otlp.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/pair.h>

#include <deque>
#include <string>

#include "otlp_spans.h"

namespace nb = nanobind;

namespace sp::py {
namespace {

using sp::otlp::Span;
using sp::otlp::Value;

// Strings made for the call (str() of an odd value, an int past int64) live here until it ends.
struct Keep {
  std::deque<nb::object> objects;
};

std::string_view text_of(PyObject* s) {
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(s, &n);
  if (p == nullptr) throw nb::python_error();
  return std::string_view(p, static_cast<size_t>(n));
}

std::string_view str_of(PyObject* v, Keep& keep) {
  PyObject* s = PyObject_Str(v);
  if (s == nullptr) throw nb::python_error();
  keep.objects.push_back(nb::steal(s));
  return text_of(s);
}

void value_of(PyObject* v, Value& out, Keep& keep, bool nested) {
  if (PyBool_Check(v)) {
    out.kind = Value::kBool;
    out.integer = v == Py_True;
  } else if (PyLong_Check(v)) {
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (n == -1 && PyErr_Occurred()) throw nb::python_error();
    if (overflow) {  // past int64: its digits, as the SDK would have to write it
      out.kind = Value::kString;
      out.text = str_of(v, keep);
    } else {
      out.kind = Value::kInt;
      out.integer = n;
    }
  } else if (PyFloat_Check(v)) {
    out.kind = Value::kDouble;
    out.real = PyFloat_AS_DOUBLE(v);
  } else if (PyUnicode_Check(v)) {
    out.kind = Value::kString;
    out.text = text_of(v);
  } else if (PyBytes_Check(v)) {
    out.kind = Value::kBytes;
    out.text = std::string_view(PyBytes_AS_STRING(v), static_cast<size_t>(PyBytes_GET_SIZE(v)));
  } else if (!nested && (PyList_Check(v) || PyTuple_Check(v))) {
    out.kind = Value::kArray;
    PyObject* seq = PySequence_Fast(v, "");
    if (seq == nullptr) throw nb::python_error();
    keep.objects.push_back(nb::steal(seq));
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    out.items.resize(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) value_of(PySequence_Fast_GET_ITEM(seq, i), out.items[i], keep, true);
  } else {
    out.kind = Value::kString;
    out.text = str_of(v, keep);
  }
}

void trace_words(nb::handle id, uint64_t& hi, uint64_t& lo) {
  lo = PyLong_AsUnsignedLongLongMask(id.ptr());
  if (lo == static_cast<uint64_t>(-1) && PyErr_Occurred()) throw nb::python_error();
  nb::object high = nb::steal(PyNumber_Rshift(id.ptr(), nb::int_(64).ptr()));
  if (!high.is_valid()) throw nb::python_error();
  hi = PyLong_AsUnsignedLongLongMask(high.ptr());
  if (hi == static_cast<uint64_t>(-1) && PyErr_Occurred()) throw nb::python_error();
}

uint64_t word(nb::handle v) {
  uint64_t w = PyLong_AsUnsignedLongLongMask(v.ptr());
  if (w == static_cast<uint64_t>(-1) && PyErr_Occurred()) throw nb::python_error();
  return w;
}

size_t add(sp::otlp::SpanQueue& q, nb::handle trace_id, nb::handle span_id, nb::handle parent_id, uint32_t flags,
         int kind, uint64_t start_ns, uint64_t end_ns, nb::handle name, nb::handle attributes, int status_code,
         nb::handle status_message, nb::handle trace_state, nb::handle links) {
  Keep keep;
  Span s;
  trace_words(trace_id, s.trace_hi, s.trace_lo);
  s.span_id = word(span_id);
  s.parent_id = word(parent_id);
  s.flags = flags;
  s.kind = kind;
  s.start_ns = start_ns;
  s.end_ns = end_ns;
  if (!PyUnicode_Check(name.ptr())) throw nb::type_error("name: a str");
  s.name = text_of(name.ptr());
  if (!attributes.is_none()) {
    if (!PyDict_Check(attributes.ptr())) throw nb::type_error("attributes: a dict or None");
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    s.attributes.reserve(static_cast<size_t>(PyDict_Size(attributes.ptr())));
    while (PyDict_Next(attributes.ptr(), &pos, &key, &value)) {
      if (value == Py_None) continue;  // an attribute set to None is no attribute (the SDK's rule)
      sp::otlp::Attribute& a = s.attributes.emplace_back();
      a.key = PyUnicode_Check(key) ? text_of(key) : str_of(key, keep);
      value_of(value, a.value, keep, false);
    }
  }
  s.status_code = status_code;
  if (!status_message.is_none()) s.status_message = text_of(status_message.ptr());
  if (!trace_state.is_none()) s.trace_state = text_of(trace_state.ptr());
  if (!links.is_none()) {
    for (nb::handle link : links) {
      nb::tuple t = nb::cast<nb::tuple>(link);
      if (t.size() != 3) throw nb::type_error("links: (trace_id, span_id, flags) tuples");
      sp::otlp::Link& l = s.links.emplace_back();
      trace_words(t[0], l.trace_hi, l.trace_lo);
      l.span_id = word(t[1]);
      l.flags = static_cast<uint32_t>(word(t[2]));
    }
  }
  return q.add(s);
}

}  // namespace

void bind_otlp(nb::module_& m) {
  nb::class_<sp::otlp::SpanQueue>(m, "SpanQueue")
      .def(nb::init<size_t>(), nb::arg("capacity"))
      .def("add", &add, nb::arg("trace_id"), nb::arg("span_id"), nb::arg("parent_id"), nb::arg("flags"),
           nb::arg("kind"), nb::arg("start_ns"), nb::arg("end_ns"), nb::arg("name"), nb::arg("attributes").none(),
           nb::arg("status_code"), nb::arg("status_message").none(), nb::arg("trace_state").none(),
           nb::arg("links").none(),
           "Encode a finished span and queue it: the spans queued with it; 0 when the queue was full "
           "(the span dropped).")
      .def("take",
           [](sp::otlp::SpanQueue& q, size_t max_spans) {
             size_t taken = 0;
             std::string out = q.take(max_spans, taken);
             return std::make_pair(nb::bytes(out.data(), out.size()), taken);
           },
           nb::arg("max_spans"), "The oldest max_spans spans' frames (ScopeSpans field 2) and their count.")
      .def("__len__", &sp::otlp::SpanQueue::size);
}

}  // namespace sp::py
