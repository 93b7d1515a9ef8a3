// transcode.cc -- see transcode.h. Field numbers: protos/predict.proto (ours: ArrayProto),
// TensorFlow's tensor.proto / tensor_shape.proto and TF Serving's predict.proto / model.proto,
// protos/grpc_predict_v2.proto.
#include "transcode.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "../src/wire.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "raw contents are little-endian: this reads them in place");

namespace spg {

namespace {

using sp::Span;

// TensorFlow's DataType numbers (ours, ArrayDataType, are the same).
enum : int {
  kFloat = 1, kDouble = 2, kInt32 = 3, kUint8 = 4, kInt16 = 5, kInt8 = 6, kString = 7, kInt64 = 9,
  kBool = 10, kUint16 = 17, kHalf = 19,
};

// Our ArrayProto's value field of a dtype (0: none), and the width of one raw element (strings: 0).
int eas_field(int dtype) {
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

size_t raw_width(int dtype) {
  switch (dtype) {
    case kUint8: case kInt8: case kBool: return 1;
    case kInt16: case kUint16: case kHalf: return 2;
    case kFloat: case kInt32: return 4;
    case kDouble: case kInt64: return 8;
    default: return 0;
  }
}

// --- writing --------------------------------------------------------------------------------

void put_varint(std::string& s, uint64_t v) {
  uint8_t buf[10];
  s.append(reinterpret_cast<const char*>(buf), size_t(sp::write_varint(buf, v) - buf));
}

void put_tag(std::string& s, uint32_t field, uint32_t wire) { put_varint(s, uint64_t(field) << 3 | wire); }

void put_bytes(std::string& s, uint32_t field, const void* p, size_t n) {
  put_tag(s, field, sp::kLen);
  put_varint(s, n);
  s.append(static_cast<const char*>(p), n);
}

void put_bytes(std::string& s, uint32_t field, const std::string& v) { put_bytes(s, field, v.data(), v.size()); }

void put_string_if(std::string& s, uint32_t field, const std::string& v) {  // proto3: "" is not written
  if (!v.empty()) put_bytes(s, field, v);
}

// The dims as a packed repeated int64 payload.
std::string packed_dims(const std::vector<int64_t>& shape) {
  std::string out;
  for (int64_t d : shape) put_varint(out, uint64_t(d));
  return out;
}

void store_int(int dtype, uint64_t v, std::string& out) {
  uint8_t b[8];
  if (dtype == kBool) v = v != 0;
  size_t w = raw_width(dtype);
  std::memcpy(b, &v, 8);  // little-endian: the low bytes first (what a narrowing cast keeps)
  out.append(reinterpret_cast<const char*>(b), w);
}

// --- our PredictRequest's inputs, each written in one pass ---------------------------------
// The lengths of the nested messages (entry, ArrayProto, shape) are computed first, so each input
// is written once, straight into the request: no per-level copies, varints written in place.

// (floor(log2 v) * 9 + 73) / 64 is ceil(bits / 7) for 1 to 64 bits without a division (protobuf's).
size_t varint_size(uint64_t v) { return (size_t(63 - __builtin_clzll(v | 1)) * 9 + 73) / 64; }

// A length-delimited field of `n` bytes (a field number below 16: one tag byte).
size_t len_field_size(size_t n) { return 1 + varint_size(n) + n; }

uint8_t* put_len_head(uint8_t* w, uint32_t field, size_t n) {
  *w++ = uint8_t(field << 3 | sp::kLen);
  return sp::write_varint(w, n);
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

// One input's values as they go into our ArrayProto.
struct Values {
  enum Kind {
    kPayload,   // `data`: the value field's packed payload as is (raw floats/doubles, typed TensorProto values)
    kInts,      // `data`: `count` raw little-endian integers of the dtype's width, written as varints
    kStrings,   // `strings`: one string_val each
    kPrefixed,  // `data`: `count` elements of a 4-byte little-endian length and that many bytes (v2 BYTES)
  } kind = kPayload;
  Span data;
  const std::vector<Span>* strings = nullptr;
  size_t count = 0;
};

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

// Appends to `eas` one inputs entry (our PredictRequest's field 2: {key, ArrayProto}) of `dtype`,
// `shape` and `values`; false (nothing appended): values the direct path does not take.
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

// The Values of `count` raw little-endian elements of a numeric dtype (no half: the direct path
// does not run it); false: a dtype it does not take.
bool raw_values(int dtype, Span raw, size_t count, Values& v) {
  const int field = eas_field(dtype);
  if (field == 0 || field == 6 || dtype == kHalf) return false;
  v.kind = field == 3 || field == 4 ? Values::kPayload : Values::kInts;
  v.data = raw;
  v.count = count;
  return true;
}

// --- reading --------------------------------------------------------------------------------

bool read_string(const uint8_t*& p, const uint8_t* end, uint32_t wire, std::string& out, bool& seen) {
  Span s;
  if (wire != sp::kLen || seen || !sp::read_len(p, end, s) || !sp::is_ascii(s)) return false;
  out.assign(reinterpret_cast<const char*>(s.p), s.n);
  seen = true;
  return true;
}

// Elements of a packed varint payload (false: it ends inside one).
bool varint_count(Span s, size_t& count) {
  count = 0;
  for (size_t i = 0; i < s.n; ++i) count += (s.p[i] & 0x80) == 0;
  return s.n == 0 || (s.p[s.n - 1] & 0x80) == 0;
}

// The product of `shape`'s dims; false past 2^62 (no message holds that many elements).
bool element_count(const std::vector<int64_t>& shape, size_t& count) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, uint64_t(d), &n) || n > (uint64_t(1) << 62)) return false;
  }
  count = size_t(n);
  return true;
}

