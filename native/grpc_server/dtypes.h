// dtypes.h -- the DataType numbers of the tensors the native gRPC server transcodes, and how our
// ArrayProto (protos/predict.proto) holds each. Pure constants and functions.
#pragma once

#include <cstddef>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "raw contents are little-endian: they are read in place");

namespace spg {

// TensorFlow's DataType numbers (ours, ArrayDataType, are the same).
enum : int {
  kFloat = 1, kDouble = 2, kInt32 = 3, kUint8 = 4, kInt16 = 5, kInt8 = 6, kString = 7, kInt64 = 9,
  kBool = 10, kUint16 = 17, kHalf = 19,
};

// Our ArrayProto's value field of a dtype (0: none), and the width of one raw element (strings: 0).
inline int eas_field(int dtype) {
  switch (dtype) {
    case kFloat: case kHalf: return 3;
    case kDouble: return 4;
    case kInt32: case kUint8: case kInt16: case kInt8: case kUint16: return 5;
    case kString: return 6;
    case kInt64: return 7;
    case kBool: return 8;
    default: return 0;
  }
}

inline size_t raw_width(int dtype) {
  switch (dtype) {
    case kUint8: case kInt8: case kBool: return 1;
    case kInt16: case kUint16: case kHalf: return 2;
    case kFloat: case kInt32: return 4;
    case kDouble: case kInt64: return 8;
    default: return 0;
  }
}

}  // namespace spg
