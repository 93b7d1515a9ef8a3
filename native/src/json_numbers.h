// json_numbers.h -- numbers as JSON text: the shortest text that reads back as the same double,
// laid out as orjson lays it out (no Python here; thread-safe, pure).
#pragma once

#include <cstdint>
#include <string>

namespace sp {

// Appends `v` (finite) to `out`: "0.1", "1.0", "1000000000000000.0", "0.00001", "1e-7",
// "1.5e+16": the shortest round-trip digits, decimal while the point falls within 16 digits
// of the first one (5 zeros after the point at most), scientific otherwise.
void append_double(std::string& out, double v);

// Appends the decimal text of `v`.
void append_int(std::string& out, int64_t v);
void append_uint(std::string& out, uint64_t v);

}  // namespace sp
