// request.cc -- see request.h. Field numbers are protos/predict.proto's.
#include "request.h"

#include <cstring>

#include "fingerprint.h"

namespace sp {
namespace {

// ArrayProto's fields as read from the wire.
struct RawArray {
  int32_t dtype = 0;
  bool has_shape = false;
  std::vector<int64_t> dims;
  Span packed[9];      // by field number: 3 float, 4 double, 5 int32, 7 int64, 8 bool
  bool seen[9] = {};
  std::vector<Span> strings;
};

bool parse_shape(Span s, std::vector<int64_t>& dims) {
  const uint8_t* p = s.p;
  const uint8_t* end = s.p + s.n;
  while (p < end) {
    uint32_t field, wire;
    if (!read_tag(p, end, field, wire)) return false;
    if (field == 1 && wire == kLen) {
      Span packed;
      if (!read_len(p, end, packed)) return false;
      const uint8_t* q = packed.p;
      const uint8_t* qend = packed.p + packed.n;
      while (q < qend) {
        uint64_t v;
        if (!read_varint(q, qend, v)) return false;
        dims.push_back(int64_t(v));
      }
    } else if (field == 1 && wire == kVarint) {
      uint64_t v;
      if (!read_varint(p, end, v)) return false;
      dims.push_back(int64_t(v));
    } else if (field == 1 || !skip_value(p, end, wire)) {
      return false;
    }
  }
  return true;
}

bool parse_array(Span s, RawArray& a) {
  const uint8_t* p = s.p;
  const uint8_t* end = s.p + s.n;
  while (p < end) {
    uint32_t field, wire;
    if (!read_tag(p, end, field, wire)) return false;
    if (field == 1) {
      uint64_t v;
      if (wire != kVarint || !read_varint(p, end, v)) return false;
      a.dtype = int32_t(uint32_t(v));  // an enum is an int32: upb keeps the low 32 bits
    } else if (field == 2) {
      Span shape;
      if (wire != kLen || a.has_shape || !read_len(p, end, shape) || !parse_shape(shape, a.dims))
        return false;  // a second array_shape would be merged by the reference
      a.has_shape = true;
    } else if (field == 6) {
      Span str;
      if (wire != kLen || !read_len(p, end, str)) return false;
      a.strings.push_back(str);
    } else if (field >= 3 && field <= 8) {
      if (wire != kLen || a.seen[field] || !read_len(p, end, a.packed[field])) return false;
      a.seen[field] = true;
    } else if (!skip_value(p, end, wire)) {
      return false;
    }
  }
  return true;
}

bool parse_entry(Span s, Span& key, Span& value, bool& has_value) {
  const uint8_t* p = s.p;
  const uint8_t* end = s.p + s.n;
  bool has_key = false;
  while (p < end) {
    uint32_t field, wire;
    if (!read_tag(p, end, field, wire)) return false;
    if ((field != 1 && field != 2) || wire != kLen) return false;
    if (field == 1) {
      if (has_key || !read_len(p, end, key) || !is_ascii(key)) return false;
      has_key = true;
    } else {
      if (has_value || !read_len(p, end, value)) return false;
      has_value = true;
    }
  }
  return has_key;
}

int lookup(const std::unordered_map<std::string, int>& keys, Span s) {
  auto it = keys.find(std::string(reinterpret_cast<const char*>(s.p), s.n));
  return it == keys.end() ? -1 : it->second;
}

// The repeated field holding a dtype's values, and whether its elements are varints.
int value_field(int32_t dtype, bool& varint) {
  varint = true;
  switch (dtype) {
    case DT_FLOAT: varint = false; return 3;
    case DT_DOUBLE: varint = false; return 4;
    case DT_INT32: case DT_UINT8: case DT_INT16: case DT_INT8: case DT_UINT16: return 5;
    case DT_INT64: return 7;
    case DT_BOOL: return 8;
    case DT_STRING: return 6;
    default: return -1;  // half, bfloat16, complex: the reference converts them
  }
}

bool check_input(const InputSpec& spec, RawArray& a, ParsedInput& in) {
  if (a.dtype != spec.dtype) return false;
  bool varint;
  int field = value_field(spec.dtype, varint);
  if (field < 0) return false;
  if (a.dims.size() > 32) return false;
  if (spec.has_shape) {
    if (a.dims.size() != spec.shape.size()) return false;
    for (size_t i = 0; i < a.dims.size(); ++i)
      if (spec.shape[i] >= 0 && a.dims[i] != spec.shape[i]) return false;
  }
  int64_t count = 1;
  bool zero = false;
  for (int64_t d : a.dims) {
    if (d < 0) return false;
    if (d == 0) zero = true;
  }
  if (zero) {
    count = 0;
  } else {
    for (int64_t d : a.dims)
      if (__builtin_mul_overflow(count, d, &count) || count > (int64_t(1) << 40)) return false;
  }
  in.shape = std::move(a.dims);
  in.count = count;
  if (field == 6) {
    if (int64_t(a.strings.size()) != count) return false;
    in.strings = std::move(a.strings);
    return true;
  }
  Span v = a.packed[field];
  if (varint) {
    // 1 to 10 bytes a varint; fill_values() checks the exact count as it decodes (one pass).
    if (int64_t(v.n) < count || int64_t(v.n) > count * 10) return false;
  } else {
    size_t width = field == 3 ? 4 : 8;
    if (v.n % width || int64_t(v.n / width) != count) return false;
  }
  in.values = v;
  return true;
}

// Decodes exactly `count` varints of `v` into `dst` as T through convert(raw, T&) (false: refuse).
template <typename T, typename C>
bool fill_n(Span v, const uint8_t* limit, int64_t count, void* dst, C convert) {
  T* out = static_cast<T*>(dst);
  return fill_varints(v, limit, out, out + count, convert);
}

template <typename T>
bool fill_ints(Span v, const uint8_t* limit, int64_t count, void* dst, int64_t lo, int64_t hi) {
  return fill_n<T>(v, limit, count, dst, [lo, hi](uint64_t raw, T& out) {
    int64_t x = int64_t(int32_t(uint32_t(raw)));  // int32 field: upb keeps the low 32 bits
    out = T(x);
    return x >= lo && x <= hi;
  });
}

}  // namespace

bool parse_request(const uint8_t* data, size_t size, const Plan& plan, ParsedRequest& out) {
  const uint8_t* p = data;
  const uint8_t* end = data + size;
  std::vector<char> given(plan.inputs.size(), 0);
  std::vector<Span> seen_keys;
  while (p < end) {
    uint32_t field, wire;
    if (!read_tag(p, end, field, wire)) return false;
    if (field >= 1 && field <= 3 && wire != kLen) return false;
    if (field == 1 || field == 3) {
      Span s;
      if (!read_len(p, end, s) || !is_ascii(s)) return false;
      if (field == 3) out.output_filter.push_back(s);
    } else if (field == 2) {
      Span entry, key, value;
      bool has_value = false;
      if (!read_len(p, end, entry) || !parse_entry(entry, key, value, has_value) || !has_value)
        return false;
      for (const Span& k : seen_keys)  // a repeated map key: the reference keeps the last one
        if (k.n == key.n && std::memcmp(k.p, key.p, k.n) == 0) return false;
      seen_keys.push_back(key);
      int index = lookup(plan.input_keys, key);
      if (index < 0 || given[index]) return false;
      given[index] = 1;
      RawArray a;
      if (!parse_array(value, a)) return false;
      ParsedInput in;
      in.spec = index;
      if (!check_input(plan.inputs[index], a, in)) return false;
      out.inputs.push_back(std::move(in));
    } else if (!skip_value(p, end, wire)) {
      return false;
    }
  }
  if (out.inputs.size() != plan.inputs.size()) return false;
  for (const Span& s : out.output_filter) {
    int index = s.n ? lookup(plan.output_keys, s) : -1;
    if (index < 0) return false;
    out.output_index.push_back(index);
  }
  return true;
}

size_t value_itemsize(const InputSpec& spec) {
  if (spec.fingerprint) return 8;
  switch (spec.dtype) {
    case DT_DOUBLE: case DT_INT64: return 8;
    case DT_FLOAT: case DT_INT32: return 4;
    case DT_INT16: case DT_UINT16: return 2;
    default: return 1;
  }
}

bool fill_values(const Plan& plan, const ParsedInput& in, void* dst, const uint8_t* limit) {
  const InputSpec& spec = plan.inputs[in.spec];
  Span v = in.values;
  switch (spec.dtype) {
    case DT_FLOAT:
    case DT_DOUBLE:
      if (v.n) std::memcpy(dst, v.p, v.n);
      return true;
    case DT_INT32: return fill_ints<int32_t>(v, limit, in.count, dst, INT32_MIN, INT32_MAX);
    case DT_UINT8: return fill_ints<uint8_t>(v, limit, in.count, dst, 0, 255);
    case DT_INT8: return fill_ints<int8_t>(v, limit, in.count, dst, -128, 127);
    case DT_INT16: return fill_ints<int16_t>(v, limit, in.count, dst, -32768, 32767);
    case DT_UINT16: return fill_ints<uint16_t>(v, limit, in.count, dst, 0, 65535);
    case DT_INT64:
      return fill_n<int64_t>(v, limit, in.count, dst, [](uint64_t raw, int64_t& out) {
        out = int64_t(raw);
        return true;
      });
    case DT_BOOL:
      return fill_n<uint8_t>(v, limit, in.count, dst, [](uint64_t raw, uint8_t& out) {
        out = raw != 0;
        return true;
      });
    case DT_STRING: {
      if (!spec.fingerprint) return false;
      uint64_t* out = static_cast<uint64_t*>(dst);
      for (const Span& s : in.strings) *out++ = fingerprint64(s.p, s.n);
      return true;
    }
    default:
      return false;
  }
}

bool fetch_list(const Plan& plan, const ParsedRequest& req, std::vector<int>& fetch) {
  fetch = req.output_index;
  if (fetch.empty()) {
    for (size_t k = 0; k < plan.output_aliases.size(); ++k) fetch.push_back(int(k));
    return true;
  }
  for (size_t a = 0; a < fetch.size(); ++a)
    for (size_t b = a + 1; b < fetch.size(); ++b)
      if (req.output_filter[a].n == req.output_filter[b].n &&
          std::memcmp(req.output_filter[a].p, req.output_filter[b].p, req.output_filter[a].n) == 0)
        return false;
  return true;
}

std::string_view output_key(const Plan& plan, const ParsedRequest& req, const std::vector<int>& fetch, size_t k) {
  if (req.output_index.empty()) return plan.output_aliases[fetch[k]];
  return {reinterpret_cast<const char*>(req.output_filter[k].p), req.output_filter[k].n};
}

}  // namespace sp