// A packed (or, for one element, unpacked) repeated int64 of dims.
bool read_dims(const uint8_t*& p, const uint8_t* end, uint32_t wire, std::vector<int64_t>& dims) {
  uint64_t v;
  if (wire == sp::kVarint) {
    if (!sp::read_varint(p, end, v)) return false;
    dims.push_back(int64_t(v));
    return true;
  }
  Span s;
  if (wire != sp::kLen || !sp::read_len(p, end, s)) return false;
  const uint8_t* q = s.p;
  while (q < s.p + s.n) {
    if (!sp::read_varint(q, s.p + s.n, v)) return false;
    dims.push_back(int64_t(v));
  }
  return true;
}

// --- TF Serving's TensorProto ---------------------------------------------------------------

struct Tensor {
  int dtype = 0;
  std::vector<int64_t> shape;
  Span content;
  Span typed[12];  // TensorProto fields 5 float, 6 double, 7 int, 10 int64, 11 bool
  bool seen[12] = {};
  std::vector<Span> strings;
  bool has_dtype = false, has_shape = false, has_content = false;
};

bool parse_shape(Span s, std::vector<int64_t>& dims) {
  const uint8_t* p = s.p;
  const uint8_t* end = s.p + s.n;
  while (p < end) {
    uint32_t field, wire;
    uint64_t v;
    if (!sp::read_tag(p, end, field, wire)) return false;
    if (field == 2 && wire == sp::kLen) {  // Dim {int64 size = 1; string name = 2}
      Span dim;
      if (!sp::read_len(p, end, dim)) return false;
      int64_t size = 0;
      const uint8_t* q = dim.p;
      const uint8_t* dim_end = dim.p + dim.n;
      while (q < dim_end) {
        uint32_t f, w;
        if (!sp::read_tag(q, dim_end, f, w)) return false;
        if (f == 1 && w == sp::kVarint) {
          if (!sp::read_varint(q, dim_end, v)) return false;
          size = int64_t(v);
        } else if (!sp::skip_value(q, dim_end, w)) {
          return false;
        }
      }
      dims.push_back(size);
    } else if (field == 3) {  // unknown_rank: the reference refuses it when set
      if (wire != sp::kVarint || !sp::read_varint(p, end, v) || v != 0) return false;
    } else if (!sp::skip_value(p, end, wire)) {
      return false;
    }
  }
  return true;
}

