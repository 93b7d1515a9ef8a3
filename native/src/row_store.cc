// row_store.cc -- see row_store.h.
#include "row_store.h"

#include <algorithm>
#include <cstring>
#include <mutex>

namespace sp::store {

namespace {

// half -> float for all 65536 halves, computed once (256 KiB): one load per value at lookup.
struct HalfTable {
  float v[65536];
  HalfTable() {
    for (uint32_t h = 0; h < 65536; ++h) {
      uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, bits;
      if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);  // inf, nan
      } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
      } else if (man == 0) {
        bits = sign;
      } else {  // subnormal: normalise
        int e = -1;
        do {
          ++e;
          man <<= 1;
        } while ((man & 0x400u) == 0);
        bits = sign | ((112 - e) << 23) | ((man & 0x3FFu) << 13);
      }
      std::memcpy(&v[h], &bits, 4);
    }
  }
};

const HalfTable& half_table() {
  static const HalfTable table;
  return table;
}

inline void copy_row(const float* src, int64_t dim, float* dst) { std::memcpy(dst, src, dim * sizeof(float)); }

inline void copy_row(const uint16_t* src, int64_t dim, float* dst) {
  const float* t = half_table().v;
  for (int64_t j = 0; j < dim; ++j) dst[j] = t[src[j]];
}

}  // namespace

float half_to_float(uint16_t h) { return half_table().v[h]; }

template <class Slot>
void find_rows(const int64_t* keys_by_row, int64_t nkeys, const Slot* slots, int64_t nslots,
               const int64_t* queries, int64_t n, int64_t* out, int64_t* where) {
  if (nslots <= 0) {
    std::fill(out, out + n, -1);
    if (where != nullptr) std::fill(where, where + n, -1);
    return;
  }
  const uint64_t count = static_cast<uint64_t>(nslots);
  // Two dependent cache misses per key (its slot, then the key stored for that slot's row): the
  // slot is prefetched 2 * kAhead keys ahead, and kAhead keys ahead (the slot cached by then) the
  // stored key it names, so both misses overlap with other keys' work.
  constexpr int64_t kAhead = 8;
  auto home = [count](int64_t key) {
    return static_cast<uint64_t>(((mix64(static_cast<uint64_t>(key)) >> 32) * count) >> 32);
  };
  for (int64_t i = 0; i < n; ++i) {
    if (i + 2 * kAhead < n) __builtin_prefetch(&slots[home(queries[i + 2 * kAhead])]);
    if (i + kAhead < n) {
      const int64_t s = static_cast<int64_t>(slots[home(queries[i + kAhead])]);
      if (s >= 0 && s < nkeys) __builtin_prefetch(&keys_by_row[s]);
    }
    const int64_t key = queries[i];
    uint64_t pos = home(key);
    int64_t row = -1;
    for (uint64_t probes = 0; probes < count; ++probes) {
      const int64_t s = static_cast<int64_t>(slots[pos]);
      if (s == kEmptySlot || s >= nkeys) break;
      if (s >= 0 && keys_by_row[s] == key) {  // a removed key's slot (kRemovedSlot) is passed over
        row = s;
        break;
      }
      if (++pos == count) pos = 0;
    }
    out[i] = row;
    if (where != nullptr) where[i] = row >= 0 ? static_cast<int64_t>(pos) : -1;
  }
}

template void find_rows<int32_t>(const int64_t*, int64_t, const int32_t*, int64_t, const int64_t*, int64_t,
                                 int64_t*, int64_t*);
template void find_rows<int64_t>(const int64_t*, int64_t, const int64_t*, int64_t, const int64_t*, int64_t,
                                 int64_t*, int64_t*);

