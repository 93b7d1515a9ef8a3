// json_values.h -- JSON numbers as typed arrays, the way the Python reference converts them
// (no Python here; pure functions, thread-safe).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sp::json {

// The numbers of one value, 8 bytes each: integer literals that fit int64 while all are
// integers; from the first other number on (a real), every one as a double: an integer as
// static_cast<double>, what converting it through float64 does first anyway.
struct Numbers {
  std::vector<int64_t> ints;
  std::vector<double> reals;
  bool has_real = false;

  void add_int(int64_t v) {
    if (has_real) {
      reals.push_back(static_cast<double>(v));
    } else {
      ints.push_back(v);
    }
  }
  void add_real(double v) {
    if (!has_real) {
      has_real = true;
      reals.reserve(ints.size() * 2 + 16);
      for (int64_t i : ints) reals.push_back(static_cast<double>(i));
      ints = std::vector<int64_t>();
    }
    reals.push_back(v);
  }
  size_t size() const { return has_real ? reals.size() : ints.size(); }
};

// The element types numbers convert to.
enum class Elem { F32, F64, I8, I16, I32, I64, U8, U16, U32, U64 };

// Writes `numbers` as `elem` into dst; false where the reference refuses or must decide: a real
// for an integer type, an integer out of the type's range, a finite real that would become an
// infinity. Integers alone convert straight to a float type (numpy's int64 array's astype),
// or through float64 with `ints_via_double` (KServe v2's astype(float64) first).
bool convert(const Numbers& numbers, Elem elem, bool ints_via_double, void* dst);

}  // namespace sp::json