bool parse_tensor(Span t, Tensor& out) {
  const uint8_t* p = t.p;
  const uint8_t* end = t.p + t.n;
  while (p < end) {
    uint32_t field, wire;
    uint64_t v;
    Span s;
    if (!sp::read_tag(p, end, field, wire)) return false;
    switch (field) {
      case 1:  // dtype
        if (wire != sp::kVarint || out.has_dtype || !sp::read_varint(p, end, v) || v > 1000) return false;
        out.dtype = int(v), out.has_dtype = true;
        break;
      case 2:  // tensor_shape
        if (wire != sp::kLen || out.has_shape || !sp::read_len(p, end, s) || !parse_shape(s, out.shape)) return false;
        out.has_shape = true;
        break;
      case 4:  // tensor_content
        if (wire != sp::kLen || out.has_content || !sp::read_len(p, end, out.content)) return false;
        out.has_content = true;
        break;
      case 8:  // string_val
        if (wire != sp::kLen) return false;
        if (out.strings.empty() && out.has_shape) {  // one allocation; the shape comes first as written
          size_t count;
          if (element_count(out.shape, count)) out.strings.reserve(std::min(count, t.n / 2));  // 2+ bytes each
        }
        // read in place: a Span read into a local and copied in stalls on store forwarding (2 stores, 1 load)
        if (!sp::read_len(p, end, out.strings.emplace_back())) return false;
        break;
      case 5: case 6: case 7: case 10: case 11:  // packed numbers (unpacked: not taken)
        if (wire != sp::kLen || out.seen[field] || !sp::read_len(p, end, out.typed[field])) return false;
        out.seen[field] = true;
        break;
      case 3:  // version_number
        if (!sp::skip_value(p, end, wire)) return false;
        break;
      default:  // half, complex, resource, variant, unsigned 32/64-bit values; or unknown
        if (field <= 17) return false;
        if (!sp::skip_value(p, end, wire)) return false;
    }
  }
  return true;
}

// The TensorProto's value field for a dtype (typed form).
int tfs_field(int dtype) {
  switch (eas_field(dtype)) {
    case 3: return dtype == kHalf ? 13 : 5;
    case 4: return 6;
    case 5: return 7;
    case 6: return 8;
    case 7: return 10;
    case 8: return 11;
    default: return 0;
  }
}

// A TensorProto's values as our ArrayProto's (see the file comment for what is not taken).
bool tfs_values(const Tensor& t, Values& v) {
  size_t count;
  if (!element_count(t.shape, count)) return false;
  const int dtype = t.dtype;
  const bool content = t.has_content && t.content.n > 0;  // proto3: empty bytes are no content
  int typed_seen = 0;
  for (bool seen : t.seen) typed_seen += seen;
  if (dtype == kString) {
    if (content || typed_seen || t.strings.size() != count) return false;
    v.kind = Values::kStrings;
    v.strings = &t.strings;
    return true;
  }
  const size_t w = raw_width(dtype);
  if (w == 0 || dtype == kHalf || !t.strings.empty()) return false;
  if (content) {
    if (typed_seen || t.content.n != count * w) return false;
    return raw_values(dtype, t.content, count, v);
  }
  const int field = tfs_field(dtype);
  if (typed_seen > 1 || (typed_seen == 1 && !t.seen[field])) return false;
  const Span values = t.seen[field] ? t.typed[field] : Span{};
  size_t given;
  if (field == 5 || field == 6) {
    size_t fw = field == 5 ? 4 : 8;
    if (values.n % fw) return false;
    given = values.n / fw;
  } else if (!varint_count(values, given)) {
    return false;
  }
  if (given != count) return false;  // one value broadcast, or a wrong count: the reference's
  v.kind = Values::kPayload;  // the same payload under our field number
  v.data = values;
  return true;
}