template <class Slot>
int64_t place_rows(const int64_t* keys, const int64_t* rows, int64_t n, Slot* slots, int64_t nslots) {
  const uint64_t count = static_cast<uint64_t>(nslots);
  int64_t removed_taken = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint64_t pos = ((mix64(static_cast<uint64_t>(keys[i])) >> 32) * count) >> 32;
    uint64_t probes = 0;
    while (slots[pos] >= 0) {
      if (++pos == count) pos = 0;
      if (++probes == count) return -1;  // no free slot: the caller keeps the load below 0.8
    }
    removed_taken += slots[pos] == static_cast<Slot>(kRemovedSlot);
    slots[pos] = static_cast<Slot>(rows[i]);
  }
  return removed_taken;
}

template int64_t place_rows<int32_t>(const int64_t*, const int64_t*, int64_t, int32_t*, int64_t);
template int64_t place_rows<int64_t>(const int64_t*, const int64_t*, int64_t, int64_t*, int64_t);

void find_identity(int64_t size, const int64_t* queries, int64_t n, int64_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = (queries[i] >= 0 && queries[i] < size) ? queries[i] : -1;
}

template <class V>
int64_t gather_rows(const V* values, int64_t nrows, int64_t dim, const int64_t* rows, int64_t n,
                    const float* fallback, float* out) {
  constexpr int64_t kAhead = 12;  // rows prefetched ahead of the copy
  int64_t misses = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n && rows[i + kAhead] >= 0 && rows[i + kAhead] < nrows) {
      const char* p = reinterpret_cast<const char*>(values + rows[i + kAhead] * dim);
      for (int64_t b = 0; b < dim * static_cast<int64_t>(sizeof(V)); b += 64) __builtin_prefetch(p + b);
    }
    if (rows[i] >= 0 && rows[i] < nrows) {
      copy_row(values + rows[i] * dim, dim, out + i * dim);
    } else {
      copy_row(fallback, dim, out + i * dim);
      ++misses;
    }
  }
  return misses;
}

template int64_t gather_rows<float>(const float*, int64_t, int64_t, const int64_t*, int64_t, const float*, float*);
template int64_t gather_rows<uint16_t>(const uint16_t*, int64_t, int64_t, const int64_t*, int64_t, const float*,
                                       float*);

// --- RowCache --------------------------------------------------------------------------------

RowCache::RowCache(int64_t capacity, int64_t dim)
    : capacity_(std::max<int64_t>(1, capacity)), dim_(std::max<int64_t>(1, dim)) {
  uint64_t size = 16;
  int bits = 4;
  while (size < static_cast<uint64_t>(capacity_) * 2) {
    size <<= 1;
    ++bits;
  }
  table_.assign(size, -1);
  mask_ = size - 1;
  shift_ = 64 - bits;
  slot_key_.assign(capacity_, 0);
  values_.reset(new float[static_cast<size_t>(capacity_ * dim_)]);
  ref_.reset(new std::atomic<uint8_t>[capacity_]);
  for (int64_t i = 0; i < capacity_; ++i) ref_[i].store(0, std::memory_order_relaxed);
  busy_.assign(capacity_, 0);
}

int64_t RowCache::probe(int64_t key) const {
  uint64_t pos = mix64(static_cast<uint64_t>(key)) >> shift_;
  while (true) {
    const int32_t s = table_[pos];
    if (s < 0) return -1;
    if (slot_key_[s] == key) return static_cast<int64_t>(pos);
    pos = (pos + 1) & mask_;
  }
}

int64_t RowCache::lookup(const int64_t* keys, int64_t n, float* out, int64_t* miss) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  int64_t misses = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = probe(keys[i]);
    if (pos < 0) {
      miss[misses++] = i;
      continue;
    }
    const int32_t s = table_[pos];
    copy_row(&values_[static_cast<size_t>(s) * dim_], dim_, out + i * dim_);
    if (ref_[s].load(std::memory_order_relaxed) == 0) ref_[s].store(1, std::memory_order_relaxed);
  }
  return misses;
}

