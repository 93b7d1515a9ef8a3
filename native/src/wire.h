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

// Reads one varint of a payload whose last byte ends a varint (count_varints() >= 0), so no
// bounds check per byte is needed. Same rule on the 10th byte as read_varint(). `limit` is the
// end of the readable buffer (it may lie past the payload): with 8 bytes readable, a varint of
// up to 8 bytes is decoded with one load and three mask-and-shift steps instead of a byte loop.
inline bool read_varint_terminated(const uint8_t*& p, const uint8_t* limit, uint64_t& out) {
  if (limit - p >= 8) {
    uint64_t x;
    std::memcpy(&x, p, 8);  // little-endian: byte i holds bits 7i..7i+6
    uint64_t stops = ~x & 0x8080808080808080ULL;
    if (stops) {
      int len = (__builtin_ctzll(stops) >> 3) + 1;
      if (len < 8) x &= (uint64_t(1) << (8 * len)) - 1;
      x = ((x & 0x7f007f007f007f00ULL) >> 1) | (x & 0x007f007f007f007fULL);
      x = ((x & 0x3fff00003fff0000ULL) >> 2) | (x & 0x00003fff00003fffULL);
      x = ((x & 0x0fffffff00000000ULL) >> 4) | (x & 0x000000000fffffffULL);
      p += len;
      out = x;
      return true;
    }
  }
  uint64_t v = 0;
  for (int i = 0; i < 10; ++i) {
    uint8_t b = p[i];
    v |= uint64_t(b & 0x7f) << (7 * i);
    if (b < 0x80) {
      if (i == 9 && b > 1) return false;
      p += i + 1;
      out = v;
      return true;
    }
  }
  return false;
}

// Number of varints in a packed payload; -1 when the payload ends inside a varint.
inline int64_t count_varints(Span s) {
  if (s.n == 0) return 0;
  if (s.p[s.n - 1] & 0x80) return -1;
  int64_t n = 0;
  for (size_t i = 0; i < s.n; ++i) n += (s.p[i] < 0x80);
  return n;
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