// --- our PredictResponse --------------------------------------------------------------------

struct Array {
  Span key;
  int dtype = 0;
  std::vector<int64_t> shape;
  int field = 0;  // the value field present (0: none)
  Span values;
  std::vector<Span> strings;
  size_t count = 0;
};

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

// A numeric output's elements as raw little-endian bytes of its dtype.
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

}  // namespace

// --- TF Serving Predict -----------------------------------------------------------------------

bool tfs_predict_request(const uint8_t* data, size_t size, TfsRequest& out) {
  const uint8_t* p = data;
  const uint8_t* end = data + size;
  bool has_spec = false;
  std::string filter;
  out.eas.reserve(size + size / 8 + 256);  // raw int64 ids grow by ~1/8 as varints; one allocation
  while (p < end) {
    uint32_t field, wire;
    Span s;
    if (!sp::read_tag(p, end, field, wire)) return false;
    if (field >= 1 && field <= 3 && wire != sp::kLen) return false;
    if (field == 1) {  // model_spec
      if (has_spec || !sp::read_len(p, end, s)) return false;
      has_spec = true;
      bool named = false, signed_ = false;
      const uint8_t* q = s.p;
      const uint8_t* spec_end = s.p + s.n;
      while (q < spec_end) {
        uint32_t f, w;
        if (!sp::read_tag(q, spec_end, f, w)) return false;
        if (f == 1) {
          if (!read_string(q, spec_end, w, out.model, named)) return false;
        } else if (f == 3) {
          if (!read_string(q, spec_end, w, out.signature, signed_)) return false;
        } else if (f == 2 || f == 4) {
          return false;  // a version or label: Python resolves it
        } else if (!sp::skip_value(q, spec_end, w)) {
          return false;
        }
      }
    } else if (field == 2) {  // inputs: map<string, TensorProto>
      if (!sp::read_len(p, end, s)) return false;
      Span key, value;
      bool has_key = false, has_value = false;
      const uint8_t* q = s.p;
      const uint8_t* entry_end = s.p + s.n;
      while (q < entry_end) {
        uint32_t f, w;
        if (!sp::read_tag(q, entry_end, f, w) || w != sp::kLen || (f != 1 && f != 2)) return false;
        if ((f == 1 ? has_key : has_value)) return false;
        if (!sp::read_len(q, entry_end, f == 1 ? key : value)) return false;
        (f == 1 ? has_key : has_value) = true;
      }
      Tensor t;
      Values v;
      if (!has_key || !sp::is_ascii(key) || !parse_tensor(value, t) || !tfs_values(t, v) ||
          !put_input(out.eas, key, t.dtype, t.shape, v)) {
        return false;
      }
    } else if (field == 3) {  // output_filter
      if (!sp::read_len(p, end, s) || !sp::is_ascii(s)) return false;
      put_bytes(filter, 3, s.p, s.n);
    } else if (!sp::skip_value(p, end, wire)) {
      return false;
    }
  }
  if (out.model.empty()) return false;
  out.eas += filter;
  return true;
}

