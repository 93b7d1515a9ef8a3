// json_numbers.cc -- see json_numbers.h.
#include "json_numbers.h"

#include <charconv>
#include <cmath>

namespace sp {

void append_double(std::string& out, double v) {
  if (v == 0) {
    out += std::signbit(v) ? "-0.0" : "0.0";
    return;
  }
  // The shortest round-trip digits, in the form d[.ddd]e(+|-)xx; then laid out again.
  char sci[32];
  auto res = std::to_chars(sci, sci + sizeof sci, v, std::chars_format::scientific);
  const char* p = sci;
  const char* end = res.ptr;
  if (*p == '-') {
    out += '-';
    ++p;
  }
  char digits[20];
  int n = 0;
  for (; p < end && *p != 'e'; ++p)
    if (*p != '.') digits[n++] = *p;
  int exp10 = 0;  // v = d.ddd * 10^exp10
  std::from_chars(p + 1 + (p[1] == '+'), end, exp10);
  int point = exp10 + 1;  // digits before the decimal point: v = 0.ddd * 10^point
  if (point > 0 && point <= 16) {
    if (n <= point) {  // 1234e7 -> 12340000000.0
      out.append(digits, n);
      out.append(size_t(point - n), '0');
      out += ".0";
    } else {  // 1234e-2 -> 12.34
      out.append(digits, point);
      out += '.';
      out.append(digits + point, n - point);
    }
  } else if (point > -5 && point <= 0) {  // 1234e-6 -> 0.001234
    out += "0.";
    out.append(size_t(-point), '0');
    out.append(digits, n);
  } else {  // 1e-7, 1.5e+16
    out += digits[0];
    if (n > 1) {
      out += '.';
      out.append(digits + 1, n - 1);
    }
    out += exp10 < 0 ? "e-" : "e+";
    append_int(out, exp10 < 0 ? -int64_t(exp10) : int64_t(exp10));
  }
}

void append_int(std::string& out, int64_t v) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, res.ptr);
}

void append_uint(std::string& out, uint64_t v) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, res.ptr);
}

}  // namespace sp
