// wire.h -- protobuf wire-format primitives (varints, fixed-width values, tags) used by the
// request decoder and the response encoder. Header-only, no Python, no allocation.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define SP_VARINT_PEXT 1  // BMI2's pext, chosen at run time (varint_pext())
#endif

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

// The value of a varint's first min(len, 8) bytes `x` (little-endian: byte i holds bits
// 7i..7i+6): the bytes past it masked off, the 7-bit groups packed in three mask-and-shift steps.
inline uint64_t varint_low(uint64_t x, size_t len) {
  if (len < 8) x &= (uint64_t(1) << (8 * len)) - 1;
  x = ((x & 0x7f007f007f007f00ULL) >> 1) | (x & 0x007f007f007f007fULL);
  x = ((x & 0x3fff00003fff0000ULL) >> 2) | (x & 0x00003fff00003fffULL);
  return ((x & 0x0fffffff00000000ULL) >> 4) | (x & 0x000000000fffffffULL);
}

// `low` (the value of the first 8 bytes) with the 9th and 10th byte of a varint of `len` bytes
// at `p`: ids hashed to 64 bits take 9 or 10. The caller has checked the 10th byte (0 or 1).
inline uint64_t varint_high(uint64_t low, size_t len, const uint8_t* p) {
  if (len > 8) low |= uint64_t(p[8] & 0x7f) << 56;
  if (len > 9) low |= uint64_t(p[9]) << 63;
  return low;
}

// Reads the next varint of a packed payload ending at `end`; `limit` is the end of the readable
// buffer, which may lie past the payload. With 16 bytes readable the varint is one 8-byte load,
// its length from the bytes' high bits. Same acceptance as read_varint().
inline bool next_varint(const uint8_t*& p, const uint8_t* end, const uint8_t* limit, uint64_t& out) {
  if (limit - p >= 16) {
    uint64_t x;
    std::memcpy(&x, p, 8);
    uint64_t stops = ~x & 0x8080808080808080ULL;
    size_t len = stops ? size_t(__builtin_ctzll(stops) >> 3) + 1 : (p[8] < 0x80 ? 9 : 10);
    if ((len == 10 && p[9] > 1) || len > size_t(end - p)) return false;
    out = varint_high(varint_low(x, len), len, p);
    p += len;
    return true;
  }
  return read_varint(p, end, out);
}

// The terminator bytes (bit 7 clear: a varint's last byte) of the 64 bytes at `block`, as a
// mask: bit i for byte i. Each 8 bytes' high bits are gathered into one byte by one multiply.
inline uint64_t varint_stops(const uint8_t* block) {
  uint64_t stops = 0;
  for (int k = 0; k < 8; ++k) {
    uint64_t x;
    std::memcpy(&x, block + 8 * k, 8);
    uint64_t high = ((x & 0x8080808080808080ULL) * 0x0002040810204081ULL) >> 56;
    stops |= (~high & 0xFF) << (8 * k);
  }
  return stops;
}

// Decodes the varints from `p` that end in whole 64-byte blocks of [p, end) lying at least 8
// bytes before `limit` into `dst` (up to `stop`) through convert(raw, T&) (false: refuse), and
// leaves `p` at the first varint and `dst` at the first value it did not decode. Each
// varint's bytes are read at the offsets its block's terminator mask gives, so the loop's
// dependency chain is the walk over the mask's bits, not a load per varint as in next_varint().
// `low` is varint_low() or its pext twin. False, as read_varint(), for a varint of more than 10
// bytes or a 10th byte over 1; or for more values than room, or one convert refuses.
template <typename T, typename C, typename Low>
__attribute__((always_inline)) inline bool varint_blocks(const uint8_t*& p, const uint8_t* end,
                                                         const uint8_t* limit, T*& dst, T* stop,
                                                         C convert, Low low) {
  const uint8_t* start = p;
  T* out = dst;  // locals, so the loop keeps them in registers
  for (const uint8_t* block = p; end - block >= 64 && limit - block >= 72; block += 64) {
    for (uint64_t stops = varint_stops(block); stops; stops &= stops - 1) {
      const uint8_t* last = block + __builtin_ctzll(stops);
      size_t len = size_t(last - start) + 1;
      if (len > 10 || (len == 10 && *last > 1) || out == stop) return false;
      uint64_t x;
      std::memcpy(&x, start, 8);  // start + 8 <= block + 72 <= limit
      if (!convert(varint_high(low(x, len), len, start), *out++)) return false;
      start = last + 1;
    }
  }
  p = start;
  dst = out;
  return true;
}