bool tfs_predict_response(const uint8_t* eas, size_t size, const std::string& model, int64_t version,
                          const std::string& signature, bool tensor_content, std::string& out) {
  std::vector<Array> outputs;
  if (!parse_response(eas, size, outputs)) return false;
  std::string tensor, shape, raw, entry;
  for (const Array& a : outputs) {
    tensor.clear();
    put_tag(tensor, 1, sp::kVarint);
    put_varint(tensor, uint64_t(a.dtype));
    if (!a.shape.empty()) {  // from_numpy adds no dim for a scalar: no tensor_shape then
      shape.clear();
      for (int64_t d : a.shape) {
        std::string dim;
        if (d != 0) {
          put_tag(dim, 1, sp::kVarint);
          put_varint(dim, uint64_t(d));
        }
        put_bytes(shape, 2, dim);
      }
      put_bytes(tensor, 2, shape);
    }
    if (a.dtype == kString) {
      for (const Span& s : a.strings) put_bytes(tensor, 8, s.p, s.n);
    } else if (tensor_content) {
      raw.clear();
      raw_of(a, raw);
      put_string_if(tensor, 4, raw);
    } else if (a.count) {
      if (a.dtype == kHalf) {  // half_val: each element's bits as an int32
        raw.clear();
        raw_of(a, raw);
        std::string bits;
        for (size_t i = 0; i < a.count; ++i) {
          uint16_t h;
          std::memcpy(&h, raw.data() + 2 * i, 2);
          put_varint(bits, h);
        }
        put_bytes(tensor, 13, bits);
      } else {
        put_bytes(tensor, uint32_t(tfs_field(a.dtype)), a.values.p, a.values.n);  // same payload
      }
    }
    entry.clear();
    put_bytes(entry, 1, a.key.p, a.key.n);
    put_bytes(entry, 2, tensor);
    put_bytes(out, 1, entry);
  }
  std::string spec, number;
  put_string_if(spec, 1, model);
  if (version != 0) {
    put_tag(number, 1, sp::kVarint);
    put_varint(number, uint64_t(version));
  }
  put_bytes(spec, 2, number);  // set (Int64Value), even when 0
  put_string_if(spec, 3, signature);
  put_bytes(out, 2, spec);
  return true;
}

// --- KServe v2 ModelInfer ---------------------------------------------------------------------

namespace {

struct V2Input {
  Span name;
  std::string datatype;
  std::vector<int64_t> shape;
};

int v2_dtype(const std::string& datatype) {
  static const struct { const char* name; int dtype; } kTypes[] = {
      {"FP32", kFloat}, {"FP64", kDouble}, {"INT32", kInt32}, {"UINT8", kUint8}, {"INT16", kInt16},
      {"INT8", kInt8}, {"BYTES", kString}, {"INT64", kInt64}, {"BOOL", kBool}, {"UINT16", kUint16},
      {"FP16", kHalf},
  };
  for (const auto& t : kTypes)
    if (datatype == t.name) return t.dtype;
  return 0;
}

const char* v2_datatype(int dtype) {
  switch (dtype) {
    case kFloat: return "FP32";
    case kDouble: return "FP64";
    case kInt32: return "INT32";
    case kUint8: return "UINT8";
    case kInt16: return "INT16";
    case kInt8: return "INT8";
    case kString: return "BYTES";
    case kInt64: return "INT64";
    case kBool: return "BOOL";
    case kUint16: return "UINT16";
    case kHalf: return "FP16";
    default: return nullptr;
  }
}

constexpr size_t kMaxRank = 32;  // open_inference.MAX_RANK

bool parse_v2_input(Span s, V2Input& in) {
  const uint8_t* p = s.p;
  const uint8_t* end = s.p + s.n;
  bool named = false, typed = false;
  while (p < end) {
    uint32_t f, w;
    if (!sp::read_tag(p, end, f, w)) return false;
    if (f == 1) {
      if (w != sp::kLen || named || !sp::read_len(p, end, in.name) || !sp::is_ascii(in.name)) return false;
      named = true;
    } else if (f == 2) {
      if (!read_string(p, end, w, in.datatype, typed)) return false;
    } else if (f == 3) {
      if (!read_dims(p, end, w, in.shape)) return false;
    } else if (f == 4 || f == 5) {
      return false;  // parameters, typed contents: Python reads them
    } else if (!sp::skip_value(p, end, w)) {
      return false;
    }
  }
  return named && in.shape.size() <= kMaxRank;
}

}  // namespace