void RowCache::remove_at(uint64_t pos) {
  // Backward-shift deletion: pull later entries of the probe run into the hole.
  uint64_t hole = pos;
  uint64_t j = pos;
  while (true) {
    j = (j + 1) & mask_;
    const int32_t s = table_[j];
    if (s < 0) break;
    const uint64_t home = mix64(static_cast<uint64_t>(slot_key_[s])) >> shift_;
    // Move s into the hole unless its home lies cyclically in (hole, j].
    const bool stays = (hole <= j) ? (home > hole && home <= j) : (home > hole || home <= j);
    if (!stays) {
      table_[hole] = s;
      hole = j;
    }
  }
  table_[hole] = -1;
}

int64_t RowCache::victim() {
  if (!free_.empty()) {
    const int64_t s = free_.back();
    free_.pop_back();
    return s;
  }
  if (used_ < capacity_) return used_++;
  while (true) {  // CLOCK: clear reference bits until an unreferenced slot comes by
    const int64_t s = hand_;
    hand_ = (hand_ + 1 == capacity_) ? 0 : hand_ + 1;
    if (ref_[s].load(std::memory_order_relaxed)) {
      ref_[s].store(0, std::memory_order_relaxed);
      continue;
    }
    remove_at(static_cast<uint64_t>(probe(slot_key_[s])));
    busy_[s] = 0;
    --size_;
    ++evictions_;
    return s;
  }
}

void RowCache::insert(const int64_t* keys, const float* rows, int64_t n) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = probe(keys[i]);
    if (pos >= 0) {
      copy_row(rows + i * dim_, dim_, &values_[static_cast<size_t>(table_[pos]) * dim_]);
      continue;
    }
    const int64_t s = victim();
    slot_key_[s] = keys[i];
    busy_[s] = 1;
    ref_[s].store(0, std::memory_order_relaxed);
    copy_row(rows + i * dim_, dim_, &values_[static_cast<size_t>(s) * dim_]);
    uint64_t p = mix64(static_cast<uint64_t>(keys[i])) >> shift_;
    while (table_[p] >= 0) p = (p + 1) & mask_;
    table_[p] = static_cast<int32_t>(s);
    ++size_;
  }
}

int64_t RowCache::update(const int64_t* keys, const float* rows, int64_t n) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  int64_t found = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = probe(keys[i]);
    if (pos < 0) continue;
    copy_row(rows + i * dim_, dim_, &values_[static_cast<size_t>(table_[pos]) * dim_]);
    ++found;
  }
  return found;
}

int64_t RowCache::erase(const int64_t* keys, int64_t n) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  int64_t found = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = probe(keys[i]);
    if (pos < 0) continue;
    const int32_t s = table_[pos];
    remove_at(static_cast<uint64_t>(pos));
    busy_[s] = 0;
    ref_[s].store(0, std::memory_order_relaxed);
    free_.push_back(s);
    --size_;
    ++found;
  }
  return found;
}

void RowCache::clear() {
  std::unique_lock<std::shared_mutex> lock(mu_);
  std::fill(table_.begin(), table_.end(), -1);
  std::fill(busy_.begin(), busy_.end(), 0);
  for (int64_t i = 0; i < capacity_; ++i) ref_[i].store(0, std::memory_order_relaxed);
  free_.clear();
  used_ = size_ = hand_ = 0;
}

std::vector<int64_t> RowCache::hot_keys(int64_t max) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::vector<int64_t> out;
  for (int pass = 0; pass < 2; ++pass) {  // referenced slots first, then the rest
    for (int64_t s = 0; s < used_ && static_cast<int64_t>(out.size()) < max; ++s) {
      if (busy_[s] && (ref_[s].load(std::memory_order_relaxed) != 0) == (pass == 0)) out.push_back(slot_key_[s]);
    }
  }
  return out;
}

int64_t RowCache::size() {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return size_;
}

int64_t RowCache::evictions() {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return evictions_;
}

}  // namespace sp::store
