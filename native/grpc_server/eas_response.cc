// eas_response.cc -- see eas_response.h. Field numbers: protos/predict.proto.
#include "eas_response.h"

#include <cstring>

#include "dtypes.h"
#include "fields.h"

namespace spg {

namespace {

bool parse_array(Span s, Array& a) {
  const uint8_t* p = s.p;
  const uint8_t* end = s.p + s.n;
  while (p < end) {
    uint32_t field, wire;
    uint64_t v;
    Span x;
    if (!sp::read_tag(p, end, field, wire)) return false;
    if (field == 1 && wire == sp::kVarint) {
      if (!sp::read_varint(p, end, v) || v > 1000) return false;
      a.dtype = int(v);
    } else if (field == 2 && wire == sp::kLen) {
      if (!sp::read_len(p, end, x)) return false;
      const uint8_t* q = x.p;
      while (q < x.p + x.n) {
        uint32_t f, w;
        if (!sp::read_tag(q, x.p + x.n, f, w)) return false;
        if (f == 1) {
          if (!read_dims(q, x.p + x.n, w, a.shape)) return false;
        } else if (!sp::skip_value(q, x.p + x.n, w)) {
          return false;
        }
      }
    } else if (field == 6 && wire == sp::kLen) {
      if (!sp::read_len(p, end, x)) return false;
      a.strings.push_back(x);
    } else if (field >= 3 && field <= 8 && wire == sp::kLen) {
      if (a.field != 0 || !sp::read_len(p, end, a.values)) return false;
      a.field = int(field);
    } else {
      return false;  // not what our encoder writes
    }
  }
  // the dtype's field only, and as many elements as the shape holds
  const int expected = eas_field(a.dtype);
  if (expected == 0 || !element_count(a.shape, a.count)) return false;
  if (expected == 6) return a.field == 0 && a.strings.size() == a.count;
  if (!a.strings.empty() || (a.field != 0 && a.field != expected)) return false;
  size_t given = 0;
  if (expected == 3 || expected == 4) {
    size_t fw = expected == 3 ? 4 : 8;
    if (a.values.n % fw) return false;
    given = a.values.n / fw;
  } else if (!varint_count(a.values, given)) {
    return false;
  }
  return given == a.count;
}

// IEEE binary32 -> binary16 bits, for values a float16 widened (exact; NaN stays NaN).
uint16_t half_bits(uint32_t x) {
  const uint32_t sign = (x >> 16) & 0x8000, mant = x & 0x7fffff;
  const int exp = int((x >> 23) & 0xff);
  if (exp == 255) return uint16_t(sign | 0x7c00 | (mant ? 0x200 | (mant >> 13) : 0));
  const int e = exp - 127 + 15;
  if (e >= 31) return uint16_t(sign | 0x7c00);
  if (e <= 0) {
    if (e < -10) return uint16_t(sign);
    return uint16_t(sign | ((mant | 0x800000) >> (14 - e)));
  }
  return uint16_t(sign | uint32_t(e) << 10 | (mant >> 13));
}

void store_int(int dtype, uint64_t v, std::string& out) {
  uint8_t b[8];
  if (dtype == kBool) v = v != 0;
  size_t w = raw_width(dtype);
  std::memcpy(b, &v, 8);  // little-endian: the low bytes first (what a narrowing cast keeps)
  out.append(reinterpret_cast<const char*>(b), w);
}

}  // namespace

bool parse_response(const uint8_t* data, size_t size, std::vector<Array>& outputs) {
  const uint8_t* p = data;
  const uint8_t* end = data + size;
  while (p < end) {
    uint32_t field, wire;
    Span entry;
    if (!sp::read_tag(p, end, field, wire) || field != 1 || wire != sp::kLen || !sp::read_len(p, end, entry))
      return false;
    Array a;
    Span value;
    bool has_value = false;
    const uint8_t* q = entry.p;
    const uint8_t* entry_end = entry.p + entry.n;
    while (q < entry_end) {
      uint32_t f, w;
      if (!sp::read_tag(q, entry_end, f, w) || w != sp::kLen) return false;
      if (f == 1) {
        if (!sp::read_len(q, entry_end, a.key)) return false;
      } else if (f == 2) {
        if (!sp::read_len(q, entry_end, value)) return false;
        has_value = true;
      } else {
        return false;
      }
    }
    if (!has_value || !parse_array(value, a)) return false;
    outputs.push_back(std::move(a));
  }
  return true;
}

void raw_of(const Array& a, std::string& out) {
  if (a.count == 0) return;
  if (a.dtype == kHalf) {
    for (size_t i = 0; i < a.count; ++i) {
      uint32_t f;
      std::memcpy(&f, a.values.p + 4 * i, 4);
      uint16_t h = half_bits(f);
      out.append(reinterpret_cast<const char*>(&h), 2);
    }
  } else if (a.field == 3 || a.field == 4) {
    out.append(reinterpret_cast<const char*>(a.values.p), a.values.n);
  } else {
    out.reserve(out.size() + a.count * raw_width(a.dtype));
    const uint8_t* p = a.values.p;
    const uint8_t* end = a.values.p + a.values.n;
    uint64_t v;
    while (p < end && sp::read_varint(p, end, v)) store_int(a.dtype, v, out);
  }
}

}  // namespace spg
