// eas_response.h -- our PredictResponse (tensorflow.eas, protos/predict.proto) as the native
// engine's encoder writes it (native/src/response.cc: one packed field per numeric output,
// float16 widened to float_val), read in place for transcode's TF Serving and v2 writers. Pure
// functions: thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../src/wire.h"

namespace spg {

// One output, its bytes viewed in the response (which must outlive it).
struct Array {
  sp::Span key;
  int dtype = 0;
  std::vector<int64_t> shape;
  int field = 0;  // the value field present (0: none)
  sp::Span values;
  std::vector<sp::Span> strings;
  size_t count = 0;
};

// The outputs of a PredictResponse in wire order; false: a form the encoder does not write (a
// field other than the dtype's, a count other than the shape's, malformed wire data).
bool parse_response(const uint8_t* data, size_t size, std::vector<Array>& outputs);

// A numeric output's elements appended to `out` as raw little-endian bytes of its dtype.
void raw_of(const Array& a, std::string& out);

}  // namespace spg
