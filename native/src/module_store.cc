// module_store.cc -- nanobind bindings of the embedding stores' native parts (row_store.h):
//
//   find_rows(keys_by_row, slots, queries, out)        HashIndex probe (slots int32 or int64)
//   find_slots(keys_by_row, slots, queries, out, where) the same, and the slot naming each row
//   place_rows(keys, rows, slots) -> removed slots taken  HashIndex insert of absent keys
//   TableSet([(keys_by_row, slots, identity_size, values, default), ...])
//     .lookup([queries, ...]) -> (rows, counts)        each table's index probe + row gather (values
//                                                      float32, or float16 as its uint16 bits), one call
//   RowCache(capacity, dim)                            the hot-row cache (CLOCK), thread-safe
//   CacheSet([cache or None, ...], dims)
//     .lookup([queries, ...]) -> (rows, misses)        several caches' lookups, one call
//
// The caller (processor/features/native_rows.py, row_cache.py) allocates every array but the
// sets' rows and miss positions; these functions fill them with the GIL released and check only
// what keeps memory safe (shapes, sizes): the Python wrapper checks the rest. ValueError on a
// shape that does not fit.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include "numpy_api.h"

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

template <class Slot>
void find_slots(Vec<const int64_t> keys_by_row, Vec<const Slot> slots, Vec<const int64_t> queries,
                Vec<int64_t> out, Vec<int64_t> where) {
  require(out.shape(0) == queries.shape(0) && where.shape(0) == queries.shape(0),
          "find_slots: out and where must have one row per query");
  nb::gil_scoped_release nogil;
  sp::store::find_rows<Slot>(keys_by_row.data(), static_cast<int64_t>(keys_by_row.shape(0)), slots.data(),
                             static_cast<int64_t>(slots.shape(0)), queries.data(),
                             static_cast<int64_t>(queries.shape(0)), out.data(), where.data());
}

template <class Slot>
int64_t place_rows(Vec<const int64_t> keys, Vec<const int64_t> rows, Vec<Slot> slots) {
  require(rows.shape(0) == keys.shape(0), "place_rows: one row per key");
  require(slots.shape(0) > 0, "place_rows: the index has no slots");
  nb::gil_scoped_release nogil;
  return sp::store::place_rows<Slot>(keys.data(), rows.data(), static_cast<int64_t>(keys.shape(0)), slots.data(),
                                     static_cast<int64_t>(slots.shape(0)));
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

// An uninitialised buffer of `floats` floats on 64 bytes, owned by the returned capsule.
std::pair<float*, nb::capsule> aligned_floats(int64_t floats) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(floats, kAlignFloats)) * sizeof(float);
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) throw std::bad_alloc();
  return {static_cast<float*>(p), nb::capsule(p, [](void* q) noexcept { std::free(q); })};
}

// A request's key arrays, read with numpy's C API (nanobind's ndarray import costs a few
// microseconds an array, and a request has one per table): an int64, C-contiguous, aligned array
// is read in place; anything else is converted (ValueError/TypeError when it cannot be), the copy
// kept alive here.
struct KeyArrays {
  std::vector<PyArrayObject*> arrays;
  std::vector<nb::object> converted;

  KeyArrays(nb::list queries, size_t expected, const char* what) {
    require(queries.size() == expected, what);
    arrays.reserve(expected);
    for (size_t i = 0; i < expected; ++i) {
      PyObject* q = queries[i].ptr();
      if (PyArray_Check(q) && PyArray_TYPE(reinterpret_cast<PyArrayObject*>(q)) == NPY_INT64 &&
          PyArray_ISCARRAY_RO(reinterpret_cast<PyArrayObject*>(q)) &&
          PyArray_ISNOTSWAPPED(reinterpret_cast<PyArrayObject*>(q))) {
        arrays.push_back(reinterpret_cast<PyArrayObject*>(q));  // referenced by `queries`
        continue;
      }
      PyObject* c = PyArray_FROMANY(q, NPY_INT64, 0, 0, NPY_ARRAY_CARRAY_RO | NPY_ARRAY_FORCECAST);
      if (c == nullptr) throw nb::python_error();
      converted.push_back(nb::steal(c));
      arrays.push_back(reinterpret_cast<PyArrayObject*>(c));
    }
  }
  const int64_t* data(size_t i) const { return static_cast<const int64_t*>(PyArray_DATA(arrays[i])); }
  int64_t size(size_t i) const { return static_cast<int64_t>(PyArray_SIZE(arrays[i])); }
};