struct PlainLow {
  uint64_t operator()(uint64_t x, size_t len) const { return varint_low(x, len); }
};

#ifdef SP_VARINT_PEXT
// Whether varints are packed with BMI2's pext (one instruction for varint_low()'s three steps):
// where the CPU has it and runs it fast (Intel from Haswell, AMD from Zen 3; Zen 1 and 2
// microcode it at tens to hundreds of cycles). Set once from the CPU; tests switch it to check
// both paths against the reference.
inline bool pext_is_fast() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("bmi2")) return false;
  if (!__builtin_cpu_is("amd")) return true;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  unsigned family = (a >> 8) & 0xf;
  if (family == 0xf) family += (a >> 20) & 0xff;
  return family >= 0x19;
}

inline std::atomic<bool>& varint_pext() {
  static std::atomic<bool> on{pext_is_fast()};
  return on;
}

struct PextLow {
  __attribute__((target("bmi2"))) uint64_t operator()(uint64_t x, size_t len) const {
    return _pext_u64(x, 0x7f7f7f7f7f7f7f7fULL >> (64 - 8 * (len < 8 ? len : 8)));
  }
};

// varint_blocks() compiled for BMI2, so PextLow inlines; called only where varint_pext() holds.
template <typename T, typename C>
__attribute__((target("bmi2"))) bool varint_blocks_pext(const uint8_t*& p, const uint8_t* end,
                                                        const uint8_t* limit, T*& dst, T* stop, C convert) {
  return varint_blocks(p, end, limit, dst, stop, convert, PextLow{});
}
#endif

// Decodes exactly stop - dst varints of payload `s` into [dst, stop) through convert(raw, T&)
// (false: refuse); false when a varint is malformed or too long, the count differs, or convert
// refuses. `limit`: the end of the readable buffer (at or past the payload's end).
template <typename T, typename C>
inline bool fill_varints(Span s, const uint8_t* limit, T* dst, T* stop, C convert) {
  const uint8_t* p = s.p;
  const uint8_t* end = s.p + s.n;
#ifdef SP_VARINT_PEXT
  bool ok = varint_pext().load(std::memory_order_relaxed)
                ? varint_blocks_pext(p, end, limit, dst, stop, convert)
                : varint_blocks(p, end, limit, dst, stop, convert, PlainLow{});
#else
  bool ok = varint_blocks(p, end, limit, dst, stop, convert, PlainLow{});
#endif
  if (!ok) return false;
  while (p < end) {
    uint64_t value;
    if (dst == stop || !next_varint(p, end, limit, value) || !convert(value, *dst++)) return false;
  }
  return dst == stop;
}

inline bool is_ascii(Span s) {
  for (size_t i = 0; i < s.n; ++i)
    if (s.p[i] & 0x80) return false;
  return true;
}

// (floor(log2 v) * 9 + 73) / 64 is ceil(bits / 7) for 1 to 64 bits: no loop, no division
// (protobuf's); a batch-256 request's hashed ids are sized one by one.
inline size_t varint_size(uint64_t v) { return (size_t(63 - __builtin_clzll(v | 1)) * 9 + 73) / 64; }

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

// A length-delimited field's head (one tag byte: fields 1..15) at p; its payload follows.
inline uint8_t* write_len_header(uint8_t* p, uint8_t tag, size_t n) {
  *p++ = tag;
  return write_varint(p, n);
}

}  // namespace sp
