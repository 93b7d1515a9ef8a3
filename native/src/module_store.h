// module_store.h -- the hook that adds the embedding stores' native parts (module_store.cc) to
// processor._native (called once, from NB_MODULE in module.cc).
#pragma once

#include <nanobind/nanobind.h>

namespace sp::py {

void bind_store(nanobind::module_& m);

}  // namespace sp::py
