// tfs_scan.cc -- see tfs_scan.h.
#include "tfs_scan.h"

#include <charconv>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace sp::json {
namespace {

// Dimensions of one input, the row dimension included: far below numpy's 64 (the reference
// refuses past those), above any served signature's rank.
constexpr size_t kMaxRank = 32;

// The first byte from p on that is not JSON whitespace (or end).
const char* skip_space(const char* p, const char* end) {
  while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) ++p;
  return p;
}

class Scanner {
 public:
  Scanner(const char* data, size_t size) : p_(data), end_(data + size) {}

  bool document(TfsScan& out) {
    if (!lit('{')) return false;
    bool body = false;
    do {
      std::string_view key;
      if (!name(key) || !lit(':')) return false;
      if (key == "signature_name") {
        std::string_view value;
        if (out.has_signature_name || !name(value)) return false;
        out.has_signature_name = true;
        out.signature_name.assign(value);
      } else if (key == "instances" || key == "inputs") {
        if (body) return false;  // both, or one twice: the reference's to judge
        body = true;
        out.columnar = key == "inputs";
        if (!(out.columnar ? columns(out) : rows(out))) return false;
      } else {
        return false;
      }
    } while (lit(','));
    if (!body || !lit('}')) return false;
    space();
    return p_ == end_;
  }

 private:
  // {"instances": [ {name: value, ...}, ... ]} or [value, ...]
  bool rows(TfsScan& out) {
    if (!lit('[')) return false;
    space();
    if (p_ < end_ && *p_ == '{') return object_rows(out);
    ScannedInput in;
    int64_t count = 0;
    do {
      if (!(count ? expect(in.numbers, in.shape.data(), in.shape.size())
                  : discover(in.numbers, in.shape, kMaxRank - 1)))
        return false;
      ++count;
    } while (lit(','));
    if (!lit(']')) return false;
    in.shape.insert(in.shape.begin(), count);
    out.inputs.push_back(std::move(in));
    return true;
  }

  bool object_rows(TfsScan& out) {
    int64_t count = 0;
    std::vector<uint8_t> seen;
    do {
      if (!lit('{')) return false;
      size_t members = 0;
      seen.assign(out.inputs.size(), 0);
      do {
        std::string_view key;
        if (!name(key) || !lit(':')) return false;
        if (count == 0) {
          for (const ScannedInput& in : out.inputs)
            if (in.name == key) return false;  // a duplicate member
          out.inputs.emplace_back();
          ScannedInput& in = out.inputs.back();
          in.name.assign(key);
          if (!discover(in.numbers, in.shape, kMaxRank - 1)) return false;
        } else {
          size_t k = 0;
          while (k < out.inputs.size() && out.inputs[k].name != key) ++k;
          if (k == out.inputs.size() || seen[k]) return false;  // another input, or a duplicate
          seen[k] = 1;
          ScannedInput& in = out.inputs[k];
          if (!expect(in.numbers, in.shape.data(), in.shape.size())) return false;
        }
        ++members;
      } while (lit(','));
      if (!lit('}') || members != out.inputs.size()) return false;
      ++count;
    } while (lit(','));
    if (!lit(']')) return false;
    for (ScannedInput& in : out.inputs) in.shape.insert(in.shape.begin(), count);
    return true;
  }

  // {"inputs": {name: value, ...}} or a bare value
  bool columns(TfsScan& out) {
    space();
    if (p_ < end_ && *p_ != '{') {
      ScannedInput in;
      if (!discover(in.numbers, in.shape, kMaxRank) || in.shape.empty()) return false;
      out.inputs.push_back(std::move(in));
      return true;
    }
    if (!lit('{')) return false;
    do {
      std::string_view key;
      if (!name(key) || !lit(':')) return false;
      for (const ScannedInput& in : out.inputs)
        if (in.name == key) return false;
      out.inputs.emplace_back();
      ScannedInput& in = out.inputs.back();
      in.name.assign(key);
      // a scalar (shape ()) is the reference's: numpy's 0-d array
      if (!discover(in.numbers, in.shape, kMaxRank) || in.shape.empty()) return false;
    } while (lit(','));
    return lit('}');
  }

