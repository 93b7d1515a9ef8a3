// module_json.h -- the hook that adds the JSON edges' native parts (module_json.cc) to
// processor._native (called once, from NB_MODULE in module.cc).
#pragma once

#include <nanobind/nanobind.h>

namespace sp::py {

void bind_json(nanobind::module_& m);

}  // namespace sp::py
