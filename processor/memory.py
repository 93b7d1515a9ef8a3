"""Memory figures: what a served version holds, what loading one will cost, what the process may
hold, and giving freed memory back.

* :data:`PARTS` and :func:`memory_parts`: the parts a served version's bytes are counted in
  (:meth:`processor.engine.session_group.SessionGroup.memory`);
* :func:`estimate_load_bytes`: a version's parameter bytes on disk, read from its files' sizes
  before any of them is read (the fit check multiplies it by a learned factor:
  :mod:`processor.memory_budget`);
* :func:`memory_limit`: the ``memory_limit`` setting as bytes (the cgroup's ``memory.max``, else
  the machine's memory);
* :func:`process_rss_bytes`, :func:`collect_cycles`, :func:`trim` and :func:`reclaim_soon`:
  this process's resident set, and what an unload does to give the version's memory back (its
  reference cycles collected, frozen ones too; glibc's ``malloc_trim``);
* :func:`pin_malloc_thresholds`: glibc's mmap and trim thresholds fixed, so that what a load's
  threads free is given back at all.

Linux files are read through the module-level paths below (tests point them elsewhere). Functions
only; thread-safe.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import posixpath
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import ModelConfig
    from .store.model_store import ModelStore
    from .store.model_version import ModelVersion

# The parts a version's memory is counted in (see SessionGroup.memory for what each holds).
PARTS = ("weights", "tables", "caches", "shared", "device")

CGROUP_ROOT = "/sys/fs/cgroup"  # v2's unified mount; v1's memory controller at <root>/memory
PROC_CGROUP = "/proc/self/cgroup"
MEMINFO = "/proc/meminfo"
STATM = "/proc/self/statm"

DEFAULT_SHARE = 0.9  # of the memory there is, when memory_limit is not set
# cgroup v1 writes "no limit" as the largest page-aligned int64 (9223372036854771712); v2 writes
# "max". Anything this large bounds nothing real.
_NO_LIMIT = 1 << 60


def memory_parts(*counts: Mapping[str, int]) -> dict[str, int]:
    """Every part of :data:`PARTS`, in that order, each the sum of its counts in ``counts`` (0
    where none has it). ValueError for a part not in :data:`PARTS` (a count never vanishes
    under a misspelt name)."""
    out = dict.fromkeys(PARTS, 0)
    for count in counts:
        for part, value in count.items():
            if part not in out:
                raise ValueError(f"unknown memory part {part!r}; the parts are {PARTS}")
            out[part] += int(value)
    return out


# --- what a load costs -----------------------------------------------------------------------


def estimate_load_bytes(store: ModelStore, version: ModelVersion, config: ModelConfig) -> int:
    """The bytes of ``version``'s parameters on disk, from the sizes of its files in ``store``:
    the ``.onnx`` model when ONNX Runtime serves it from one (``model.onnx`` preferred, as the
    engine picks it; not with ``backend: tensorflow``) with the external data files it names
    (:func:`_onnx_bytes`: the only file read, and only a small one); else, with a
    ``checkpoint_dir`` (``version.full_prefix``), the full checkpoint's ``.data-*`` shards plus
    those of every delta it applies (``delta_chain``); else the SavedModel's
    ``variables/variables.data-*`` shards. Index files, graphs and small constants are left out.
    No factor is applied: what an engine makes of these bytes is learned by the caller.
    Raises what the store raises (OSError, FileNotFoundError) for files it cannot size."""
    if config.backend != "tensorflow":
        models = [f for f in store.list_files(version.savedmodel_dir) if f.endswith(".onnx")]
        if models:
            name = "model.onnx" if "model.onnx" in models else sorted(models)[0]
            return _onnx_bytes(store, version.savedmodel_dir, name)
    if version.full_prefix:
        deltas = [p for _, p in version.delta_chain] or ([version.delta_prefix] if version.delta_prefix else [])
        prefixes = [version.full_prefix, *deltas]
    else:
        prefixes = [posixpath.join(version.savedmodel_dir, "variables", "variables")]
    return sum(_shard_bytes(store, prefix) for prefix in prefixes)


# A .onnx file at most this large is read for the external data files it names (a model over
# 2 GiB must keep its weights outside: protobuf's limit); a larger one holds its weights inside.
ONNX_READ_MAX = 64 << 20


def _onnx_bytes(store: ModelStore, directory: str, name: str) -> int:
    """The ``.onnx`` file's bytes plus those of the external data files its initializers name
    (each file once, whole; relative to the model's directory, as ONNX resolves them)."""
    path = posixpath.join(directory, name)
    size = store.size(path)
    if size > ONNX_READ_MAX:
        return size
    import onnx

    from google.protobuf.message import DecodeError

    with store.fs.open(path, "rb") as f:
        data = f.read()
    try:
        model = onnx.ModelProto.FromString(data)
    except DecodeError:  # not a model: its load will say so; its bytes are the estimate
        return size
    files = {entry.value for tensor in model.graph.initializer
             if tensor.data_location == onnx.TensorProto.EXTERNAL
             for entry in tensor.external_data if entry.key == "location"}
    return size + sum(store.size(posixpath.join(directory, f)) for f in sorted(files))


def _shard_bytes(store: ModelStore, prefix: str) -> int:
    directory, base = posixpath.split(prefix)
    return sum(store.size(posixpath.join(directory, name))
               for name in store.list_files(directory) if name.startswith(base + ".data-"))


# --- what the process may hold ---------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _cgroup_limit() -> int | None:
    """The tightest memory limit of this process's cgroup and of every cgroup above it, in bytes
    (v2 ``memory.max``, else v1 ``memory.limit_in_bytes``), or None: no cgroup file, ``max``,
    values that are not numbers or too large to bound anything.

    The process's cgroup comes from ``/proc/self/cgroup`` (``0::/path`` for v2, ``N:memory:/path``
    for v1) and is looked up under the mount, then each parent up to the mount's root: a limit
    set on a parent (a pod's, a systemd slice's) bounds its children too, and in a container
    whose mount is its own cgroup the path names the host's hierarchy, which only the root
    matches. Without ``/proc/self/cgroup``: the mount's root alone."""
    paths = _own_cgroups()
    for root, name, path in ((CGROUP_ROOT, "memory.max", paths.get("v2")),
                             (posixpath.join(CGROUP_ROOT, "memory"), "memory.limit_in_bytes", paths.get("v1"))):
        if path is None:
            continue
        parts = [p for p in path.split("/") if p and p not in (".", "..")]
        found, limits = False, []
        for depth in range(len(parts), -1, -1):  # the process's own cgroup first, the root last
            text = _read(posixpath.join(root, *parts[:depth], name))
            if text is None:
                continue
            found = True
            try:
                value = int(text.strip())
            except ValueError:  # "max": no limit here
                continue
            if 0 < value < _NO_LIMIT:
                limits.append(value)
        if found:
            return min(limits) if limits else None
    return None


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup paths: ``v2`` (the unified hierarchy) and ``v1`` (the memory
    controller's), from ``/proc/self/cgroup``; both ``/`` where it cannot be read."""
    text = _read(PROC_CGROUP)
    if text is None:
        return {"v2": "/", "v1": "/"}
    out: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            out["v2"] = path or "/"
        elif "memory" in controllers.split(","):
            out["v1"] = path or "/"
    return out


def _machine_memory() -> int | None:
    """MemTotal of /proc/meminfo in bytes, or None where it cannot be read."""
    text = _read(MEMINFO) or ""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            fields = line.split()
            try:
                return int(fields[1]) * (1024 if fields[2:3] == ["kB"] else 1)
            except (IndexError, ValueError):
                return None
    return None


def memory_limit(setting: float | int | None) -> int | None:
    """The ``memory_limit`` setting as bytes, or None: no limit (the fit check is off).

    The memory there is: the cgroup's limit (v2 ``memory.max``, else v1
    ``memory.limit_in_bytes``; ``max`` or an absurd value such as v1's "no limit" means none),
    capped by the machine's ``MemTotal`` (a cgroup limit above it bounds nothing); the machine's
    alone without a cgroup limit. Then, by ``setting``:

    * None: :data:`DEFAULT_SHARE` (0.9) of the memory there is;
    * 0: None (the check turned off);
    * a number in (0, 1] (``1`` included): that share of the memory there is;
    * a number above 1: that many bytes (a float such as ``2e9`` too), whatever the machine has.

    None also when a share is asked for and neither file can be read (nothing to take a share
    of). ValueError for a negative setting or a bool.
    """
    if isinstance(setting, bool) or (setting is not None and setting < 0):
        raise ValueError(f"memory_limit must be None, 0, a share in (0, 1] or bytes > 1; got {setting!r}")
    if setting == 0:
        return None
    if setting is not None and setting > 1:
        return int(setting)
    share = DEFAULT_SHARE if setting is None else float(setting)
    sizes = [size for size in (_cgroup_limit(), _machine_memory()) if size is not None]
    return int(share * min(sizes)) if sizes else None


def process_rss_bytes() -> int:
    """This process's resident set size in bytes now (``/proc/self/statm``); 0 where it cannot
    be read (not Linux)."""
    text = _read(STATM)
    try:
        return int(text.split()[1]) * os.sysconf("SC_PAGE_SIZE") if text else 0
    except (IndexError, ValueError, OSError):
        return 0


def _libc_function(name: str, argtypes: list, restype=ctypes.c_int):
    """glibc's function ``name`` typed as given, or None (another C library, or none to load)."""
    try:
        function = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = argtypes, restype
    return function


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None."""
    return _libc_function("malloc_trim", [ctypes.c_size_t])


# glibc raises its mmap threshold to the size of each mmapped block freed (up to 32 MiB) and its
# trim threshold to twice that, and malloc_trim never trims a thread arena's top: after a load,
# whose reader and writer threads allocate and free multi-MiB buffers, up to that much per thread
# arena stays resident for good. Measured with a Redis-store load (bench_model_memory): 11-13 MiB
# kept after the unload, counted / RSS growth 0.74; pinned at 1 MiB, 0.9 MiB kept and 0.92, with
# process() at batch 256 unchanged within noise (2 MiB / 4 MiB still kept 2.2 MiB, 0.83).
MALLOC_THRESHOLD_BYTES = 1 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_OWN_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


@functools.cache
def pin_malloc_thresholds() -> bool:
    """Fix glibc's mmap and trim thresholds at :data:`MALLOC_THRESHOLD_BYTES` (see above), once
    per process; True when they were. Left alone (False) where the operator set the allocator
    through its environment variables, or the C library is not glibc. Thread-safe."""
    if any(os.environ.get(name) for name in _OWN_SETTINGS):
        return False
    mallopt = _libc_function("mallopt", [ctypes.c_int, ctypes.c_int])
    return mallopt is not None and all(mallopt(option, MALLOC_THRESHOLD_BYTES) == 1 for option in (_M_MMAP_THRESHOLD, _M_TRIM_THRESHOLD))


def collect_cycles() -> None:
    """Collect unreachable reference cycles, those among frozen objects too, as after an unload.

    The server freezes the objects that exist after each load (``server.runtime.tune_gc``:
    ``gc.freeze``), and the collector never looks at frozen objects: whatever of a closed version
    sat in a cycle (sessions, graphs, the buffers they hold) stayed resident for good. Measured
    with a server that removed a model counted at 95.7 MiB: its RSS fell by nothing until its
    objects were thawed and collected, then by 95.7 MiB. So: thaw, collect, freeze again (what
    survives is frozen as before). A full collection holds the GIL (about 0.2 s over the
    ~290,000 objects of TensorFlow and the demo model on 2 busy cores): once per unload, on
    :func:`reclaim_soon`'s thread. Thread-safe (the gc module is).
    """
    frozen = gc.get_freeze_count() > 0
    if frozen:
        gc.unfreeze()
    gc.collect()
    if frozen:
        gc.freeze()


_reclaim_lock = threading.Lock()
_reclaim_timer: threading.Timer | None = None


def reclaim_soon(delay: float = 0.5) -> None:
    """:func:`collect_cycles` then :func:`trim`, on a thread of their own ``delay`` seconds from
    now; calls within that time share one run. For a closed version: its last references go
    only as the frames of whoever closed it return (a removed model's, its caller's), and a
    collection run inside the close would find it still reachable."""
    global _reclaim_timer
    with _reclaim_lock:
        if _reclaim_timer is not None:
            return
        timer = threading.Timer(delay, _reclaim)
        timer.name, timer.daemon = "sp-memory-reclaim", True
        _reclaim_timer = timer
    timer.start()


def _reclaim() -> None:
    global _reclaim_timer
    with _reclaim_lock:
        _reclaim_timer = None
    collect_cycles()
    trim()


def trim() -> bool:
    """Give the heap memory freed so far back to the OS (glibc ``malloc_trim(0)``), as after an
    unload: without it glibc keeps freed arenas resident. True when some memory was given back;
    False when none was, or where ``malloc_trim`` does not exist (then it does nothing). May
    take milliseconds on a large heap; call it off the request path. Thread-safe."""
    function = _malloc_trim()
    return bool(function(0)) if function is not None else False
