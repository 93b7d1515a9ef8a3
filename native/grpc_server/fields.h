// fields.h -- protobuf fields written and read by hand, as transcode's files share them: small
// writes appended to a string (the responses, small beside their requests: eas_request.h writes
// the requests), reads of strings, dims and element counts over sp::Span (../src/wire.h). Pure
// inline functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../src/wire.h"

namespace spg {

using sp::Span;

// --- writing --------------------------------------------------------------------------------

inline void put_varint(std::string& s, uint64_t v) {
  uint8_t buf[10];
  s.append(reinterpret_cast<const char*>(buf), size_t(sp::write_varint(buf, v) - buf));
}

inline void put_tag(std::string& s, uint32_t field, uint32_t wire) { put_varint(s, uint64_t(field) << 3 | wire); }

inline void put_bytes(std::string& s, uint32_t field, const void* p, size_t n) {
  put_tag(s, field, sp::kLen);
  put_varint(s, n);
  s.append(static_cast<const char*>(p), n);
}

inline void put_bytes(std::string& s, uint32_t field, const std::string& v) { put_bytes(s, field, v.data(), v.size()); }

inline void put_string_if(std::string& s, uint32_t field, const std::string& v) {  // proto3: "" is not written
  if (!v.empty()) put_bytes(s, field, v);
}

// The dims as a packed repeated int64 payload.
inline std::string packed_dims(const std::vector<int64_t>& shape) {
  std::string out;
  for (int64_t d : shape) put_varint(out, uint64_t(d));
  return out;
}

// --- reading --------------------------------------------------------------------------------

inline bool read_string(const uint8_t*& p, const uint8_t* end, uint32_t wire, std::string& out, bool& seen) {
  Span s;
  if (wire != sp::kLen || seen || !sp::read_len(p, end, s) || !sp::is_ascii(s)) return false;
  out.assign(reinterpret_cast<const char*>(s.p), s.n);
  seen = true;
  return true;
}

// Elements of a packed varint payload (false: it ends inside one).
inline bool varint_count(Span s, size_t& count) {
  count = 0;
  for (size_t i = 0; i < s.n; ++i) count += (s.p[i] & 0x80) == 0;
  return s.n == 0 || (s.p[s.n - 1] & 0x80) == 0;
}

// The product of `shape`'s dims; false past 2^62 (no message holds that many elements).
inline bool element_count(const std::vector<int64_t>& shape, size_t& count) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, uint64_t(d), &n) || n > (uint64_t(1) << 62)) return false;
  }
  count = size_t(n);
  return true;
}

// A packed (or, for one element, unpacked) repeated int64 of dims.
inline bool read_dims(const uint8_t*& p, const uint8_t* end, uint32_t wire, std::vector<int64_t>& dims) {
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

}  // namespace spg