// An array of numpy `type` (float32 unless said) over `data`, owned by `base`, of shape `dims` +
// [last] (last < 0: `dims` only).
nb::object array_view(void* data, int nd, const npy_intp* dims, npy_intp last, const nb::capsule& base,
                      int type = NPY_FLOAT32) {
  require(nd + (last >= 0 ? 1 : 0) <= NPY_MAXDIMS, "keys have too many dimensions for their rows' shape");
  npy_intp shape[NPY_MAXDIMS];
  std::copy(dims, dims + nd, shape);
  if (last >= 0) shape[nd++] = last;
  PyObject* a = PyArray_New(&PyArray_Type, nd, shape, type, nullptr, data, 0, NPY_ARRAY_CARRAY, nullptr);
  if (a == nullptr) throw nb::python_error();
  nb::object view = nb::steal(a);
  Py_INCREF(base.ptr());
  if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(a), base.ptr()) < 0) throw nb::python_error();
  return view;
}

// An int64 array [rows, cols] holding `values` (row-major).
nb::object int64_matrix(const std::vector<int64_t>& values, npy_intp rows, npy_intp cols) {
  npy_intp dims[2] = {rows, cols};
  PyObject* a = PyArray_SimpleNew(2, dims, NPY_INT64);
  if (a == nullptr) throw nb::python_error();
  std::copy(values.begin(), values.end(), static_cast<int64_t*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(a))));
  return nb::steal(a);
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

  // (rows, counts): per table i, float32 queries[i].shape + [dim], all of them views of one
  // 64-byte-aligned buffer, each block starting on 64 bytes; and int64 [3, tables]: 1 (a
  // lookup), the ids looked up and how many took the default vector, per table. Queries int64
  // of any shape (others are converted). The GIL is released once for all tables.
  nb::tuple lookup(nb::list queries) const {
    const size_t n = tables_.size();
    KeyArrays keys(queries, n, "TableSet.lookup: one key array per table");
    std::vector<int64_t> offsets(n + 1, 0);
    for (size_t i = 0; i < n; ++i) {
      const int64_t floats = keys.size(i) * tables_[i].dim;
      offsets[i + 1] = offsets[i] + (floats + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
    }
    auto [buffer, owner] = aligned_floats(offsets.back());
    std::vector<int64_t> counts(3 * n);
    {
      nb::gil_scoped_release nogil;
      std::vector<int64_t> rows;
      for (size_t i = 0; i < n; ++i) {
        counts[i] = 1;
        counts[n + i] = keys.size(i);
        counts[2 * n + i] = lookup_table(tables_[i], keys.data(i), keys.size(i), rows, buffer + offsets[i]);
      }
    }
    nb::list out;
    for (size_t i = 0; i < n; ++i)
      out.append(array_view(buffer + offsets[i], PyArray_NDIM(keys.arrays[i]), PyArray_DIMS(keys.arrays[i]),
                            tables_[i].dim, owner));
    return nb::make_tuple(out, int64_matrix(counts, 3, static_cast<npy_intp>(n)));
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
  m.def("find_slots", &find_slots<Slot>, nb::arg("keys_by_row"), nb::arg("slots").noconvert(),
        nb::arg("queries"), nb::arg("out"), nb::arg("where"));
  m.def("place_rows", &place_rows<Slot>, nb::arg("keys"), nb::arg("rows"), nb::arg("slots").noconvert());
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

  // (rows, misses): per table, float32 [queries[i].size, dim] holding the cached rows (the
  // others' rows left for the caller to write), views of one 64-byte-aligned buffer; and the
  // positions of the ids not cached, int64. Queries int64 of any shape, read flat (others are
  // converted).
  nb::tuple lookup(nb::list queries) const {
    const size_t n = caches_.size();
    KeyArrays keys(queries, n, "CacheSet.lookup: one key array per cache");
    std::vector<int64_t> offsets(n + 1, 0), miss_offsets(n + 1, 0);
    for (size_t i = 0; i < n; ++i) {
      offsets[i + 1] = offsets[i] + (keys.size(i) * dims_[i] + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
      miss_offsets[i + 1] = miss_offsets[i] + keys.size(i);
    }
    auto [rows, rows_owner] = aligned_floats(offsets.back());
    // int64 positions in a buffer of floats' size units: 2 floats an int64, 64-byte aligned too
    auto [miss_floats, miss_owner] = aligned_floats(2 * miss_offsets.back());
    int64_t* miss = reinterpret_cast<int64_t*>(miss_floats);
    std::vector<int64_t> counts(n);
    {
      nb::gil_scoped_release nogil;
      for (size_t i = 0; i < n; ++i) {
        int64_t* m = miss + miss_offsets[i];
        if (caches_[i] != nullptr) {
          counts[i] = caches_[i]->lookup(keys.data(i), keys.size(i), rows + offsets[i], m);
        } else {
          for (int64_t j = 0; j < keys.size(i); ++j) m[j] = j;
          counts[i] = keys.size(i);
        }
      }
    }
    nb::list out_rows, out_miss;
    for (size_t i = 0; i < n; ++i) {
      const npy_intp size = keys.size(i), missed = counts[i];
      out_rows.append(array_view(rows + offsets[i], 1, &size, dims_[i], rows_owner));
      out_miss.append(array_view(miss + miss_offsets[i], 1, &missed, -1, miss_owner, NPY_INT64));
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
