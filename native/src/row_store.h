// row_store.h -- the embedding stores' hot path without Python: the DRAM store's key index probe
// and row gather, and the hot-row cache in front of Redis.
//
// No Python here; module_store.cc binds it (and releases the GIL around every call).
//
// * find_rows / gather_rows read the arrays of processor/features/hash_index.py's HashIndex and
//   dram_store.py's DramTable in place (the Python classes own them and stay the reference):
//   keys by row (int64), slots (int32 or int64, -1 empty, -2 a removed key's: probes go on past
//   it; linear probing from ((mix64(key) >> 32) * S) >> 32), rows float32 or float16 (IEEE half,
//   as uint16 bits).
// * RowCache is a CLOCK (second chance) cache of float32 rows keyed by int64 ids, bounded in rows.
//   Lookups share a reader lock and only set a reference bit; inserts, updates and erases take
//   the writer lock. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <vector>

namespace sp::store {

// SplitMix64's finaliser, as processor.features.hash_index.mix64 (salt 0).
inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// IEEE half (bits) -> float, exact (every half is a float).
float half_to_float(uint16_t h);

// The slot values of HashIndex that name no row: never used, and left by a removed key (a probe
// goes on past it, as past another key's slot).
constexpr int64_t kEmptySlot = -1;
constexpr int64_t kRemovedSlot = -2;

// out[i] = the row of queries[i] in the index, -1 when absent. `Slot` is int32_t or int64_t.
// A slot naming a row past nkeys ends the probe (never read out of bounds). `where`, if given:
// the position of the slot naming that row, -1 when absent (HashIndex.locate: a delta's removals).
template <class Slot>
void find_rows(const int64_t* keys_by_row, int64_t nkeys, const Slot* slots, int64_t nslots,
               const int64_t* queries, int64_t n, int64_t* out, int64_t* where = nullptr);
// Insert keys[i] (absent from the index, distinct) naming rows[i]: each takes the first slot from
// its home that is empty or a removed key's (linear probing). Returns how many removed keys'
// slots were taken, or -1 when a key found no free slot (the caller keeps the load below 0.8).
// HashIndex._place is the reference (it may give a colliding key another slot: the keys are found
// the same).
template <class Slot>
int64_t place_rows(const int64_t* keys, const int64_t* rows, int64_t n, Slot* slots, int64_t nslots);
// The index in identity mode: keys 0..size-1 are rows 0..size-1.
void find_identity(int64_t size, const int64_t* queries, int64_t n, int64_t* out);

// out[i, :] = values[rows[i], :] as float32, or `fallback` where rows[i] is not in [0, nrows);
// returns how many took the fallback. `V` is float or uint16_t (half bits).
template <class V>
int64_t gather_rows(const V* values, int64_t nrows, int64_t dim, const int64_t* rows, int64_t n,
                    const float* fallback, float* out);

class RowCache {
 public:
  RowCache(int64_t capacity, int64_t dim);

  // Copies the cached row of each key into out[i] and sets its reference bit; writes the
  // positions i of the keys not cached into miss[] and returns their number.
  int64_t lookup(const int64_t* keys, int64_t n, float* out, int64_t* miss);
  // Caches rows (a key already cached is overwritten); a full cache evicts by CLOCK.
  void insert(const int64_t* keys, const float* rows, int64_t n);
  // Overwrites the rows of the keys that are cached; returns how many were.
  int64_t update(const int64_t* keys, const float* rows, int64_t n);
  // Drops the keys that are cached; returns how many were.
  int64_t erase(const int64_t* keys, int64_t n);
  void clear();
  // Up to `max` cached keys, those referenced since the hand last passed them first.
  std::vector<int64_t> hot_keys(int64_t max);

  int64_t capacity() const { return capacity_; }
  int64_t dim() const { return dim_; }
  int64_t size();
  int64_t evictions();

 private:
  int64_t probe(int64_t key) const;  // position in table_ holding key, or -1
  void remove_at(uint64_t pos);
  int64_t victim();

  const int64_t capacity_;
  const int64_t dim_;
  std::shared_mutex mu_;
  std::vector<int32_t> table_;  // open addressing over slots, -1 empty; power of two >= 2 x capacity
  uint64_t mask_;
  int shift_;
  std::vector<int64_t> slot_key_;
  std::unique_ptr<float[]> values_;  // capacity x dim, left uninitialised: pages are touched as rows come
  std::unique_ptr<std::atomic<uint8_t>[]> ref_;
  std::vector<uint8_t> busy_;  // slot holds a key
  int64_t used_ = 0;   // slots ever filled (free slots are taken before any eviction)
  int64_t size_ = 0;   // keys held
  int64_t hand_ = 0;
  int64_t evictions_ = 0;
  std::vector<int64_t> free_;  // slots emptied by erase
};

}  // namespace sp::store
