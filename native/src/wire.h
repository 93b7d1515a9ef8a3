// wire.h -- protobuf wire-format primitives (varints, fixed-width values, tags) used by the
// request decoder and the response encoder. Header-only, no Python, no allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace sp {

struct Span {
  const uint8_t* p = nullptr;
  size_t n = 0;
};

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLen = 2, kStartGroup = 3, kEndGroup = 4, kFixed32 = 5 };

// Reads one varint. False on truncation or on a 10th byte carrying bits beyond 64 (upb's
// parser would accept some of those; the caller then defers to the reference decoder).
inline bool read_varint(const uint8_t*& p, const uint8_t* end, uint64_t& out) {
  if (p < end && *p < 0x80) {
    out = *p++;
    return true;
  }
  uint64_t v = 0;
  for (int i = 0; i < 10; ++i) {
    if (p >= end) return false;
    uint8_t b = *p++;
    if (i == 9 && b > 1) return false;
    v |= uint64_t(b & 0x7f) << (7 * i);
    if (!(b & 0x80)) {
      out = v;
      return true;
    }
  }
  return false;
}

// Reads a tag: field number >= 1 and < 2^29, as upb requires.
inline bool read_tag(const uint8_t*& p, const uint8_t* end, uint32_t& field, uint32_t& wire) {
  uint64_t tag;
  if (!read_varint(p, end, tag) || tag > 0xFFFFFFFFu) return false;
  field = uint32_t(tag >> 3);
  wire = uint32_t(tag & 7);
  return field != 0;
}

// Reads a length-delimited payload.
inline bool read_len(const uint8_t*& p, const uint8_t* end, Span& out) {
  uint64_t n;
  if (!read_varint(p, end, n) || n > 0x7FFFFFFFu || n > uint64_t(end - p)) return false;
  out.p = p;
  out.n = size_t(n);
  p += n;
  return true;
}

// Skips one field's value. Groups are not skipped (false): the reference decoder handles them.
inline bool skip_value(const uint8_t*& p, const uint8_t* end, uint32_t wire) {
  uint64_t v;
  Span s;
  switch (wire) {
    case kVarint: return read_varint(p, end, v);
    case kFixed64: if (end - p < 8) return false; p += 8; return true;
    case kLen: return read_len(p, end, s);
    case kFixed32: if (end - p < 4) return false; p += 4; return true;
    default: return false;
  }
}

// Reads the next varint of a packed payload ending at `end`; `limit` is the end of the readable
// buffer, which may lie past the payload. With 16 bytes readable the varint is one 8-byte load:
// its length from the bytes' high bits, its value from three mask-and-shift steps (plus the
// 9th and 10th byte of ids hashed to 64 bits). Same acceptance as read_varint().
inline bool next_varint(const uint8_t*& p, const uint8_t* end, const uint8_t* limit, uint64_t& out) {
  if (limit - p >= 16) {
    uint64_t x;
    std::memcpy(&x, p, 8);  // little-endian: byte i holds bits 7i..7i+6
    uint64_t stops = ~x & 0x8080808080808080ULL;
    size_t len = stops ? size_t(__builtin_ctzll(stops) >> 3) + 1 : (p[8] < 0x80 ? 9 : 10);
    if ((len == 10 && p[9] > 1) || len > size_t(end - p)) return false;
    if (len < 8) x &= (uint64_t(1) << (8 * len)) - 1;
    x = ((x & 0x7f007f007f007f00ULL) >> 1) | (x & 0x007f007f007f007fULL);
    x = ((x & 0x3fff00003fff0000ULL) >> 2) | (x & 0x00003fff00003fffULL);
    x = ((x & 0x0fffffff00000000ULL) >> 4) | (x & 0x000000000fffffffULL);
    if (len > 8) x |= uint64_t(p[8] & 0x7f) << 56;
    if (len > 9) x |= uint64_t(p[9]) << 63;
    p += len;
    out = x;
    return true;
  }
  return read_varint(p, end, out);
}

// Calls f(value) for every varint of a packed payload, in order; false when a varint is
// malformed or too long, or f returns false.
template <typename F>
inline bool for_each_varint(Span s, const uint8_t* limit, F&& f) {
  const uint8_t* p = s.p;
  const uint8_t* end = s.p + s.n;
  while (p < end) {
    uint64_t value;
    if (!next_varint(p, end, limit, value) || !f(value)) return false;
  }
  return true;
}

inline bool is_ascii(Span s) {
  for (size_t i = 0; i < s.n; ++i)
    if (s.p[i] & 0x80) return false;
  return true;
}

inline size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

inline uint8_t* write_varint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = uint8_t(v | 0x80);
    v >>= 7;
  }
  *p++ = uint8_t(v);
  return p;
}

// A length-delimited field's whole size: tag byte (fields 1..15), length, payload.
inline size_t len_field_size(size_t payload) { return 1 + varint_size(payload) + payload; }

}  // namespace sp
