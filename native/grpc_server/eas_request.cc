// eas_request.cc -- see eas_request.h. Field numbers: protos/predict.proto.
#include "eas_request.h"

#include <cstring>

#include "dtypes.h"

namespace spg {

namespace {

using sp::Span;

using sp::len_field_size;
using sp::varint_size;

// The head of length-delimited field `field` (1..15) of `n` bytes.
uint8_t* put_len_head(uint8_t* w, uint32_t field, size_t n) {
  return sp::write_len_header(w, uint8_t(field << 3 | sp::kLen), n);
}

// f(T{}) for the element type T of an integer dtype (bool: its byte).
template <typename F>
auto with_int(int dtype, F&& f) {
  switch (dtype) {
    case kInt8: return f(int8_t{});
    case kUint8: case kBool: return f(uint8_t{});
    case kInt16: return f(int16_t{});
    case kUint16: return f(uint16_t{});
    case kInt32: return f(int32_t{});
    default: return f(int64_t{});
  }
}

// A raw element as protobuf writes it as a varint: signed types sign-extended (int32 too).
template <typename T>
uint64_t int_at(const uint8_t* raw, size_t i) {
  T x;
  std::memcpy(&x, raw + i * sizeof(T), sizeof(T));
  return uint64_t(int64_t(x));
}

template <typename T>
size_t ints_size(const uint8_t* raw, size_t count) {
  size_t n = 0;
  for (size_t i = 0; i < count; ++i) n += varint_size(int_at<T>(raw, i));
  return n;
}

// v's varint at w, whose 10 bytes from w must be writable: its low 56 bits spread over 8 bytes
// at once (hashed 63-bit ids take 9 bytes: a byte loop costs a store and a branch a byte).
inline uint8_t* put_varint_wide(uint8_t* w, uint64_t v) {
  if (v < 0x80) {
    *w = uint8_t(v);
    return w + 1;
  }
  const size_t n = varint_size(v);
  const uint64_t low = (v & 0x7f) | (v << 1 & 0x7f00) | (v << 2 & 0x7f0000) | (v << 3 & 0x7f000000) |
                       (v << 4 & 0x7f00000000) | (v << 5 & 0x7f0000000000) | (v << 6 & 0x7f000000000000) |
                       (v << 7 & 0x7f00000000000000);
  const uint64_t more = n > 8 ? 0x8080808080808080 : 0x8080808080808080 >> (8 * (9 - n));  // bytes 0..n-2
  const uint64_t word = low | more;
  std::memcpy(w, &word, 8);
  w[8] = uint8_t(v >> 56 & 0x7f) | (n > 9 ? 0x80 : 0);
  w[9] = uint8_t(v >> 63);
  return w + n;
}

// The varints of `count` raw elements into [w, end) (their size: ints_size).
template <typename T>
uint8_t* put_ints(uint8_t* w, uint8_t* end, const uint8_t* raw, size_t count) {
  size_t i = 0;
  for (; i < count && end - w >= 10; ++i) w = put_varint_wide(w, int_at<T>(raw, i));
  for (; i < count; ++i) w = sp::write_varint(w, int_at<T>(raw, i));  // the last few: no slack
  return w;
}

// The bytes `v` takes in our ArrayProto of `dtype` (its value fields with their heads) and, for
// kInts, the packed payload's length; false: values the direct path does not take (a bool byte
// other than 0 or 1, malformed BYTES contents).
bool values_size(int dtype, const Values& v, size_t& out, size_t& packed) {
  out = packed = 0;
  switch (v.kind) {
    case Values::kPayload:
      if (v.data.n) out = len_field_size(v.data.n);
      return true;
    case Values::kInts: {
      if (dtype == kBool) {
        for (size_t i = 0; i < v.count; ++i) {
          if (v.data.p[i] > 1) return false;  // the reference refuses it (v2) or reads it its own way
        }
      }
      const size_t n = with_int(dtype, [&](auto zero) { return ints_size<decltype(zero)>(v.data.p, v.count); });
      if (v.count) out = len_field_size(n), packed = n;
      return true;
    }
    case Values::kStrings:
      for (const Span& s : *v.strings) out += len_field_size(s.n);
      return true;
    case Values::kPrefixed: {
      const uint8_t* p = v.data.p;
      const uint8_t* end = v.data.p + v.data.n;
      for (size_t i = 0; i < v.count; ++i) {
        uint32_t n;
        if (end - p < 4) return false;
        std::memcpy(&n, p, 4);
        p += 4;
        if (n > size_t(end - p)) return false;
        out += len_field_size(n);
        p += n;
      }
      return p == end;
    }
  }
  return false;
}

uint8_t* put_values(uint8_t* w, int dtype, const Values& v, size_t packed) {
  const uint32_t field = uint32_t(eas_field(dtype));
  switch (v.kind) {
    case Values::kPayload:
      if (v.data.n == 0) return w;
      w = put_len_head(w, field, v.data.n);
      std::memcpy(w, v.data.p, v.data.n);
      return w + v.data.n;
    case Values::kInts: {
      if (v.count == 0) return w;
      w = put_len_head(w, field, packed);
      return with_int(dtype, [&](auto zero) { return put_ints<decltype(zero)>(w, w + packed, v.data.p, v.count); });
    }
    case Values::kStrings:
      for (const Span& s : *v.strings) {
        w = put_len_head(w, field, s.n);
        std::memcpy(w, s.p, s.n);
        w += s.n;
      }
      return w;
    case Values::kPrefixed: {
      const uint8_t* p = v.data.p;
      for (size_t i = 0; i < v.count; ++i) {  // checked by values_size
        uint32_t n;
        std::memcpy(&n, p, 4);
        w = put_len_head(w, field, n);
        std::memcpy(w, p + 4, n);
        w += n;
        p += 4 + n;
      }
      return w;
    }
  }
  return w;
}

}  // namespace

bool put_input(std::string& eas, Span key, int dtype, const std::vector<int64_t>& shape, const Values& values) {
  size_t dims = 0, vals, packed;
  for (int64_t d : shape) dims += varint_size(uint64_t(d));
  if (!values_size(dtype, values, vals, packed)) return false;
  const size_t shape_msg = dims ? len_field_size(dims) : 0;
  const size_t array = 1 + varint_size(uint64_t(dtype)) + len_field_size(shape_msg) + vals;
  const size_t entry = len_field_size(key.n) + len_field_size(array);
  const size_t at = eas.size();
  eas.resize(at + len_field_size(entry));
  auto* w = reinterpret_cast<uint8_t*>(&eas[at]);
  w = put_len_head(w, 2, entry);
  w = put_len_head(w, 1, key.n);
  std::memcpy(w, key.p, key.n);
  w = put_len_head(w + key.n, 2, array);
  *w++ = uint8_t(1 << 3 | sp::kVarint);
  w = sp::write_varint(w, uint64_t(dtype));
  w = put_len_head(w, 2, shape_msg);
  if (dims) {
    w = put_len_head(w, 1, dims);
    for (int64_t d : shape) w = sp::write_varint(w, uint64_t(d));
  }
  put_values(w, dtype, values, packed);
  return true;
}

bool raw_values(int dtype, Span raw, size_t count, Values& v) {
  const int field = eas_field(dtype);
  if (field == 0 || field == 6 || dtype == kHalf) return false;
  v.kind = field == 3 || field == 4 ? Values::kPayload : Values::kInts;
  v.data = raw;
  v.count = count;
  return true;
}

}  // namespace spg
