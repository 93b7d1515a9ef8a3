// json_values.cc -- see json_values.h.
#include "json_values.h"

#include <cmath>
#include <limits>
#include <type_traits>

namespace sp::json {
namespace {

template <class T>
bool to_int(const std::vector<int64_t>& v, T* dst) {
  for (size_t k = 0; k < v.size(); ++k) {
    if constexpr (std::is_unsigned_v<T>) {
      if (v[k] < 0 || static_cast<uint64_t>(v[k]) > std::numeric_limits<T>::max()) return false;
    } else {
      if (v[k] < std::numeric_limits<T>::min() || v[k] > std::numeric_limits<T>::max()) return false;
    }
    dst[k] = static_cast<T>(v[k]);
  }
  return true;
}

template <class T>
bool to_real(const std::vector<double>& v, T* dst) {
  for (size_t k = 0; k < v.size(); ++k) {
    T x = static_cast<T>(v[k]);
    if (std::isinf(x) && std::isfinite(v[k])) return false;  // out of T's range: the reference decides
    dst[k] = x;
  }
  return true;
}

template <class T>
bool ints_to_real(const std::vector<int64_t>& v, bool via_double, T* dst) {
  for (size_t k = 0; k < v.size(); ++k)
    dst[k] = via_double ? static_cast<T>(static_cast<double>(v[k])) : static_cast<T>(v[k]);
  return true;
}

}  // namespace

bool convert(const Numbers& numbers, Elem elem, bool ints_via_double, void* dst) {
  if (numbers.has_real) {  // the reference refuses reals for an integer input
    if (elem == Elem::F32) return to_real(numbers.reals, static_cast<float*>(dst));
    if (elem == Elem::F64) return to_real(numbers.reals, static_cast<double*>(dst));
    return false;
  }
  const std::vector<int64_t>& v = numbers.ints;
  switch (elem) {
    case Elem::F32: return ints_to_real(v, ints_via_double, static_cast<float*>(dst));
    case Elem::F64: return ints_to_real(v, ints_via_double, static_cast<double*>(dst));
    case Elem::I8: return to_int(v, static_cast<int8_t*>(dst));
    case Elem::I16: return to_int(v, static_cast<int16_t*>(dst));
    case Elem::I32: return to_int(v, static_cast<int32_t*>(dst));
    case Elem::I64: return to_int(v, static_cast<int64_t*>(dst));
    case Elem::U8: return to_int(v, static_cast<uint8_t*>(dst));
    case Elem::U16: return to_int(v, static_cast<uint16_t*>(dst));
    case Elem::U32: return to_int(v, static_cast<uint32_t*>(dst));
    case Elem::U64: return to_int(v, static_cast<uint64_t*>(dst));
  }
  return false;
}

}  // namespace sp::json
