// numpy_api.h -- numpy's C API for the bindings other than module.cc, which imports it once for
// the whole module (_import_array in NB_MODULE); include it before any other numpy header.
#pragma once

#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL SP_NATIVE_ARRAY_API
#define NO_IMPORT_ARRAY
#include <numpy/arrayobject.h>
