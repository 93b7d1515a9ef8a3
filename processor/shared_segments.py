"""Shared-memory segments: files under ``/dev/shm`` that the worker processes of one server map.

With ``workers > 1`` (server/supervisor.py) the supervisor takes a server id (its pid) and a
:class:`ServerLock`; each worker calls :func:`enable` with that id before its models load. Then
what a model's loader puts into a segment (:meth:`Segment.open`: the ONNX Runtime parameters,
:mod:`processor.engine.onnx.weights`) is written once, by the first loader, and mapped by the
others: one copy in memory, whatever the number of workers.

Naming and cleanup:

- a segment is ``serving-processor-<server id>-<name>``; the supervisor holds an exclusive
  ``flock`` on ``serving-processor-<server id>.lock`` while it lives;
- every process mapping a segment holds a shared ``flock`` on it; the one that releases it last
  (it can take the exclusive lock) unlinks the file: a segment no loaded version uses is gone;
- at stop the supervisor removes every file of its id (:meth:`ServerLock.remove`); a server
  starting removes the files of ids whose lock nobody holds (:func:`clean_stale`: a server
  killed with SIGKILL leaves them).

Creation and release are serialized by the server's ``.create`` lock, so no segment is unlinked
between another process opening it and taking its shared lock. Unlinking a mapped file is safe:
its pages live until the last mapping goes.

Mappings: ``MAP_SHARED`` where the owner writes once for every process, under a cross-process
gate (:mod:`processor.engine.shared_update_gate`: ONNX deltas on the host); ``MAP_PRIVATE``
otherwise (pages nobody writes are the shared ones; a process that writes gets its own copy of
each page it writes). Thread-safe; :func:`enable` once per process, before any segment is opened.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "serving-processor-"
_active: tuple[str, Path] | None = None  # (server id, directory) in a worker process


def default_directory() -> Path:
    """``/dev/shm`` (memory, counted as Shmem) where it exists, else the temporary directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def enable(server_id: str, directory: str | os.PathLike) -> None:
    """Make this process a worker of server ``server_id``: segments go to ``directory``."""
    global _active
    _active = (server_id, Path(directory))


def active() -> tuple[str, Path] | None:
    """(server id, directory) when this process is a worker, else None (segments are off)."""
    return _active


def segment_path(name: str) -> Path:
    """The file of this server's segment ``name`` (a worker only: RuntimeError elsewhere)."""
    if _active is None:
        raise RuntimeError("shared segments are off in this process (not a worker)")
    server_id, directory = _active
    return directory / f"{PREFIX}{server_id}-{name}"


@contextlib.contextmanager
def flocked(path: str | os.PathLike, how: int) -> Iterator[int]:
    """``path`` opened (created if missing) and ``flock``-ed with ``how``; yields the descriptor."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, how)
        yield fd
    finally:
        os.close(fd)


def lock_current(path: str | os.PathLike) -> int:
    """``path`` opened (created if missing) and ``flock``-ed exclusively; returns the descriptor.
    For lock files their last user removes: one removed (or replaced) between the open and the
    lock is opened again, so the lock held is always on the file now at ``path``."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        os.close(fd)


class ServerLock:
    """The supervisor's id and lock (see the module doc); stale servers are cleaned first."""

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_directory()
        self.removed_stale = clean_stale(self.directory)
        self.server_id = str(os.getpid())
        self._path = self.directory / f"{PREFIX}{self.server_id}.lock"
        self._fd = lock_current(self._path)  # another server's clean_stale may unlink it meanwhile

    def remove(self) -> list[str]:
        """Remove every file of this server (segments left by workers included) and the lock."""
        removed = _remove_server(self.directory, self.server_id, keep_lock=True)
        self._path.unlink(missing_ok=True)
        os.close(self._fd)
        return removed


def _server_files(directory: Path) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for path in directory.glob(PREFIX + "*"):
        server_id = path.name[len(PREFIX):].split("-", 1)[0].split(".", 1)[0]
        if server_id.isdigit():
            out.setdefault(server_id, []).append(path)
    return out


