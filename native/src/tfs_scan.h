// tfs_scan.h -- a TensorFlow Serving REST predict body read straight into numbers per input
// (no Python here; pure, thread-safe).
//
// Takes only the plain form: {"instances": [...]} or {"inputs": ...}, with an optional
// "signature_name" string, and nothing else; the values are numbers and nested lists of them;
// rows ({"instances"}) are all objects naming the same inputs, or all bare values. Anything
// else, or anything the reference reads some other way (true/false/null, strings, NaN, escapes
// in names, a duplicate member, an empty or ragged list, nesting past 64, an integer beyond
// int64, a number past a double's range, bytes after the document), is "not taken": the caller
// parses the body with the Python reference, which gives the answer or the exact error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "json_values.h"

namespace sp::json {

struct ScannedInput {
  std::string name;            // "" for bare values (a single-input signature's)
  std::vector<int64_t> shape;  // numpy's shape of the nested lists (rows: the row count first)
  Numbers numbers;             // row-major
};

struct TfsScan {
  bool columnar = false;  // "inputs" (else "instances")
  bool has_signature_name = false;
  std::string signature_name;
  std::vector<ScannedInput> inputs;  // in the order of the first row's (or the object's) members
};

// True with `out` filled when the body is of the plain form (see the file comment).
bool scan_tfs(const char* data, size_t size, TfsScan& out);

}  // namespace sp::json
