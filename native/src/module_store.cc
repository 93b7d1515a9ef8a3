// module_store.cc -- nanobind bindings of the embedding stores' native parts (row_store.h):
//
//   find_rows(keys_by_row, slots, queries, out)        HashIndex probe (slots int32 or int64)
//   TableSet([(keys_by_row, slots, identity_size, values, default), ...])
//     .lookup([queries, ...]) -> (rows, misses)        each table's index probe + row gather (values
//                                                      float32, or float16 as its uint16 bits), one call
//   RowCache(capacity, dim)                            the hot-row cache (CLOCK), thread-safe
//   CacheSet([cache or None, ...], dims).lookup([queries, ...]) -> (rows, misses)   several caches, one call
//
// The caller (processor/features/native_rows.py) allocates every array but TableSet's rows; these
// functions fill them with the GIL released and check only what keeps memory safe (shapes, sizes): the Python
// wrapper checks the rest. ValueError on a shape that does not fit.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "module_store.h"
#include "row_store.h"

namespace nb = nanobind;

namespace {

template <class T>
using Vec = nb::ndarray<T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <class T>
using Mat = nb::ndarray<T, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

void require(bool ok, const char* what) {
  if (!ok) throw nb::value_error(what);
}

template <class Slot>
void find_rows(Vec<const int64_t> keys_by_row, Vec<const Slot> slots, Vec<const int64_t> queries,
               Vec<int64_t> out) {
  require(out.shape(0) == queries.shape(0), "find_rows: out must have one row per query");
  nb::gil_scoped_release nogil;
  sp::store::find_rows<Slot>(keys_by_row.data(), static_cast<int64_t>(keys_by_row.shape(0)), slots.data(),
                             static_cast<int64_t>(slots.shape(0)), queries.data(),
                             static_cast<int64_t>(queries.shape(0)), out.data());
}

// One table of a TableSet: its arrays' data, taken while the GIL is held.
struct TableArrays {
  const int64_t* keys_by_row = nullptr;
  int64_t nkeys = 0;
  const void* slots = nullptr;
  int64_t nslots = 0;
  bool slots64 = false;
  int64_t identity_size = -1;
  const void* values = nullptr;
  bool half = false;
  int64_t stored = 0;
  int64_t dim = 0;
  const float* fallback = nullptr;
};

// Arrays of any dtype (never converted: a converted copy would die before the lookup runs).
using AnyVec = nb::ndarray<nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using AnyMat = nb::ndarray<nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Keys = nb::ndarray<const int64_t, nb::c_contig, nb::device::cpu>;  // any shape

TableArrays table_arrays(nb::handle item) {
  nb::tuple t = nb::cast<nb::tuple>(item);
  require(t.size() == 5, "TableSet: each table is (keys_by_row, slots, identity_size, values, default)");
  TableArrays ta;
  Vec<const int64_t> keys = nb::cast<Vec<const int64_t>>(t[0], false);
  ta.keys_by_row = keys.data();
  ta.nkeys = static_cast<int64_t>(keys.shape(0));
  AnyVec slots = nb::cast<AnyVec>(t[1], false);
  ta.slots64 = slots.dtype() == nb::dtype<int64_t>();
  require(ta.slots64 || slots.dtype() == nb::dtype<int32_t>(), "TableSet: slots must be int32 or int64");
  ta.slots = slots.data();
  ta.nslots = static_cast<int64_t>(slots.shape(0));
  ta.identity_size = nb::cast<int64_t>(t[2]);
  AnyMat values = nb::cast<AnyMat>(t[3], false);
  ta.half = values.dtype() == nb::dtype<uint16_t>();
  require(ta.half || values.dtype() == nb::dtype<float>(), "TableSet: values must be float32 or float16 bits");
  ta.values = values.data();
  ta.stored = static_cast<int64_t>(values.shape(0));
  ta.dim = static_cast<int64_t>(values.shape(1));
  Vec<const float> fallback = nb::cast<Vec<const float>>(t[4], false);
  require(static_cast<int64_t>(fallback.shape(0)) == ta.dim, "TableSet: the default vector must have dim values");
  ta.fallback = fallback.data();
  return ta;
}

// One table's probe + gather of n queries into out ([n, dim] float32); returns the misses.
int64_t lookup_table(const TableArrays& t, const int64_t* queries, int64_t n, std::vector<int64_t>& rows,
                     float* out) {
  rows.resize(static_cast<size_t>(n));
  if (t.identity_size >= 0) {
    sp::store::find_identity(t.identity_size, queries, n, rows.data());
  } else if (t.slots64) {
    sp::store::find_rows<int64_t>(t.keys_by_row, t.nkeys, static_cast<const int64_t*>(t.slots), t.nslots, queries,
                                  n, rows.data());
  } else {
    sp::store::find_rows<int32_t>(t.keys_by_row, t.nkeys, static_cast<const int32_t*>(t.slots), t.nslots, queries,
                                  n, rows.data());
  }
  return t.half ? sp::store::gather_rows<uint16_t>(static_cast<const uint16_t*>(t.values), t.stored, t.dim,
                                                  rows.data(), n, t.fallback, out)
                : sp::store::gather_rows<float>(static_cast<const float*>(t.values), t.stored, t.dim, rows.data(), n,
                                               t.fallback, out);
}

constexpr int64_t kAlignFloats = 16;  // 64 bytes: TensorFlow feeds such arrays without a copy

// An uninitialised buffer of `floats` floats on 64 bytes (std::free it); throws bad_alloc.
float* aligned_floats(int64_t floats) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(floats, kAlignFloats)) * sizeof(float);
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<float*>(p);
}