bool v2_infer_request(const uint8_t* data, size_t size, V2Request& out) {
  const uint8_t* p = data;
  const uint8_t* end = data + size;
  bool named = false, versioned = false, identified = false;
  std::vector<V2Input> inputs;
  std::vector<Span> raws;
  std::string filter;
  while (p < end) {
    uint32_t field, wire;
    Span s;
    if (!sp::read_tag(p, end, field, wire)) return false;
    if (field >= 1 && field <= 7 && wire != sp::kLen) return false;
    switch (field) {
      case 1: if (!read_string(p, end, wire, out.model, named)) return false; break;
      case 2: if (!read_string(p, end, wire, out.version, versioned)) return false; break;
      case 3: if (!read_string(p, end, wire, out.id, identified)) return false; break;
      case 4: return false;  // parameters
      case 5: {
        V2Input in;
        if (!sp::read_len(p, end, s) || !parse_v2_input(s, in)) return false;
        inputs.push_back(std::move(in));
        break;
      }
      case 6: {  // outputs {name = 1, parameters = 2}
        if (!sp::read_len(p, end, s)) return false;
        std::string name;
        bool has_name = false;
        const uint8_t* q = s.p;
        while (q < s.p + s.n) {
          uint32_t f, w;
          if (!sp::read_tag(q, s.p + s.n, f, w)) return false;
          if (f == 1) {
            if (!read_string(q, s.p + s.n, w, name, has_name)) return false;
          } else if (f == 2 || !sp::skip_value(q, s.p + s.n, w)) {
            return false;
          }
        }
        if (name.empty()) return false;
        put_bytes(filter, 3, name);
        break;
      }
      case 7:
        if (!sp::read_len(p, end, s)) return false;
        raws.push_back(s);
        break;
      default:
        if (!sp::skip_value(p, end, wire)) return false;
    }
  }
  if (out.model.empty() || inputs.empty() || raws.size() != inputs.size()) return false;
  out.eas.reserve(size + size / 8 + 256);  // as tfs_predict_request's
  for (size_t i = 0; i < inputs.size(); ++i) {
    const V2Input& in = inputs[i];
    const int dtype = v2_dtype(in.datatype);
    size_t count;
    Values v;
    if (dtype == 0 || dtype == kHalf || !element_count(in.shape, count)) return false;
    if (dtype == kString) {
      v.kind = Values::kPrefixed;  // exactly `count` length-prefixed elements, ending at the end
      v.data = raws[i];
      v.count = count;
    } else if (raws[i].n != count * raw_width(dtype) || !raw_values(dtype, raws[i], count, v)) {
      return false;
    }
    if (!put_input(out.eas, in.name, dtype, in.shape, v)) return false;
  }
  out.eas += filter;
  return true;
}

bool v2_infer_response(const uint8_t* eas, size_t size, const std::string& model, const std::string& version,
                       const std::string& id, std::string& out) {
  std::vector<Array> outputs;
  if (!parse_response(eas, size, outputs)) return false;
  put_string_if(out, 1, model);
  put_string_if(out, 2, version);
  put_string_if(out, 3, id);
  std::string tensor;
  for (const Array& a : outputs) {
    const char* datatype = v2_datatype(a.dtype);
    if (datatype == nullptr) return false;
    tensor.clear();
    put_bytes(tensor, 1, a.key.p, a.key.n);
    put_bytes(tensor, 2, datatype, std::strlen(datatype));
    std::string dims = packed_dims(a.shape);
    if (!dims.empty()) put_bytes(tensor, 3, dims);
    put_bytes(out, 5, tensor);
  }
  std::string raw;
  for (const Array& a : outputs) {
    raw.clear();
    if (a.dtype == kString) {
      for (const Span& s : a.strings) {
        uint32_t n = uint32_t(s.n);
        raw.append(reinterpret_cast<const char*>(&n), 4);
        raw.append(reinterpret_cast<const char*>(s.p), s.n);
      }
    } else {
      raw_of(a, raw);
    }
    put_bytes(out, 6, raw);  // one entry per output, an empty one too
  }
  return true;
}

}  // namespace spg
