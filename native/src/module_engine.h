// module_engine.h -- what the two halves of processor._native share: the compiled signature
// Python holds (Plan, defined in module.cc) and the hook that adds the engine classes
// (module_engine.cc) to the module.
#pragma once

#include <nanobind/nanobind.h>

#include <vector>

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

// Adds OrtEngine and Batcher to the module (called once, from NB_MODULE in module.cc).
void bind_engine(nanobind::module_& m);

}  // namespace sp::py