// A version's DRAM tables, their arrays' addresses taken once: a request's lookup passes only its
// keys. Holds references to the arrays, so it never reads freed memory; a table whose arrays are
// replaced (an upsert that grows them) needs a new TableSet to be seen. Immutable: thread-safe.
class TableSet {
 public:
  explicit TableSet(nb::list tables) : keep_(tables) {
    tables_.reserve(tables.size());
    for (nb::handle item : tables) tables_.push_back(table_arrays(item));
  }

  // (rows, misses): per table i, float32 queries[i].shape + [dim] (the queries of any shape),
  // all of them views of one 64-byte-aligned buffer, each block starting on 64 bytes; and
  // how many took the default vector. The GIL is released once for all tables.
  nb::tuple lookup(nb::list queries) const {
    require(queries.size() == tables_.size(), "TableSet.lookup: one key array per table");
    std::vector<Keys> keys;  // referenced by `queries` for the whole call
    std::vector<int64_t> offsets(tables_.size() + 1, 0);
    keys.reserve(tables_.size());
    for (size_t i = 0; i < tables_.size(); ++i) {
      keys.push_back(nb::cast<Keys>(queries[i], false));
      const int64_t floats = static_cast<int64_t>(keys[i].size()) * tables_[i].dim;
      offsets[i + 1] = offsets[i] + (floats + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
    }
    float* buffer = aligned_floats(offsets.back());
    nb::capsule owner(buffer, [](void* p) noexcept { std::free(p); });
    std::vector<int64_t> misses(tables_.size());
    {
      nb::gil_scoped_release nogil;
      std::vector<int64_t> rows;
      for (size_t i = 0; i < tables_.size(); ++i)
        misses[i] = lookup_table(tables_[i], keys[i].data(), static_cast<int64_t>(keys[i].size()), rows,
                                 buffer + offsets[i]);
    }
    nb::list out;
    std::vector<size_t> shape;
    for (size_t i = 0; i < tables_.size(); ++i) {
      shape.assign(keys[i].shape_ptr(), keys[i].shape_ptr() + keys[i].ndim());
      shape.push_back(static_cast<size_t>(tables_[i].dim));
      out.append(nb::ndarray<nb::numpy, float>(buffer + offsets[i], shape.size(), shape.data(), owner).cast());
    }
    return nb::make_tuple(out, nb::cast(misses));
  }

  size_t size() const { return tables_.size(); }

 private:
  std::vector<TableArrays> tables_;
  nb::list keep_;
};

template <class Slot>
void bind_slot_type(nb::module_& m) {
  m.def("find_rows", &find_rows<Slot>, nb::arg("keys_by_row"), nb::arg("slots").noconvert(),
        nb::arg("queries"), nb::arg("out"));
}

using sp::store::RowCache;

void check_rows(const RowCache& c, const Vec<const int64_t>& keys, size_t rows, size_t dim, const char* what) {
  require(rows == keys.shape(0) && static_cast<int64_t>(dim) == c.dim(), what);
}

// A request's tables' hot-row caches (None: a table without one, every id a miss), looked up in
// one call. Holds references to the caches. Immutable (the caches lock themselves): thread-safe.
class CacheSet {
 public:
  CacheSet(nb::list caches, std::vector<int64_t> dims) : keep_(caches), dims_(std::move(dims)) {
    require(caches.size() == dims_.size(), "CacheSet: one dim per cache");
    for (size_t i = 0; i < caches.size(); ++i) {
      RowCache* c = caches[i].is_none() ? nullptr : &nb::cast<RowCache&>(caches[i]);
      require(dims_[i] >= 1 && (c == nullptr || c->dim() == dims_[i]), "CacheSet: a cache's dim differs");
      caches_.push_back(c);
    }
  }

