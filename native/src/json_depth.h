// json_depth.h -- how deeply a JSON text nests arrays and objects.
#pragma once

#include <cstddef>

namespace sp::json {

// The deepest nesting of arrays and objects in text[0, size) (brackets inside strings do not
// count; 1 for "[1]", 0 for "3"), counted up to `limit` + 1: the scan stops there, so a body
// that is too deep costs no more than its first limit + 1 levels. The text need not be valid
// JSON: a stray closing bracket lowers the level (never below 0), an unclosed string ends the
// count. The Python reference is server/http/json_stream.py's nesting_depth.
size_t nesting_depth(const char* text, size_t size, size_t limit);

}  // namespace sp::json
