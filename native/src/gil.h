// gil.h -- giving up the GIL for native work that pays for the hand-over (the bindings only).
#pragma once

#include <Python.h>

#include <cstddef>

namespace sp::py {

// Below this many bytes of work, keeping the GIL is cheaper than handing it over.
constexpr size_t kReleaseBytes = 16384;

// Releases the GIL for the scope when `release` is true.
class MaybeRelease {
 public:
  explicit MaybeRelease(bool release) : state_(release ? PyEval_SaveThread() : nullptr) {}
  ~MaybeRelease() {
    if (state_) PyEval_RestoreThread(state_);
  }
  MaybeRelease(const MaybeRelease&) = delete;
  MaybeRelease& operator=(const MaybeRelease&) = delete;

 private:
  PyThreadState* state_;
};

}  // namespace sp::py
