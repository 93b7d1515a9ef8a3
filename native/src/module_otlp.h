// module_otlp.h -- Python bindings of the OTLP span queue (module_otlp.cc).
#pragma once

#include <nanobind/nanobind.h>

namespace sp::py {

void bind_otlp(nanobind::module_& m);

}  // namespace sp::py
