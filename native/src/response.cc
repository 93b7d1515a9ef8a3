// response.cc -- see response.h. Field numbers are protos/predict.proto's.
#include "response.h"

#include <algorithm>
#include <cstring>

namespace sp {
namespace {

int value_field(Elem e) {
  switch (e) {
    case Elem::F32: case Elem::HALF: return 3;
    case Elem::F64: return 4;
    case Elem::I64: return 7;
    case Elem::BOOL: return 8;
    case Elem::BYTES: return 6;
    default: return 5;
  }
}

int64_t int_at(const Output& o, size_t i) {
  switch (o.elem) {
    case Elem::I8: return static_cast<const int8_t*>(o.data)[i];
    case Elem::U8: return static_cast<const uint8_t*>(o.data)[i];
    case Elem::I16: return static_cast<const int16_t*>(o.data)[i];
    case Elem::U16: return static_cast<const uint16_t*>(o.data)[i];
    case Elem::I32: return static_cast<const int32_t*>(o.data)[i];
    case Elem::I64: return static_cast<const int64_t*>(o.data)[i];
    case Elem::BOOL: return static_cast<const uint8_t*>(o.data)[i] != 0;
    default: return 0;
  }
}

float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal half: normalise
    exp = 113;
    while (!(mant & 0x400)) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

size_t payload_size(const Output& o) {
  switch (o.elem) {
    case Elem::F32: case Elem::HALF: return o.count * 4;
    case Elem::F64: return o.count * 8;
    case Elem::BYTES: {
      size_t n = 0;
      for (const Span& s : o.strings) n += len_field_size(s.n);
      return n;
    }
    default: {
      size_t n = 0;
      for (size_t i = 0; i < o.count; ++i) n += varint_size(uint64_t(int_at(o, i)));
      return n;
    }
  }
}

size_t dims_payload(const Output& o) {
  size_t n = 0;
  for (int64_t d : o.shape) n += varint_size(uint64_t(d));
  return n;
}

// protobuf (upb) orders string map keys by their common prefix, then the longer key first.
bool key_before(const Output& a, const Output& b) {
  size_t common = std::min(a.key.size(), b.key.size());
  int cmp = common ? std::memcmp(a.key.data(), b.key.data(), common) : 0;
  if (cmp != 0) return cmp < 0;
  return a.key.size() > b.key.size();
}

}  // namespace

size_t response_size(std::vector<Output>& outputs) {
  std::stable_sort(outputs.begin(), outputs.end(), key_before);
  size_t total = 0;
  for (Output& o : outputs) {
    size_t dims = dims_payload(o);
    size_t shape = dims ? len_field_size(dims) : 0;
    o.values_payload = payload_size(o);
    o.array_size = 1 + varint_size(uint64_t(int64_t(o.dtype))) + len_field_size(shape);
    if (o.count) {
      o.array_size += o.elem == Elem::BYTES ? o.values_payload : len_field_size(o.values_payload);
    }
    o.entry_size = len_field_size(o.key.size()) + len_field_size(o.array_size);
    total += len_field_size(o.entry_size);
  }
  return total;
}

uint8_t* write_response(const std::vector<Output>& outputs, uint8_t* p) {
  for (const Output& o : outputs) {
    p = write_len_header(p, 0x0a, o.entry_size);              // outputs entry
    p = write_len_header(p, 0x0a, o.key.size());              // key
    std::memcpy(p, o.key.data(), o.key.size());
    p += o.key.size();
    p = write_len_header(p, 0x12, o.array_size);              // value: ArrayProto
    *p++ = 0x08;                                              // dtype
    p = write_varint(p, uint64_t(int64_t(o.dtype)));
    size_t dims = dims_payload(o);
    p = write_len_header(p, 0x12, dims ? len_field_size(dims) : 0);  // array_shape
    if (dims) {
      p = write_len_header(p, 0x0a, dims);
      for (int64_t d : o.shape) p = write_varint(p, uint64_t(d));
    }
    if (!o.count) continue;
    uint8_t tag = uint8_t(value_field(o.elem) << 3 | kLen);
    if (o.elem == Elem::BYTES) {
      for (const Span& s : o.strings) {
        p = write_len_header(p, tag, s.n);
        if (s.n) std::memcpy(p, s.p, s.n);
        p += s.n;
      }
      continue;
    }
    p = write_len_header(p, tag, o.values_payload);
    switch (o.elem) {
      case Elem::F32: case Elem::F64:
        std::memcpy(p, o.data, o.values_payload);
        p += o.values_payload;
        break;
      case Elem::HALF:
        for (size_t i = 0; i < o.count; ++i) {
          float f = half_to_float(static_cast<const uint16_t*>(o.data)[i]);
          std::memcpy(p, &f, 4);
          p += 4;
        }
        break;
      default:
        for (size_t i = 0; i < o.count; ++i) p = write_varint(p, uint64_t(int_at(o, i)));
    }
  }
  return p;
}

size_t elem_size(Elem e) {
  switch (e) {
    case Elem::F64: case Elem::I64: return 8;
    case Elem::F32: case Elem::I32: return 4;
    case Elem::HALF: case Elem::I16: case Elem::U16: return 2;
    case Elem::I8: case Elem::U8: case Elem::BOOL: return 1;
    case Elem::BYTES: return 0;
  }
  return 0;
}

}  // namespace sp
