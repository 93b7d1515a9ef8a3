// eas_request.h -- our PredictRequest (tensorflow.eas, protos/predict.proto) written input by
// input, each in one pass: the lengths of its nested messages (map entry, ArrayProto, shape) are
// computed first, so its bytes are written once, straight into the request, varints in place (no
// per-level copies: a batch-256 request's ids and strings cost a few microseconds, not tens).
// transcode_tfs.cc and transcode_v2.cc write TF Serving's and v2's requests as ours with it.
// Pure functions of their arguments: thread-safe, no allocation beyond the request string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../src/wire.h"

namespace spg {

// One input's values as they go into our ArrayProto.
struct Values {
  enum Kind {
    kPayload,   // `data`: the value field's packed payload as is (raw floats/doubles, typed TensorProto values)
    kInts,      // `data`: `count` raw little-endian integers of the dtype's width, written as varints
    kStrings,   // `strings`: one string_val each
    kPrefixed,  // `data`: `count` elements of a 4-byte little-endian length and that many bytes (v2 BYTES)
  } kind = kPayload;
  sp::Span data;
  const std::vector<sp::Span>* strings = nullptr;
  size_t count = 0;
};

// Appends to `eas` one inputs entry (our PredictRequest's field 2: {key, ArrayProto}) of `dtype`,
// `shape` and `values`; false (nothing appended): values the direct path does not take.
bool put_input(std::string& eas, sp::Span key, int dtype, const std::vector<int64_t>& shape, const Values& values);

// The Values of `count` raw little-endian elements of a numeric dtype (no half: the direct path
// does not run it); false: a dtype it does not take.
bool raw_values(int dtype, sp::Span raw, size_t count, Values& v);

}  // namespace spg