def _remove_server(directory: Path, server_id: str, keep_lock: bool = False) -> list[str]:
    lock = f"{PREFIX}{server_id}.lock"
    removed = []
    for path in _server_files(directory).get(server_id, []):
        if keep_lock and path.name == lock:
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path.name)
    return removed


def clean_stale(directory: str | os.PathLike) -> list[str]:
    """Remove the files of every server whose lock nobody holds; returns the names removed."""
    directory = Path(directory)
    removed: list[str] = []
    for server_id, paths in _server_files(directory).items():
        lock = directory / f"{PREFIX}{server_id}.lock"
        if lock in paths:
            try:
                fd = os.open(lock, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a live server
                os.close(fd)
                continue
            try:
                removed += _remove_server(directory, server_id)
            finally:
                os.close(fd)
        else:  # files without a lock: their server is gone (its lock is removed last)
            removed += _remove_server(directory, server_id)
    if removed:
        log.warning("removed %d shared-memory file(s) of stopped servers: %s", len(removed),
                    ", ".join(sorted(removed)[:8]))
    return removed


class Segment:
    """One segment mapped into this process (writable; see the module doc for the two mappings).

    :meth:`open` maps ``name`` of this server, creating it first with ``fill(path)`` (which
    writes ``size`` bytes to ``path``) if no worker has. ``created`` says which happened;
    :attr:`fd` is this process's own descriptor of the file (open until :meth:`release`).
    :meth:`release` once the mapping's users are gone (the arrays over :attr:`buffer` may live
    on: the mapping stays valid until they are collected).
    """

    def __init__(self, path: Path, fd: int, buffer: mmap.mmap, created: bool, shared_writes: bool) -> None:
        self.path = path
        self.shared_writes = shared_writes
        self._fd: int | None = fd
        self.buffer = buffer
        self.created = created
        self.size = len(buffer)

    @classmethod
    def open(cls, name: str, size: int, fill: Callable[[Path], None], shared_writes: bool = False) -> Segment:
        return cls._open(name, size, fill, shared_writes)

    @classmethod
    def open_existing(cls, name: str, shared_writes: bool = False) -> Segment | None:
        """Segment ``name`` mapped (its size as the file's) if a worker of this server created
        it, else None."""
        return cls._open(name, None, None, shared_writes)

    @classmethod
    def _open(cls, name: str, size: int | None, fill: Callable[[Path], None] | None,
              shared_writes: bool) -> Segment | None:
        path = segment_path(name)
        server_id, directory = _active
        with flocked(directory / f"{PREFIX}{server_id}.create", fcntl.LOCK_EX):
            created = not path.exists()
            if created and fill is None:
                return None
            if created:
                tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
                try:
                    fill(tmp)
                    if tmp.stat().st_size != size:
                        raise OSError(f"{tmp}: wrote {tmp.stat().st_size} bytes, expected {size}")
                    os.rename(tmp, path)
                except BaseException:
                    tmp.unlink(missing_ok=True)
                    raise
            fd = os.open(path, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                buffer = mmap.mmap(fd, os.fstat(fd).st_size if size is None else size, flags=mmap.MAP_SHARED if shared_writes else mmap.MAP_PRIVATE,
                                   prot=mmap.PROT_READ | mmap.PROT_WRITE)
            except BaseException:
                os.close(fd)
                raise
        return cls(path, fd, buffer, created, shared_writes)

    @property
    def fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path} is released")
        return self._fd

    def release(self) -> None:
        """Give up this process's use; the last user unlinks the file. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        server_id, directory = _active or (None, self.path.parent)
        try:
            lock = directory / f"{PREFIX}{server_id}.create"
            with flocked(lock, fcntl.LOCK_EX):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # another worker still maps it
                    return
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
        finally:
            os.close(fd)

    def describe(self) -> dict:
        return {"path": str(self.path), "mib": round(self.size / 2**20, 1),
                "created_here": self.created,
                "mapping": ("shared (deltas written once, for every worker)" if self.shared_writes
                            else "private (copy-on-write for deltas)")}