  // A value of numbers and nested lists of at most `rank` dimensions, its shape appended to
  // `shape` (which it starts empty).
  bool discover(Numbers& numbers, std::vector<int64_t>& shape, size_t rank) {
    space();
    if (p_ < end_ && *p_ == '[') {
      ++p_;
      if (shape.size() >= rank) return false;
      size_t at = shape.size();
      shape.push_back(0);
      if (!discover(numbers, shape, rank)) return false;  // an empty list too
      int64_t count = 1;
      while (lit(',')) {
        if (!expect(numbers, shape.data() + at + 1, shape.size() - at - 1)) return false;
        ++count;
      }
      if (!lit(']')) return false;
      shape[at] = count;
      return true;
    }
    return number(numbers);
  }

  // A value of the shape `dims` (rank dims).
  bool expect(Numbers& numbers, const int64_t* dims, size_t rank) {
    if (rank == 0) return number(numbers);
    if (!lit('[')) return false;
    for (int64_t k = 0; k < dims[0]; ++k) {
      if (k && !lit(',')) return false;
      if (!expect(numbers, dims + 1, rank - 1)) return false;
    }
    return lit(']');
  }

  // A JSON number (RFC 8259's grammar): an integer literal as int64, any other as the nearest
  // double (both as Python reads them). Locals, not the members: a char may alias them.
  bool number(Numbers& numbers) {
    space();
    const char* p = p_;
    const char* const end = end_;
    const char* start = p;
    if (p < end && *p == '-') ++p;
    if (p >= end) return false;
    uint64_t magnitude = 0;  // the integer part's value while it has at most 19 digits
    const char* digits = p;
    if (*p == '0') {
      ++p;
    } else if (*p >= '1' && *p <= '9') {
      while (p < end && digit(*p)) magnitude = magnitude * 10 + uint64_t(*p++ - '0');
    } else {
      return false;  // true, false, null, strings, NaN: the reference's
    }
    bool is_real = false;
    if (p < end && *p == '.') {
      is_real = true;
      if (++p >= end || !digit(*p)) return false;
      while (p < end && digit(*p)) ++p;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
      is_real = true;
      ++p;
      if (p < end && (*p == '+' || *p == '-')) ++p;
      if (p >= end || !digit(*p)) return false;
      while (p < end && digit(*p)) ++p;
    }
    p_ = p;
    if (is_real) {
      double d;
      auto res = std::from_chars(start, p, d);
      if (res.ec != std::errc() || res.ptr != p) return false;  // past a double's range
      numbers.add_real(d);
    } else {
      bool negative = *start == '-';
      // past int64 (more digits than 19 may have wrapped the magnitude): Python's int, not ours
      if (p - digits > 19 || magnitude > uint64_t(INT64_MAX) + (negative ? 1 : 0)) return false;
      numbers.add_int(negative ? int64_t(0 - magnitude) : int64_t(magnitude));
    }
    return true;
  }

  // A member name or string value of printable ASCII without escapes.
  bool name(std::string_view& out) {
    if (!lit('"')) return false;
    const char* start = p_;
    while (p_ < end_ && *p_ != '"') {
      unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '\\' || c < 0x20 || c >= 0x7f) return false;
      ++p_;
    }
    if (p_ >= end_) return false;
    out = std::string_view(start, size_t(p_ - start));
    ++p_;
    return true;
  }

  bool lit(char c) {
    space();
    if (p_ < end_ && *p_ == c) {
      ++p_;
      return true;
    }
    return false;
  }

  void space() { p_ = skip_space(p_, end_); }

  static bool digit(char c) { return c >= '0' && c <= '9'; }

  const char* p_;
  const char* end_;
};

// Whether every string of the body is a member name (followed by ':') but at most one (the
// signature name): memchr over the quotes, a small share of a scan. A body with string values
// (a string input's) is the reference's, and this says so before numbers are read in vain.
bool names_only(const char* p, const char* end) {
  int values = 0;
  while ((p = static_cast<const char*>(std::memchr(p, '"', size_t(end - p)))) != nullptr) {
    const char* close = static_cast<const char*>(std::memchr(p + 1, '"', size_t(end - p - 1)));
    if (close == nullptr) return false;
    p = skip_space(close + 1, end);
    if ((p >= end || *p != ':') && ++values > 1) return false;
  }
  return true;
}

}  // namespace

bool scan_tfs(const char* data, size_t size, TfsScan& out) {
  out = TfsScan();
  return names_only(data, data + size) && Scanner(data, size).document(out);
}

}  // namespace sp::json
