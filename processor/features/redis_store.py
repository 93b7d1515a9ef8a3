"""RedisStore: embedding tables in one Redis or a Redis Cluster, shared by many processor replicas.

Key layout: :mod:`.key_layout`. Connections and routing: :mod:`.redis_client`.

**Loading a version** (:meth:`RedisStore.open_version`, on the model's update thread): if the
version is ready in Redis (meta ``v:<ver>`` = ready and every partition's sentinel present), the
replica just serves it. Otherwise it tries the version's lock (``SET NX EX lock_timeout``): the
holder deletes versions other than the active and this one, deletes any partial data of this
one, writes every row (``HSET`` per partition, pipelined per node, ``update_thread_num``
writer threads, progress logged with rows/s and ETA), writes the sentinels and the meta, and
releases the lock by compare-and-delete (extending it by compare-and-expire while it works).
The others poll until the version is ready (or the lock expires and one of them takes over).

**Deltas** (:meth:`RedisVersionTables.stage_delta`): the same protocol, per (version, step):
one replica deletes the ids the delta removes (``HDEL``, pipelined per node) and writes the
changed rows into the served version's partitions; ``d:<ver>`` records the step; the others see
``d:<ver>`` >= step and skip. Rows change in place, row by row (no update gate spans processes).

**Lookups** (:meth:`.redis_tables.RedisVersionTables.lookup`): ids are de-duplicated per table,
grouped by partition, and fetched with one ``HMGET <partition> <sentinel> <fields...>`` per partition;
replies are turned into arrays without a Python object per row beyond the reply's own.

**Outage**: a refused or broken connection or a reply later than the socket timeout marks the
store down; from then on lookups fail at once with :class:`~processor.errors.Unavailable` (503)
and a message, without touching the network. A probe thread pings the nodes; when they answer
it checks every open version and, if Redis came back empty (or a partition lost its data: a
missing sentinel), refills it from the checkpoint under the lock, then lets requests through.
Nothing of the process's own state is lost meanwhile. A store that cannot be reached at start
(:meth:`RedisStore.from_config` checks every node within ``redis_connect_timeout_seconds`` in all)
starts down: ``initialize`` fails within that time, before the model loads, or waits for it up to
``init_timeout_minutes`` (:meth:`~processor.manager.model_manager.ModelManager.start`).

**Hot-row cache** (:mod:`.row_cache`, ``redis_cache_bytes``, on by default): lookups take the
cached rows and ask Redis only for the others. Since a lookup answered from the cache touches
no network, a heartbeat thread checks the newest version's sentinels every ``probe_seconds``
while the store is up: an outage (or a Redis that came back empty) is found as it is without a
cache, and requests fail fast (503) until the store is back, as they do without one.

**Deltas and the served version**: the replica that writes a delta into Redis first reads the
rows it changes and serves those (:meth:`RedisVersionTables.pin`) until it applies the delta
behind the update gate, so each of its responses is of one version, the old or the new. Another
replica sees the rows change in Redis as they are written (its cache keeps the old ones) until
it applies the delta: then the cached rows of the delta take its values, from the delta file.

Thread-safe.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..errors import Internal, Unavailable
from .ev_checkpoint import TableSource, delta_rows
from .rows import Narrowing, RowChunk, TableSpec, to_storage
from .key_layout import DEFAULT_PARTITIONS, SENTINEL, KeyLayout, key_slot
from .progress import LoadProgress
from .redis_client import RedisNodes, StoreDown
from .redis_url import parse_redis_url
from .redis_tables import RedisVersionTables
from .store_metrics import StoreMetrics

log = logging.getLogger("processor.features")

_UNLOCK = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
_EXTEND = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
           "return redis.call('expire', KEYS[1], ARGV[2]) else return 0 end")
_WRITE_ROWS = 2048  # rows per HSET command


class RedisStore:
    """See the module doc."""

    def __init__(self, kind: str, nodes: RedisNodes, namespace: str, lock_timeout: int,
                 write_threads: int, partitions: int = DEFAULT_PARTITIONS, poll_seconds: float = 0.2,
                 probe_seconds: float = 0.25, cache_bytes: int = 0, dtype: str = "float32") -> None:
        self.kind = kind
        self.cache_bytes = int(cache_bytes)  # redis_cache_bytes: each version's hot-row cache
        self.dtype = dtype  # embedding_dtype
        self.metrics = StoreMetrics(kind)
        self._last: weakref.ref[RedisVersionTables] | None = None  # the newest version opened
        self.nodes = nodes
        self.layout = KeyLayout(namespace, partitions)
        self.lock_timeout = int(lock_timeout)
        self.write_threads = max(1, int(write_threads))
        self.poll_seconds = poll_seconds
        self.probe_seconds = probe_seconds
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.state = "up"
        self.last_error: str | None = None
        self.down_since: float | None = None
        self.counters = {"outages": 0, "refills": 0, "failed_fast": 0, "rows_written": 0,
                         "rows_deleted": 0, "loads_written": 0, "deltas_written": 0}
        self._open: weakref.WeakSet[RedisVersionTables] = weakref.WeakSet()
        self._state_lock = threading.Lock()
        self._probe: threading.Thread | None = None
        self._closed = threading.Event()
        self._heartbeat: threading.Thread | None = None

    @classmethod
    def from_config(cls, config, model_name: str) -> RedisStore:
        cluster = config.feature_store_type == "cluster_redis"
        addresses = parse_redis_url(config.redis_url or "", cluster=cluster)
        timeout = config.redis_connect_timeout_seconds
        nodes = RedisNodes(addresses, config.redis_password, config.read_thread_num,
                           config.update_thread_num, cluster, connect_timeout=timeout)
        store = cls(config.feature_store_type, nodes, model_name or "default", config.lock_timeout,
                    config.update_thread_num, cache_bytes=config.redis_cache_bytes, dtype=config.embedding_dtype)
        try:
            nodes.check(timeout)  # bounded by the timeout in all, whatever the number of seeds
        except StoreDown as exc:
            # down from the start: check_up fails at once (ModelManager.start calls it before
            # loading the model, so initialize fails within the timeout), the probe watches for it
            store._mark_down(f"not reachable within redis_connect_timeout_seconds ({timeout:g} s): {exc}")
        return store

    # --- health -----------------------------------------------------------------------------

    def check_up(self) -> None:
        if self.state != "up":
            self.counters["failed_fast"] += 1
            since = time.monotonic() - (self.down_since or time.monotonic())
            raise Unavailable(f"feature store {self.kind} ({self.nodes.names()}) is "
                              f"unavailable: {self.state} for {since:.1f} s ({self.last_error}); "
                              f"requests fail until it is back")

    def run(self, commands, write: bool = False) -> list[Any]:
        """Execute commands; a connection problem marks the store down and raises Unavailable."""
        try:
            return self.nodes.execute(commands, write=write)
        except StoreDown as exc:
            self.metrics.count_redis(errors=1)
            self._mark_down(str(exc))
            raise Unavailable(f"feature store {self.kind} is unavailable: {exc}") from None

    def _cmd(self, slot: int, *args) -> Any:
        result = self.run([(slot, args)], write=True)[0]
        if isinstance(result, Exception):
            raise Internal(f"feature store: {args[0]}: {result}")
        return result

    def _mark_down(self, reason: str, state: str = "down") -> None:
        with self._state_lock:
            if self.state == "up":
                self.state = state
                self.down_since = time.monotonic()
                self.counters["outages"] += 1
                log.warning("feature store %s %s: %s; failing requests fast until it is back",
                            self.kind, state, reason)
            self.last_error = reason
            if (self._probe is None or not self._probe.is_alive()) and not self._closed.is_set():
                self._probe = threading.Thread(target=self._probe_loop, name="feature-store-probe", daemon=True)
                self._probe.start()

    def data_lost(self, vt: RedisVersionTables, reason: str) -> None:
        self._mark_down(reason, state="refilling")
        raise Unavailable(f"feature store {self.kind}: {reason}; refilling it from the checkpoint")

    def _probe_loop(self) -> None:
        while not self._closed.wait(self.probe_seconds):
            try:
                self.nodes.ping_all()
                for vt in list(self._open):
                    if not self._ready(vt):
                        with self._state_lock:
                            self.state = "refilling"
                        log.warning("feature store %s: version %s is missing from Redis; refilling it "
                                    "from %s", self.kind, vt.version, vt.source.full_prefix)
                        self._ensure_loaded(vt, refill=True)
                        self.counters["refills"] += 1
                    elif vt.delta_step >= 0 and self._delta_step(vt) < vt.delta_step:
                        self._ensure_delta(vt, vt.source)
            except (StoreDown, Unavailable) as exc:
                self.last_error = str(exc)
                continue
            except Exception as exc:  # keep probing; the next round retries
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("feature store %s: recovery failed", self.kind)
                continue
            with self._state_lock:
                took = time.monotonic() - (self.down_since or time.monotonic())
                self.state, self.down_since = "up", None
            self.metrics.count_redis(reconnects=1)
            log.warning("feature store %s is back after %.1f s", self.kind, took)
            return

    # --- meta and lock ----------------------------------------------------------------------

    def _meta(self, *args) -> Any:
        return self._cmd(self.layout.meta_slot, args[0], self.layout.meta_key, *args[1:])

    def _ready(self, vt: RedisVersionTables) -> bool:
        commands = [(self.layout.meta_slot, ("HGET", self.layout.meta_key, b"v:" + vt.version.encode()))]
        commands += [(int(s), ("HEXISTS", k, SENTINEL)) for k, s in zip(vt.keys, vt.slots)]
        replies = self._checked(self.run(commands, write=True))
        return replies[0] == b"ready" and all(r == 1 for r in replies[1:])

    def _delta_step(self, vt: RedisVersionTables) -> int:
        got = self._meta("HGET", b"d:" + vt.version.encode())
        return int(got) if got is not None else -1

    @staticmethod
    def _checked(replies: list[Any]) -> list[Any]:
        for r in replies:
            if isinstance(r, Exception):
                raise Internal(f"feature store: {type(r).__name__}: {r}")
        return replies

    def _try_lock(self, version: str) -> str | None:
        key = self.layout.lock_key(version)
        token = f"{self.replica}:{uuid.uuid4().hex[:8]}"
        ok = self._cmd(key_slot(key), "SET", key, token, "NX", "EX", self.lock_timeout)
        return token if ok else None

    def _unlock(self, version: str, token: str) -> None:
        key = self.layout.lock_key(version)
        try:
            self._cmd(key_slot(key), "EVAL", _UNLOCK, 1, key, token)
        except Unavailable:
            pass  # the lock expires by itself

    def _extend(self, version: str, token: str) -> None:
        key = self.layout.lock_key(version)
        if not self._cmd(key_slot(key), "EVAL", _EXTEND, 1, key, token, self.lock_timeout):
            raise Internal(f"feature store: lost the writer lock of version {version} (lock_timeout "
                           f"{self.lock_timeout} s too short?)")

    def _wait_or_lock(self, version: str, done) -> str | None:
        """Poll until ``done()`` or this replica takes the lock; the token, or None when done."""
        while not self._closed.is_set():
            if done():
                return None
            token = self._try_lock(version)
            if token is not None:
                if done():
                    self._unlock(version, token)
                    return None
                return token
            time.sleep(self.poll_seconds)
        raise Unavailable("feature store closed")

    # --- versions ---------------------------------------------------------------------------

    def open_version(self, version: str, specs: dict[str, TableSpec], source: TableSource) -> RedisVersionTables:
        self.check_up()
        vt = RedisVersionTables(self, version, specs, source)
        self._ensure_loaded(vt)
        if source.delta_prefix:
            vt.delta_step = source.delta_step
        vt.prefill(self._last() if self._last is not None else None)
        self._open.add(vt)
        self._last = weakref.ref(vt)
        if vt.cache is not None and self._heartbeat is None:
            self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="feature-store-heartbeat",
                                               daemon=True)
            self._heartbeat.start()
        return vt

    def _heartbeat_loop(self) -> None:
        """While up, check the newest version is in Redis (see the module doc: cached lookups
        touch no network, so they would not notice an outage)."""
        while not self._closed.wait(self.probe_seconds):
            vt = self._last() if self._last is not None else None
            if self.state != "up" or vt is None:
                continue
            try:
                if not self._ready(vt):
                    self._mark_down(f"version {vt.version} is missing from Redis", state="refilling")
            except (Unavailable, Internal):
                continue  # run() marked the store down; the probe thread takes over

    def forget(self, vt: RedisVersionTables) -> None:
        self._open.discard(vt)  # the rows stay: other replicas may serve them

    def _ensure_loaded(self, vt: RedisVersionTables, refill: bool = False) -> None:
        token = self._wait_or_lock(vt.version, lambda: self._ready(vt))
        if token is None:
            vt.loaded_by = vt.loaded_by or "another replica"
            self._read_narrowing(vt)
            log.info("feature store %s: version %s is in Redis already; serving it", self.kind, vt.version)
            return
        try:
            if not refill:
                self._drop_old_versions(keep={vt.version})
            self._import(vt, token)
            vt.loaded_by = "this replica"
        finally:
            self._unlock(vt.version, token)

    def _drop_old_versions(self, keep: set[str]) -> None:
        meta = self._meta("HGETALL")
        fields = {k: v for k, v in zip(meta[0::2], meta[1::2])} if isinstance(meta, list) else dict(meta)
        active = fields.get(b"active")
        if active:
            keep = keep | {active.decode()}
        for name in list(fields):
            if not name.startswith(b"v:"):
                continue
            version = name[2:].decode()
            if version in keep:
                continue
            lock = self.layout.lock_key(version)
            if self._cmd(key_slot(lock), "EXISTS", lock):
                continue  # someone is loading it
            keys, slots = self.layout.partition_keys(version)
            self._checked(self.run([(int(s), ("UNLINK", k)) for k, s in zip(keys, slots)], write=True))
            stale = [f for f in fields if f.split(b":")[1:2] == [version.encode()]]
            self._meta("HDEL", *stale)
            log.info("feature store %s: deleted old version %s", self.kind, version)

    def _import(self, vt: RedisVersionTables, token: str) -> None:
        ver = vt.version.encode()
        self._checked(self.run([(int(s), ("UNLINK", k)) for k, s in zip(vt.keys, vt.slots)], write=True))
        self._meta("HDEL", b"v:" + ver, b"d:" + ver)
        vt.progress = LoadProgress(f"feature store {self.kind}, version {vt.version}", vt.source.row_count(vt.specs))
        extended = time.monotonic()
        with ThreadPoolExecutor(self.write_threads, thread_name_prefix="feature-store-writer") as pool:
            pending = []
            for name, chunk in vt.source.rows(vt.specs, chunk_rows=_WRITE_ROWS * 4):
                pending.append(pool.submit(self._write_rows, vt, name, chunk))
                if len(pending) >= 2 * self.write_threads:
                    pending.pop(0).result()
                if time.monotonic() - extended > self.lock_timeout / 3:
                    self._extend(vt.version, token)
                    extended = time.monotonic()
            for f in pending:
                f.result()
        vt.progress.finish()
        self._checked(self.run([(int(s), ("HSET", k, SENTINEL, ver)) for k, s in zip(vt.keys, vt.slots)],
                               write=True))
        step = vt.source.delta_step if vt.source.delta_prefix else -1
        if vt.narrowing:  # what float16 cost, for the replicas that did not load it
            self._meta("HSET", b"h:" + ver, json.dumps({n: x.as_dict() for n, x in vt.narrowing.items()}))
        self._meta("HSET", b"v:" + ver, b"ready", b"d:" + ver, step, b"active", ver)
        self._meta("HINCRBY", b"w:" + ver + b":full", 1)
        self.counters["loads_written"] += 1

    def _write_rows(self, vt: RedisVersionTables, table: str, chunk: RowChunk) -> None:
        if len(chunk) == 0:
            return
        spec = vt.specs[table]
        values = np.asarray(chunk.values, np.float32)
        if values.shape != (len(chunk.keys), spec.dim):
            raise Internal(f"table {table!r}: rows of shape {list(values.shape)}, expected [n, {spec.dim}]")
        narrowing = vt.narrowing.get(table)
        if narrowing is not None:
            with vt._narrowing_lock:  # writer threads
                values = to_storage(spec, values, narrowing)
        tid = vt.tids[table]
        keys = np.asarray(chunk.keys, np.int64)
        parts = self.layout.partition_of(tid, keys)
        order = np.argsort(parts, kind="stable")
        counts = np.bincount(parts, minlength=self.layout.partitions)
        fields = self.layout.packed_fields(np.full(len(keys), tid, np.uint32), keys[order])
        values = values[order]
        commands = []
        pos = 0
        for p in np.flatnonzero(counts).tolist():
            for start in range(pos, pos + int(counts[p]), _WRITE_ROWS):
                stop = min(start + _WRITE_ROWS, pos + int(counts[p]))
                commands.append((int(vt.slots[p]),
                                 self.layout.pack(b"HSET", vt.keys[p], fields[start:stop], values[start:stop])))
            pos += int(counts[p])
        self._checked(self.run(commands, write=True))
        self.counters["rows_written"] += len(keys)
        if vt.progress is not None:
            vt.progress.add(len(keys))

    def _delete_rows(self, vt: RedisVersionTables, table: str, ids: np.ndarray) -> None:
        """``HDEL`` the fields of ``ids`` in ``table``, pipelined per node (absent ones are no-ops)."""
        if not len(ids):
            return
        tid = vt.tids[table]
        ids = np.asarray(ids, np.int64)
        parts = self.layout.partition_of(tid, ids)
        order = np.argsort(parts, kind="stable")
        counts = np.bincount(parts, minlength=self.layout.partitions)
        fields = self.layout.packed_fields(np.full(len(ids), tid, np.uint32), ids[order])
        commands, pos = [], 0
        for p in np.flatnonzero(counts).tolist():
            for start in range(pos, pos + int(counts[p]), _WRITE_ROWS):
                stop = min(start + _WRITE_ROWS, pos + int(counts[p]))
                commands.append((int(vt.slots[p]), self.layout.pack(b"HDEL", vt.keys[p], fields[start:stop])))
            pos += int(counts[p])
        deleted = self._checked(self.run(commands, write=True))
        self.counters["rows_deleted"] += int(sum(deleted))

    def write_delta(self, vt: RedisVersionTables, rows: dict[str, RowChunk], step: int,
                    removed: dict[str, np.ndarray] | None = None) -> None:
        self.check_up()
        self._ensure_delta(vt, vt.source, rows, step, pin=True, removed=removed or {})

    def _ensure_delta(self, vt: RedisVersionTables, source: TableSource,
                      rows: dict[str, RowChunk] | None = None, step: int | None = None, pin: bool = False,
                      removed: dict[str, np.ndarray] | None = None) -> None:
        """Make Redis hold delta ``step`` of ``vt``: its removed ids deleted, then its rows
        written (both read from ``source`` when rows are not given); ``pin``: this replica serves
        ``vt`` and applies the delta next (see RedisVersionTables.pin)."""
        if step is None:
            step = source.delta_step
        if rows is None:
            rows, removed = delta_rows(source.delta_prefix, vt.specs)
        removed = removed or {}
        token = self._wait_or_lock(vt.version, lambda: self._delta_step(vt) >= step)
        if token is None:
            return
        try:
            if pin:
                vt.pin(rows, removed)
            for name, ids in removed.items():  # removals first: an id the delta also writes is held
                self._delete_rows(vt, name, ids)
            for name, chunk in rows.items():
                self._write_rows(vt, name, chunk)
            ver = vt.version.encode()
            self._meta("HSET", b"d:" + ver, step)
            self._meta("HINCRBY", b"w:" + ver + b":" + str(step).encode(), 1)
            self.counters["deltas_written"] += 1
            log.info("feature store %s: wrote delta %d of version %s (%d rows, %d removed)", self.kind, step,
                     vt.version, sum(len(c) for c in rows.values()), sum(len(i) for i in removed.values()))
        finally:
            self._unlock(vt.version, token)

    def _read_narrowing(self, vt: RedisVersionTables) -> None:
        """What float16 cost, as the replica that loaded ``vt`` measured it."""
        if not vt.narrowing:
            return
        got = self._meta("HGET", b"h:" + vt.version.encode())
        for name, measured in (json.loads(got) if got else {}).items():
            if name in vt.narrowing:
                vt.narrowing[name] = Narrowing(measured["rows_converted"], measured["bytes_saved"],
                                               measured["max_abs_diff_from_float32"])

    # --- facts ------------------------------------------------------------------------------

    def writes_of(self, version: str, what: str = "full") -> int:
        """How many times ``version``'s full load (or delta step ``what``) was written, all replicas."""
        got = self._meta("HGET", b"w:" + version.encode() + b":" + what.encode())
        return int(got or 0)

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, **self.nodes.describe(), "namespace": self.layout.namespace,
                "partitions": self.layout.partitions, "layout": "sp1 (see processor/features/key_layout.py)",
                "lock_timeout": self.lock_timeout, "writer_threads": self.write_threads,
                "redis_cache_bytes": self.cache_bytes, "embedding_dtype": self.dtype,
                "state": self.state, "last_error": self.last_error, "replica": self.replica,
                **self.counters}

    def close(self) -> None:
        self._closed.set()
        for thread in (self._probe, self._heartbeat):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=5)
        self.nodes.close()
