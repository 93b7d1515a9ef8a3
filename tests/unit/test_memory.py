"""processor/memory.py and the stores' memory counts: the ``memory_limit`` setting against cgroup
and /proc files written here, the load estimate over files in a temporary store, the resident
set and ``malloc_trim``; what a version's DRAM / DRAM+SSD tables and hot-row cache count
(private and in a shared segment)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from processor import memory
from processor.checkpoint.tensor_file import write_tensors
from processor.config import ModelConfig
from processor.features import native_rows
from processor.features.dram_store import DramStore
from processor.features.ev_checkpoint import TableSource
from processor.features.row_cache import HotRowCache, index_bytes
from processor.features.rows import RowChunk, TableSpec
from processor.features.tiered_store import TieredStore
from processor.store.checkpoint_layout import latest_version
from processor.store.model_store import ModelStore
from processor.store.model_version import ModelVersion

GIB = 1 << 30


@pytest.fixture
def files(tmp_path, monkeypatch):
    """Point the module's cgroup and /proc paths at files of this test (none exist at first);
    returns a writer ``(name, text)`` for ``v2``, ``v1`` (the mount roots' limits), ``meminfo``,
    ``statm``, ``cgroup`` (/proc/self/cgroup) and any other path under the cgroup mount."""
    root = tmp_path / "cgroup"
    (root / "memory").mkdir(parents=True)
    paths = {"v2": root / "memory.max", "v1": root / "memory" / "memory.limit_in_bytes",
             "meminfo": tmp_path / "meminfo", "statm": tmp_path / "statm", "cgroup": tmp_path / "proc_cgroup"}
    monkeypatch.setattr(memory, "CGROUP_ROOT", str(root))
    monkeypatch.setattr(memory, "PROC_CGROUP", str(paths["cgroup"]))
    monkeypatch.setattr(memory, "MEMINFO", str(paths["meminfo"]))
    monkeypatch.setattr(memory, "STATM", str(paths["statm"]))

    def write(name: str, text: str) -> None:
        path = paths.get(name) or root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    return write


def meminfo(total_bytes: int) -> str:
    return f"MemTotal:       {total_bytes // 1024} kB\nMemFree:        1000 kB\n"


def test_default_is_nine_tenths_of_the_cgroup_limit_capped_by_the_machine(files):
    files("meminfo", meminfo(16 * GIB))
    files("v2", f"{2 * GIB}\n")
    assert memory.memory_limit(None) == int(0.9 * 2 * GIB)
    files("v2", f"{64 * GIB}\n")  # a cgroup limit above the machine's memory bounds nothing
    assert memory.memory_limit(None) == int(0.9 * 16 * GIB)
    files("v2", "max\n")
    assert memory.memory_limit(None) == int(0.9 * 16 * GIB)


def test_cgroup_v1_and_its_no_limit_value(files):
    files("meminfo", meminfo(8 * GIB))
    files("v1", f"{GIB}\n")
    assert memory.memory_limit(None) == int(0.9 * GIB)
    files("v1", "9223372036854771712\n")  # v1's "no limit"
    assert memory.memory_limit(None) == int(0.9 * 8 * GIB)
    files("v2", f"{2 * GIB}\n")  # v2 is read first
    assert memory.memory_limit(None) == int(0.9 * 2 * GIB)


def test_the_process_own_cgroup_and_its_parents_bound_it(files):
    files("meminfo", meminfo(64 * GIB))
    files("cgroup", "0::/kubepods/pod1/ctr\n")
    files("kubepods/pod1/ctr/memory.max", "max\n")
    files("kubepods/pod1/memory.max", f"{3 * GIB}\n")  # the pod's limit bounds the container
    files("kubepods/memory.max", f"{5 * GIB}\n")
    assert memory.memory_limit(None) == int(0.9 * 3 * GIB)
    files("kubepods/pod1/ctr/memory.max", f"{2 * GIB}\n")  # its own, tighter
    assert memory.memory_limit(None) == int(0.9 * 2 * GIB)
    # cgroup v1 (a hybrid host: its unified line names no memory.max), a container whose mount
    # is its own cgroup: the host's path matches nothing but the mount's root
    files("cgroup", "12:memory:/docker/abc\n0::/\n")
    for name in ("kubepods/pod1/ctr/memory.max", "kubepods/pod1/memory.max", "kubepods/memory.max"):
        files(name, "max\n")
    files("v1", f"{GIB}\n")
    assert memory.memory_limit(None) == int(0.9 * GIB)
    files("memory/docker/abc/memory.limit_in_bytes", f"{GIB // 2}\n")  # the host's view: its own file
    assert memory.memory_limit(None) == int(0.9 * GIB // 2)


def test_settings_share_bytes_and_off(files):
    files("meminfo", meminfo(10 * GIB))
    files("v2", f"{4 * GIB}\n")
    assert memory.memory_limit(0.5) == 2 * GIB
    assert memory.memory_limit(1) == 4 * GIB  # 1 is the whole, not one byte
    assert memory.memory_limit(1.0) == 4 * GIB
    assert memory.memory_limit(3_000_000_000) == 3_000_000_000  # bytes, whatever the machine has
    assert memory.memory_limit(2e9) == 2_000_000_000
    assert memory.memory_limit(0) is None and memory.memory_limit(0.0) is None
    for bad in (-1, -0.5, True):
        with pytest.raises(ValueError, match="memory_limit"):
            memory.memory_limit(bad)


def test_nothing_readable_means_no_limit_for_a_share_but_bytes_still_count(files):
    assert memory.memory_limit(None) is None
    assert memory.memory_limit(0.5) is None
    assert memory.memory_limit(GIB) == GIB
    files("meminfo", "MemTotal: lots\n")
    assert memory.memory_limit(None) is None


def test_process_rss_from_statm(files):
    files("statm", "1000 25 7 1 0 30 0\n")
    assert memory.process_rss_bytes() == 25 * os.sysconf("SC_PAGE_SIZE")
    files("statm", "")
    assert memory.process_rss_bytes() == 0


def test_process_rss_of_this_process_follows_an_allocation():
    before = memory.process_rss_bytes()
    block = np.ones(64 << 20, np.uint8)  # touched: resident
    assert memory.process_rss_bytes() - before >= 48 << 20
    del block
    assert isinstance(memory.trim(), bool)


def test_trim_is_a_no_op_without_malloc_trim(monkeypatch):
    monkeypatch.setattr(memory, "_malloc_trim", lambda: None)
    assert memory.trim() is False


def test_memory_parts_fills_every_part_and_refuses_unknown_ones():
    assert memory.memory_parts() == dict.fromkeys(memory.PARTS, 0)
    assert list(memory.memory_parts({"device": 2}, {"weights": 1, "device": 3})) == list(memory.PARTS)
    assert memory.memory_parts({"device": 2}, {"weights": 1, "device": 3})["device"] == 5
    with pytest.raises(ValueError, match="unknown memory part 'table'"):
        memory.memory_parts({"table": 1})


# --- estimate_load_bytes ----------------------------------------------------------------------


def sized(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)


def config(tmp_path: Path, backend: str = "auto", **more) -> ModelConfig:
    return ModelConfig.from_dict({"savedmodel_dir": str(tmp_path / "sm"), "backend": backend, **more})


def test_store_size():
    store = ModelStore()
    assert store.size(__file__) == Path(__file__).stat().st_size
    with pytest.raises(FileNotFoundError):
        store.size(__file__ + ".missing")


def test_estimate_of_an_onnx_model_is_its_file(tmp_path):
    sized(tmp_path / "sm" / "model.onnx", 5000)
    sized(tmp_path / "sm" / "a.onnx", 70)  # model.onnx is the one the engine picks
    sized(tmp_path / "sm" / "variables" / "variables.data-00000-of-00001", 999)
    version = ModelVersion(-1, -1, savedmodel_dir=str(tmp_path / "sm"))
    store = ModelStore()
    assert memory.estimate_load_bytes(store, version, config(tmp_path)) == 5000
    assert memory.estimate_load_bytes(store, version, config(tmp_path, "onnxruntime")) == 5000
    # TensorFlow never reads the .onnx file: its variables count
    assert memory.estimate_load_bytes(store, version, config(tmp_path, "tensorflow")) == 999
    (tmp_path / "sm" / "model.onnx").unlink()
    assert memory.estimate_load_bytes(store, version, config(tmp_path)) == 70


def test_estimate_of_a_savedmodel_is_its_variable_shards(tmp_path):
    variables = tmp_path / "sm" / "variables"
    sized(variables / "variables.data-00000-of-00002", 300)
    sized(variables / "variables.data-00001-of-00002", 200)
    sized(variables / "variables.index", 40)
    sized(tmp_path / "sm" / "saved_model.pb", 10_000)  # the graph: no parameter
    version = ModelVersion(-1, -1, savedmodel_dir=str(tmp_path / "sm"))
    assert memory.estimate_load_bytes(ModelStore(), version, config(tmp_path)) == 500


def test_estimate_with_a_checkpoint_dir_is_the_full_plus_its_deltas(tmp_path):
    sized(tmp_path / "sm" / "saved_model.pb", 100)
    sized(tmp_path / "sm" / "variables" / "variables.data-00000-of-00001", 7777)  # not read: the checkpoint is
    run = tmp_path / "ckpt"
    (run.parent / "ckpt").mkdir(parents=True)
    (run / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-10"\n')
    sized(run / "model.ckpt-10.index", 10)
    sized(run / "model.ckpt-10.data-00000-of-00002", 4000)
    sized(run / "model.ckpt-10.data-00001-of-00002", 1000)
    sized(run / "model.ckpt-1.index", 10)  # another full: a prefix of the served one's name
    sized(run / "model.ckpt-1.data-00000-of-00001", 123)
    deltas = run / ".incremental_checkpoint"
    for step, size in ((11, 30), (12, 40)):
        sized(deltas / f"incremental_model.ckpt-{step}.index", 5)
        sized(deltas / f"incremental_model.ckpt-{step}.data-00000-of-00001", size)
    store = ModelStore()
    cumulative = latest_version(store, str(tmp_path / "sm"), str(run))
    assert cumulative.label == "10+12"
    assert memory.estimate_load_bytes(store, cumulative, config(tmp_path)) == 5000 + 40
    chained = latest_version(store, str(tmp_path / "sm"), str(run), delta_mode="chain")
    assert memory.estimate_load_bytes(store, chained, config(tmp_path)) == 5000 + 30 + 40
    bare = latest_version(store, str(tmp_path / "sm"), str(run), pin_step=10)
    assert memory.estimate_load_bytes(store, bare, config(tmp_path)) == 5000


# --- what a version's tables count ------------------------------------------------------------

ROWS, DIM = 3000, 8


@pytest.fixture
def checkpoint(tmp_path):
    """A full checkpoint of an EmbeddingVariable table (raw ids) and a plain one (row ids)."""
    rng = np.random.default_rng(3)
    tensors = {"ev-keys": rng.choice(10**9, ROWS, replace=False).astype(np.int64),
               "ev-values": rng.standard_normal((ROWS, DIM)).astype(np.float32),
               "plain": rng.standard_normal((500, 4)).astype(np.float32)}
    prefix = str(tmp_path / "ckpt" / "model.ckpt-10")
    os.makedirs(os.path.dirname(prefix))
    write_tensors(prefix, tensors)
    return prefix


SPECS = {"ev": TableSpec("ev", DIM, "raw", ROWS), "plain": TableSpec("plain", 4, "row", 500)}
ROW_BYTES = ROWS * DIM * 4 + 500 * 4 * 4


def test_dram_tables_count_rows_and_index_and_follow_deltas(checkpoint):
    vt = DramStore().open_version("run-10", SPECS, TableSource(checkpoint))
    counted = vt.memory()
    # raw ids: an index of 8 bytes of key plus 4 / 0.7 bytes of slot a row; row ids: none
    index = vt.tables["ev"].index.nbytes
    assert 13 * ROWS <= index <= 15 * ROWS + 64
    assert counted == {"tables": ROW_BYTES + index, "shared": 0}
    vt.apply_delta({"ev": RowChunk(np.arange(10**12, 10**12 + 100), np.ones((100, DIM), np.float32))}, step=11)
    assert vt.memory()["tables"] > counted["tables"]  # grown, with room for more rows
    vt.release()
    assert vt.memory() == {"tables": 0, "shared": 0}


def test_shared_tables_count_in_shared_once_and_growth_goes_private(shm_worker, checkpoint):
    first = DramStore().open_version("run-10", SPECS, TableSource(checkpoint))
    second = DramStore().open_version("run-10", SPECS, TableSource(checkpoint))
    size = first.shared.segment.size
    assert size >= ROW_BYTES
    for vt in (first, second):
        assert vt.memory() == {"tables": 0, "shared": size}
    first.apply_delta({"ev": RowChunk(np.array([10**12]), np.ones((1, DIM), np.float32))}, step=11)
    grown = first.memory()
    assert grown["shared"] == size and grown["tables"] >= ROWS * DIM * 4  # its own copy of the grown table
    assert second.memory() == {"tables": 0, "shared": size}
    first.release()
    second.release()


def test_dram_ssd_counts_its_dram_tier_not_its_file(tmp_path, checkpoint):
    budget = ROW_BYTES // 4
    vt = TieredStore(str(tmp_path / "ssd"), budget).open_version("run-10", SPECS, TableSource(checkpoint))
    counted = vt.memory()["tables"]
    cache = sum(t._cache.nbytes for t in vt.tables.values())
    assert cache <= budget
    # the cache, 9 bytes a cache slot of bookkeeping, the index and 4 bytes a row of slot map
    assert cache < counted < cache + 30 * (ROWS + 500) + 9 * sum(t.cache_rows for t in vt.tables.values())
    assert counted < ROW_BYTES  # the rows themselves are on the SSD
    vt.release()


@pytest.mark.skipif(not native_rows.AVAILABLE, reason="the hot-row cache is native (scripts/build_native.sh)")
def test_hot_row_cache_counts_its_index_and_the_rows_it_holds():
    specs = {"t": TableSpec("t", 16, "row", 1000)}
    cache = HotRowCache(specs, 1 << 20)
    capacity = cache.capacity_rows("t")
    assert capacity == 1000  # a small table is cached whole
    assert index_bytes(1000) == 4 * 2048 + 10 * 1000
    assert cache.nbytes() == index_bytes(capacity)
    cache.insert("t", np.arange(300, dtype=np.int64), np.ones((300, 16), np.float32))
    assert cache.nbytes() == index_bytes(capacity) + 300 * 16 * 4
    assert HotRowCache(specs, 0).nbytes() == 0


def test_estimate_of_an_onnx_model_counts_its_external_data(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    def external(name: str, location: str) -> TensorProto:
        tensor = helper.make_tensor(name, TensorProto.FLOAT, [4], [0.0] * 4)
        tensor.ClearField("float_data")
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", "0"), ("length", "16")):
            tensor.external_data.add(key=key, value=value)
        return tensor
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              [external("a", "weights.bin"), external("b", "weights.bin")])
    sm = tmp_path / "sm"
    sm.mkdir()
    onnx.save(helper.make_model(graph), str(sm / "model.onnx"))
    with open(sm / "weights.bin", "wb") as f:  # sparse: sized, not written
        f.truncate(3 << 30)
    sized(sm / "unrelated.bin", 999)  # not named by the model
    version = ModelVersion(-1, -1, savedmodel_dir=str(sm))
    model_bytes = (sm / "model.onnx").stat().st_size
    assert memory.estimate_load_bytes(ModelStore(), version, config(tmp_path)) == model_bytes + (3 << 30)


class _Node:
    """A reference cycle (``self.me = self``) for the collector tests."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def frozen_cycle():
    """A weak reference to a cycle frozen with the rest of the process's objects (as the server's
    tune_gc freezes), unreachable from then on; the process unfrozen after the test."""
    import gc
    import weakref

    node = _Node()
    ref = weakref.ref(node)
    gc.collect()
    gc.freeze()
    del node
    gc.collect()
    try:
        yield ref
    finally:
        gc.unfreeze()


def test_collect_cycles_frees_a_frozen_cycle_and_freezes_again(frozen_cycle):
    import gc

    assert frozen_cycle() is not None  # frozen: a plain collection never looks at it
    memory.collect_cycles()
    assert frozen_cycle() is None
    assert gc.get_freeze_count() > 0


def test_reclaim_soon_frees_it_on_its_own_thread(frozen_cycle):
    from sp_checks import wait_for

    memory.reclaim_soon(0.05)
    memory.reclaim_soon(0.05)  # shares the first one's run
    assert wait_for(lambda: frozen_cycle() is None, 10)


def test_malloc_thresholds_are_pinned_unless_the_operator_set_the_allocator(monkeypatch):
    """glibc's thresholds are fixed once per process; an operator's MALLOC_* / GLIBC_TUNABLES
    setting wins (nothing is changed then)."""
    import ctypes.util

    from processor import memory

    for name in memory._OWN_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=131072")
    memory.pin_malloc_thresholds.cache_clear()
    assert memory.pin_malloc_thresholds() is False
    monkeypatch.delenv("GLIBC_TUNABLES")
    memory.pin_malloc_thresholds.cache_clear()
    glibc = "libc.so" in (ctypes.util.find_library("c") or "libc.so.6")
    assert memory.pin_malloc_thresholds() is glibc
