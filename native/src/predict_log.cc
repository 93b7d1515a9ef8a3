// predict_log.cc -- see predict_log.h. Mirrors processor/prediction_log/transcode.py step by step.
#include "predict_log.h"

#include <vector>

namespace sp {
namespace {

// dtype -> the ArrayProto field carrying its values (0: not copied)
int value_field(uint64_t dtype) {
  switch (dtype) {
    case 1: return 3;                                 // float
    case 2: return 4;                                 // double
    case 3: case 4: case 5: case 6: case 17: return 5;  // int32, uint8, int16, int8, uint16
    case 7: return 6;                                 // string
    case 9: return 7;                                 // int64
    case 10: return 8;                                // bool
    default: return 0;
  }
}

// ArrayProto value field -> TensorProto field
int tensor_field(uint32_t field) {
  static const int kMap[9] = {0, 0, 0, 5, 6, 7, 8, 10, 11};
  return field < 9 ? kMap[field] : 0;
}

void put_varint(std::string& out, uint64_t v) {
  uint8_t buf[10];
  out.append(reinterpret_cast<const char*>(buf), size_t(write_varint(buf, v) - buf));
}

void put_len_field(std::string& out, uint32_t field, const char* p, size_t n) {
  put_varint(out, (uint64_t(field) << 3) | kLen);
  put_varint(out, n);
  out.append(p, n);
}

void put_len_field(std::string& out, uint32_t field, const std::string& payload) {
  put_len_field(out, field, payload.data(), payload.size());
}

// One field: a varint value or a length-delimited payload; other wire types fail.
struct Field {
  uint32_t number = 0;
  bool is_len = false;
  uint64_t value = 0;
  Span payload;
};

bool next_field(const uint8_t*& p, const uint8_t* end, Field& f) {
  uint32_t wire;
  if (!read_tag(p, end, f.number, wire)) return false;
  if (wire == kLen) {
    f.is_len = true;
    return read_len(p, end, f.payload);
  }
  f.is_len = false;
  return wire == kVarint && read_varint(p, end, f.value);
}

bool shape(Span s, std::string& out) {
  const uint8_t* p = s.p;
  const uint8_t* end = s.p + s.n;
  while (p < end) {
    Field f;
    if (!next_field(p, end, f) || f.number != 1 || !f.is_len) return false;
    const uint8_t* q = f.payload.p;
    const uint8_t* qend = q + f.payload.n;
    while (q < qend) {
      uint64_t size;
      if (!read_varint(q, qend, size)) return false;
      std::string dim;
      if (size) {
        dim.push_back('\x08');
        put_varint(dim, size);
      }
      put_len_field(out, 2, dim);
    }
  }
  return true;
}

bool tensor(Span s, std::string& out) {
  uint64_t dtype = 0;
  uint32_t values_in = 0;
  std::string dims;
  std::vector<Span> values;
  const uint8_t* p = s.p;
  const uint8_t* end = s.p + s.n;
  while (p < end) {
    Field f;
    if (!next_field(p, end, f)) return false;
    if (f.number == 1 && !f.is_len) {
      dtype = f.value;
    } else if (f.number == 2 && f.is_len) {
      dims.clear();
      if (!shape(f.payload, dims)) return false;
    } else if (tensor_field(f.number) && f.is_len) {
      if (values_in && f.number != values_in) return false;
      values_in = f.number;
      values.push_back(f.payload);
    } else {
      return false;
    }
  }
  int wanted = value_field(dtype);
  if (!wanted || (values_in && int(values_in) != wanted)) return false;
  out.push_back('\x08');
  put_varint(out, dtype);
  if (!dims.empty()) put_len_field(out, 2, dims);
  for (const Span& v : values)
    put_len_field(out, uint32_t(tensor_field(values_in)), reinterpret_cast<const char*>(v.p), v.n);
  return true;
}

// The map<string, ArrayProto> entries under `field` as map<string, TensorProto> entries;
// keys through `aliases` when given.
bool map_entries(Span message, uint32_t field, const std::unordered_map<std::string, std::string>* aliases,
                 std::string& out) {
  const uint8_t* p = message.p;
  const uint8_t* end = message.p + message.n;
  std::string entry, converted;
  while (p < end) {
    Field f;
    if (!next_field(p, end, f)) return false;
    if (f.number != field) continue;
    if (!f.is_len) return false;
    Span key, value;
    const uint8_t* q = f.payload.p;
    const uint8_t* qend = q + f.payload.n;
    while (q < qend) {
      Field part;
      if (!next_field(q, qend, part) || !part.is_len) return false;
      if (part.number == 1) key = part.payload;
      else if (part.number == 2) value = part.payload;
    }
    std::string name(reinterpret_cast<const char*>(key.p), key.n);
    if (aliases) {
      auto it = aliases->find(name);
      if (it == aliases->end()) return false;
      name = it->second;
    }
    converted.clear();
    if (!tensor(value, converted)) return false;
    entry.clear();
    put_len_field(entry, 1, name);
    put_len_field(entry, 2, converted);
    put_len_field(out, field, entry);
  }
  return true;
}

}  // namespace

bool predict_log_tail(Span request, Span response,
                      const std::unordered_map<std::string, std::string>& aliases, std::string& out) {
  std::string req, resp, inner;
  if (!map_entries(request, 2, &aliases, req)) return false;
  const uint8_t* p = request.p;
  const uint8_t* end = request.p + request.n;
  while (p < end) {  // the output filter, copied as it is
    Field f;
    if (!next_field(p, end, f)) return false;
    if (f.number == 3 && f.is_len)
      put_len_field(req, 3, reinterpret_cast<const char*>(f.payload.p), f.payload.n);
  }
  if (!map_entries(response, 1, nullptr, resp)) return false;
  put_len_field(inner, 1, req);
  put_len_field(inner, 2, resp);
  put_len_field(out, 6, inner);
  return true;
}

}  // namespace sp
