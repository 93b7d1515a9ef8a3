// json_depth.cc -- see json_depth.h.
#include "json_depth.h"

#include <cstring>

namespace sp::json {

size_t nesting_depth(const char* text, size_t size, size_t limit) {
  const char* p = text;
  const char* end = text + size;
  size_t level = 0, deepest = 0;
  while (p < end) {
    char c = *p++;
    if (c == '"') {  // skip the string: to the next quote that no backslash escapes
      for (;;) {
        const void* q = std::memchr(p, '"', size_t(end - p));
        if (q == nullptr) return deepest;  // unclosed: nothing after it nests
        const char* quote = static_cast<const char*>(q);
        size_t backslashes = 0;
        for (const char* b = quote; b > p && b[-1] == '\\'; --b) ++backslashes;
        p = quote + 1;
        if (backslashes % 2 == 0) break;
      }
    } else if (c == '[' || c == '{') {
      if (++level > deepest) {
        deepest = level;
        if (deepest > limit) return deepest;
      }
    } else if ((c == ']' || c == '}') && level > 0) {
      --level;
    }
  }
  return deepest;
}

}  // namespace sp::json