  // (rows, misses): per table, float32 [len(queries[i]), dim] holding the cached rows (the others'
  // rows left for the caller to write), views of one 64-byte-aligned buffer; and the positions of
  // the ids not cached, int64. Queries int64, C-contiguous, any shape (read flat).
  nb::tuple lookup(nb::list queries) const {
    require(queries.size() == caches_.size(), "CacheSet.lookup: one key array per cache");
    std::vector<Keys> keys;  // referenced by `queries` for the whole call
    std::vector<int64_t> offsets(caches_.size() + 1, 0), miss_offsets(caches_.size() + 1, 0);
    keys.reserve(caches_.size());
    for (size_t i = 0; i < caches_.size(); ++i) {
      keys.push_back(nb::cast<Keys>(queries[i], false));
      const int64_t n = static_cast<int64_t>(keys[i].size());
      offsets[i + 1] = offsets[i] + (n * dims_[i] + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
      miss_offsets[i + 1] = miss_offsets[i] + n;
    }
    float* rows = aligned_floats(offsets.back());
    nb::capsule rows_owner(rows, [](void* p) noexcept { std::free(p); });
    int64_t* miss = new int64_t[static_cast<size_t>(std::max<int64_t>(miss_offsets.back(), 1))];
    nb::capsule miss_owner(miss, [](void* p) noexcept { delete[] static_cast<int64_t*>(p); });
    std::vector<int64_t> counts(caches_.size());
    {
      nb::gil_scoped_release nogil;
      for (size_t i = 0; i < caches_.size(); ++i) {
        const int64_t n = static_cast<int64_t>(keys[i].size());
        int64_t* m = miss + miss_offsets[i];
        if (caches_[i] != nullptr) {
          counts[i] = caches_[i]->lookup(keys[i].data(), n, rows + offsets[i], m);
        } else {
          for (int64_t j = 0; j < n; ++j) m[j] = j;
          counts[i] = n;
        }
      }
    }
    nb::list out_rows, out_miss;
    for (size_t i = 0; i < caches_.size(); ++i) {
      size_t shape[2] = {keys[i].size(), static_cast<size_t>(dims_[i])};
      out_rows.append(nb::ndarray<nb::numpy, float, nb::ndim<2>>(rows + offsets[i], 2, shape, rows_owner).cast());
      size_t mshape[1] = {static_cast<size_t>(counts[i])};
      out_miss.append(nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(miss + miss_offsets[i], 1, mshape, miss_owner).cast());
    }
    return nb::make_tuple(out_rows, out_miss);
  }

 private:
  nb::list keep_;
  std::vector<int64_t> dims_;
  std::vector<RowCache*> caches_;
};

}  // namespace

namespace sp::py {

void bind_store(nb::module_& m) {
  bind_slot_type<int32_t>(m);
  bind_slot_type<int64_t>(m);
  nb::class_<TableSet>(m, "TableSet")
      .def(nb::init<nb::list>(), nb::arg("tables"))
      .def("lookup", &TableSet::lookup, nb::arg("queries"))
      .def("__len__", &TableSet::size);
  nb::class_<CacheSet>(m, "CacheSet")
      .def(nb::init<nb::list, std::vector<int64_t>>(), nb::arg("caches"), nb::arg("dims"))
      .def("lookup", &CacheSet::lookup, nb::arg("queries"));
  nb::class_<RowCache>(m, "RowCache")
      .def("__init__",
           [](RowCache* self, int64_t capacity, int64_t dim) {
             require(capacity >= 1 && capacity < (int64_t{1} << 30) && dim >= 1, "RowCache: bad capacity or dim");
             new (self) RowCache(capacity, dim);
           },
           nb::arg("capacity"), nb::arg("dim"))
      .def("lookup",
           [](RowCache& c, Vec<const int64_t> keys, Mat<float> out, Vec<int64_t> miss) {
             check_rows(c, keys, out.shape(0), out.shape(1), "RowCache.lookup: out must be [len(keys), dim]");
             require(miss.shape(0) >= keys.shape(0), "RowCache.lookup: miss must hold len(keys) positions");
             nb::gil_scoped_release nogil;
             return c.lookup(keys.data(), static_cast<int64_t>(keys.shape(0)), out.data(), miss.data());
           },
           nb::arg("keys"), nb::arg("out"), nb::arg("miss"),
           "Rows of the cached keys into out; positions of the others into miss; returns their number.")
      .def("insert",
           [](RowCache& c, Vec<const int64_t> keys, Mat<const float> rows) {
             check_rows(c, keys, rows.shape(0), rows.shape(1), "RowCache.insert: rows must be [len(keys), dim]");
             nb::gil_scoped_release nogil;
             c.insert(keys.data(), rows.data(), static_cast<int64_t>(keys.shape(0)));
           },
           nb::arg("keys"), nb::arg("rows"))
      .def("update",
           [](RowCache& c, Vec<const int64_t> keys, Mat<const float> rows) {
             check_rows(c, keys, rows.shape(0), rows.shape(1), "RowCache.update: rows must be [len(keys), dim]");
             nb::gil_scoped_release nogil;
             return c.update(keys.data(), rows.data(), static_cast<int64_t>(keys.shape(0)));
           },
           nb::arg("keys"), nb::arg("rows"))
      .def("erase",
           [](RowCache& c, Vec<const int64_t> keys) {
             nb::gil_scoped_release nogil;
             return c.erase(keys.data(), static_cast<int64_t>(keys.shape(0)));
           },
           nb::arg("keys"))
      .def("clear", [](RowCache& c) {
        nb::gil_scoped_release nogil;
        c.clear();
      })
      .def("hot_keys",
           [](RowCache& c, int64_t max) {
             std::vector<int64_t> out;
             {
               nb::gil_scoped_release nogil;
               out = c.hot_keys(max);
             }
             return out;
           },
           nb::arg("max"))
      .def_prop_ro("capacity", &RowCache::capacity)
      .def_prop_ro("dim", &RowCache::dim)
      .def_prop_ro("size", &RowCache::size)
      .def_prop_ro("evictions", &RowCache::evictions);
}

}  // namespace sp::py
