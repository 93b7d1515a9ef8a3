// module_engine.h -- what the parts of processor._native's bindings share: the compiled
// signature Python holds (Plan, defined in module.cc), a borrowed buffer, the Batcher object, and
// the hooks that add the engine classes (module_engine.cc) and the direct path's
// (module_direct.cc) to the module.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "batcher.h"
#include "request.h"

namespace sp::py {

// A compiled signature plus the Python objects decode() hands out (aliases as dict keys, the
// default fetches tuple), made once.
struct PyPlan {
  sp::Plan plan;
  std::vector<nanobind::object> input_aliases;
  std::vector<nanobind::object> output_aliases;
  nanobind::object all_aliases;  // (alias, ...): keys and aliases for an empty output_filter
};

// A read-only view of a bytes-like object for the duration of a call.
struct Borrowed {
  Py_buffer view;
  explicit Borrowed(nanobind::handle data) {
    if (PyObject_GetBuffer(data.ptr(), &view, PyBUF_SIMPLE) != 0) throw nanobind::python_error();
  }
  ~Borrowed() { PyBuffer_Release(&view); }
  const uint8_t* data() const { return static_cast<const uint8_t*>(view.buf); }
  size_t size() const { return size_t(view.len); }
};

// A Batcher and the Python objects it uses (the plan; the engine or the runner callable; the budget).
struct PyBatcher {
  std::unique_ptr<sp::Batcher> batcher;
  nanobind::object plan, engine, runner, budget;
};

// Adds OrtEngine and Batcher to the module (called once, from NB_MODULE in module.cc).
void bind_engine(nanobind::module_& m);
// Adds DirectLane, DirectFront and the direct_api capsule (called once, after bind_engine).
void bind_direct(nanobind::module_& m);

}  // namespace sp::py
