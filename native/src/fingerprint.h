// fingerprint.h -- TensorFlow's Fingerprint64 (farmhash's na::Hash64), the hash behind
// tf.strings.to_hash_bucket_fast. Pure function, thread-safe, no Python.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sp {

uint64_t fingerprint64(const uint8_t* s, size_t len);

}  // namespace sp
