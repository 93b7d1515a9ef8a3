// module_store.cc -- nanobind bindings of the embedding stores' native parts (row_store.h):
//
//   find_rows(keys_by_row, slots, queries, out)        HashIndex probe (slots int32 or int64)
//   lookup_many([(keys_by_row, slots, identity_size, values, default, queries, out), ...]) -> misses
//                                                      each table's index probe + row gather (values
//                                                      float32, or float16 as its uint16 bits), one call
//   RowCache(capacity, dim)                            the hot-row cache (CLOCK), thread-safe
//   cache_lookup_many([(cache, keys, out, miss), ...]) -> misses   several caches' lookups, one call
//
// The caller (processor/features/native_rows.py) allocates every array; these functions fill
// them with the GIL released and check only what keeps memory safe (shapes, sizes): the Python
// wrapper checks the rest. ValueError on a shape that does not fit.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

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

// One table of lookup_many: its arrays' data, checked while the GIL is held.
struct TableLookup {
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
  const int64_t* queries = nullptr;
  int64_t n = 0;
  float* out = nullptr;
};

// Arrays of any dtype (never converted: a converted copy would die before the lookup runs).
using AnyVec = nb::ndarray<nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using AnyMat = nb::ndarray<nb::ndim<2>, nb::c_contig, nb::device::cpu>;

TableLookup table_lookup(nb::handle item) {
  nb::tuple t = nb::cast<nb::tuple>(item);
  require(t.size() == 7, "lookup_many: each table is (keys_by_row, slots, identity_size, values, default, "
                         "queries, out)");
  TableLookup tl;
  Vec<const int64_t> keys = nb::cast<Vec<const int64_t>>(t[0], false);
  tl.keys_by_row = keys.data();
  tl.nkeys = static_cast<int64_t>(keys.shape(0));
  AnyVec slots = nb::cast<AnyVec>(t[1], false);
  tl.slots64 = slots.dtype() == nb::dtype<int64_t>();
  require(tl.slots64 || slots.dtype() == nb::dtype<int32_t>(), "lookup_many: slots must be int32 or int64");
  tl.slots = slots.data();
  tl.nslots = static_cast<int64_t>(slots.shape(0));
  tl.identity_size = nb::cast<int64_t>(t[2]);
  AnyMat values = nb::cast<AnyMat>(t[3], false);
  tl.half = values.dtype() == nb::dtype<uint16_t>();
  require(tl.half || values.dtype() == nb::dtype<float>(), "lookup_many: values must be float32 or float16 bits");
  tl.values = values.data();
  tl.stored = static_cast<int64_t>(values.shape(0));
  tl.dim = static_cast<int64_t>(values.shape(1));
  Vec<const float> fallback = nb::cast<Vec<const float>>(t[4], false);
  Vec<const int64_t> queries = nb::cast<Vec<const int64_t>>(t[5], false);
  Mat<float> out = nb::cast<Mat<float>>(t[6], false);
  require(out.shape(0) == queries.shape(0) && static_cast<int64_t>(out.shape(1)) == tl.dim,
          "lookup_many: out must be [len(queries), dim]");
  require(static_cast<int64_t>(fallback.shape(0)) == tl.dim, "lookup_many: the default vector must have dim values");
  tl.fallback = fallback.data();
  tl.queries = queries.data();
  tl.n = static_cast<int64_t>(queries.shape(0));
  tl.out = out.data();
  return tl;
}

// Several tables' lookups (probe + gather) in one call, the GIL released once: the arrays stay referenced by
// `tables` (the caller's list) for the whole call. Returns each table's misses.
std::vector<int64_t> lookup_many(nb::list tables) {
  std::vector<TableLookup> work;
  work.reserve(tables.size());
  for (nb::handle item : tables) work.push_back(table_lookup(item));
  std::vector<int64_t> misses(work.size());
  nb::gil_scoped_release nogil;
  std::vector<int64_t> rows;
  for (size_t i = 0; i < work.size(); ++i) {
    const TableLookup& t = work[i];
    rows.resize(static_cast<size_t>(t.n));
    if (t.identity_size >= 0) {
      sp::store::find_identity(t.identity_size, t.queries, t.n, rows.data());
    } else if (t.slots64) {
      sp::store::find_rows<int64_t>(t.keys_by_row, t.nkeys, static_cast<const int64_t*>(t.slots), t.nslots,
                                    t.queries, t.n, rows.data());
    } else {
      sp::store::find_rows<int32_t>(t.keys_by_row, t.nkeys, static_cast<const int32_t*>(t.slots), t.nslots,
                                    t.queries, t.n, rows.data());
    }
    misses[i] = t.half ? sp::store::gather_rows<uint16_t>(static_cast<const uint16_t*>(t.values), t.stored, t.dim,
                                                         rows.data(), t.n, t.fallback, t.out)
                       : sp::store::gather_rows<float>(static_cast<const float*>(t.values), t.stored, t.dim,
                                                      rows.data(), t.n, t.fallback, t.out);
  }
  return misses;
}

template <class Slot>
void bind_slot_type(nb::module_& m) {
  m.def("find_rows", &find_rows<Slot>, nb::arg("keys_by_row"), nb::arg("slots").noconvert(),
        nb::arg("queries"), nb::arg("out"));
}

using sp::store::RowCache;

void check_rows(const RowCache& c, const Vec<const int64_t>& keys, size_t rows, size_t dim, const char* what) {
  require(rows == keys.shape(0) && static_cast<int64_t>(dim) == c.dim(), what);
}

// Several caches' lookups in one call, the GIL released once: each item (cache, keys, out,
// miss) as RowCache.lookup takes them (the arrays stay referenced by the caller's list).
std::vector<int64_t> cache_lookup_many(nb::list items) {
  struct Work {
    RowCache* cache;
    const int64_t* keys;
    int64_t n;
    float* out;
    int64_t* miss;
  };
  std::vector<Work> work;
  work.reserve(items.size());
  for (nb::handle item : items) {
    nb::tuple t = nb::cast<nb::tuple>(item);
    require(t.size() == 4, "cache_lookup_many: each item is (cache, keys, out, miss)");
    RowCache& c = nb::cast<RowCache&>(t[0]);
    Vec<const int64_t> keys = nb::cast<Vec<const int64_t>>(t[1], false);
    Mat<float> out = nb::cast<Mat<float>>(t[2], false);
    Vec<int64_t> miss = nb::cast<Vec<int64_t>>(t[3], false);
    check_rows(c, keys, out.shape(0), out.shape(1), "cache_lookup_many: out must be [len(keys), dim]");
    require(miss.shape(0) >= keys.shape(0), "cache_lookup_many: miss must hold len(keys) positions");
    work.push_back({&c, keys.data(), static_cast<int64_t>(keys.shape(0)), out.data(), miss.data()});
  }
  std::vector<int64_t> misses(work.size());
  nb::gil_scoped_release nogil;
  for (size_t i = 0; i < work.size(); ++i)
    misses[i] = work[i].cache->lookup(work[i].keys, work[i].n, work[i].out, work[i].miss);
  return misses;
}

}  // namespace

namespace sp::py {

void bind_store(nb::module_& m) {
  bind_slot_type<int32_t>(m);
  bind_slot_type<int64_t>(m);
  m.def("lookup_many", &lookup_many, nb::arg("tables"));
  m.def("cache_lookup_many", &cache_lookup_many, nb::arg("items"));
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
