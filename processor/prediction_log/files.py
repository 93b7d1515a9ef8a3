"""Where records go: rotating files in a local directory, and the upload of closed files.

:class:`LogFiles` appends records to ``<prefix>-<UTC time>-<pid>-<n><ext>.tmp`` and, when the
file reaches ``max_file_bytes`` or ``max_file_age_seconds`` (or on flush and close), closes it
and renames it to ``<prefix>-<UTC time>-<pid>-<n><ext>``: readers that take ``*.tfrecord`` /
``*.jsonl`` see closed files only. Records are written whole and flushed to the OS at record
boundaries, so a process that dies leaves at most a truncated last record in its ``.tmp`` file;
after a failed write the file is cut back to its last complete record and closed.
:meth:`LogFiles.recover` (the writer's first step) finishes the ``.tmp`` files of processes that
died: each is cut back to its last complete record (TFRecord framing and checksums, or the last
newline of JSON lines) and published like a closed file; files of live processes (workers
sharing the directory) are left alone.

:class:`Uploader` copies a closed file to a URL through fsspec and then removes the local copy;
a failed upload keeps the file and is retried at the next rotation.

Both are used from one thread (the logger's writer); neither is thread-safe.
"""

from __future__ import annotations

import os
import posixpath
import time
import uuid
from collections.abc import Callable

from .formats import whole_tfrecords

_BUFFER = 1 << 20


class LogFiles:
    """Rotating files in ``directory``. See the module doc. ``on_closed(path)`` is called with
    each file once it is closed and renamed into place."""

    def __init__(self, directory: str, prefix: str, extension: str, max_bytes: int, max_age: float,
                 on_closed: Callable[[str], None] | None = None) -> None:
        self.directory = directory
        self.prefix = prefix
        self.extension = extension
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.on_closed = on_closed
        self._file = None
        self._name = ""
        self._opened = 0.0
        self._size = 0  # bytes of complete records written to the current file
        self._sequence = 0
        self.files_closed = 0
        self.files_recovered = 0
        self.bytes_written = 0

    def check(self) -> None:
        """Create the directory and prove it writable (raises OSError)."""
        os.makedirs(self.directory, exist_ok=True)
        probe = os.path.join(self.directory, f".probe-{uuid.uuid4().hex}")
        with open(probe, "wb"):
            pass
        os.unlink(probe)

    @property
    def current(self) -> str | None:
        """The file being written (its temporary name), or None."""
        return self._path(self._name) + ".tmp" if self._file is not None else None

    def write(self, record: bytes) -> None:
        """Append one whole record; rotate by size. On an OSError the file is cut back to its
        last complete record and closed, and the error raised."""
        if self._file is None:
            self._open()
        try:
            self._file.write(record)
        except OSError:
            self._abandon()
            raise
        self._size += len(record)
        self.bytes_written += len(record)
        if self._size >= self.max_bytes:
            self.rotate()

    def flush(self) -> None:
        """Hand what is written to the OS (a crash of the process then loses none of it)."""
        if self._file is not None:
            try:
                self._file.flush()
            except OSError:
                self._abandon()
                raise

    def due_in(self, now: float) -> float | None:
        """Seconds until the current file reaches its age (<= 0: due), None without a file."""
        return None if self._file is None else self._opened + self.max_age - now

    def rotate(self) -> None:
        """Close the current file (if any) and rename it into place."""
        if self._file is None:
            return
        f, self._file = self._file, None
        try:
            f.flush()
            os.fsync(f.fileno())
        finally:
            f.close()
        self._publish()

    def recover(self) -> None:
        """Publish the ``.tmp`` files that dead processes left under this prefix, each cut back
        to its last complete record (an empty one is removed). Raises OSError."""
        suffix = self.extension + ".tmp"
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return
        for name in names:
            if not (name.startswith(self.prefix + "-") and name.endswith(suffix)):
                continue
            try:
                pid = int(name[:-len(suffix)].rsplit("-", 2)[1])
            except (IndexError, ValueError):
                continue  # not one of ours
            if pid == os.getpid() or _alive(pid):
                continue
            tmp = self._path(name)
            complete = _complete_bytes(tmp, self.extension)
            if not complete:
                os.unlink(tmp)
                continue
            os.truncate(tmp, complete)
            final = tmp[:-len(".tmp")]
            os.replace(tmp, final)
            self.files_recovered += 1
            if self.on_closed is not None:
                self.on_closed(final)

    def _open(self) -> None:
        self._sequence += 1
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self._name = f"{self.prefix}-{stamp}-{os.getpid()}-{self._sequence:06d}{self.extension}"
        os.makedirs(self.directory, exist_ok=True)
        self._file = open(self._path(self._name) + ".tmp", "wb", buffering=_BUFFER)  # noqa: SIM115 - kept open
        self._opened = time.monotonic()
        self._size = 0

    def _abandon(self) -> None:
        """After a failed write: keep the complete records, drop the rest, close the file."""
        f, self._file = self._file, None
        tmp = self._path(self._name) + ".tmp"
        for step in (f.close, lambda: os.truncate(tmp, self._size)):
            try:
                step()
            except OSError:
                pass
        if self._size:
            self._publish()
        else:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _publish(self) -> None:
        final = self._path(self._name)
        os.replace(final + ".tmp", final)
        self.files_closed += 1
        if self.on_closed is not None:
            self.on_closed(final)

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _complete_bytes(path: str, extension: str) -> int:
    """How many leading bytes of ``path`` are whole records: TFRecords whose checksums hold, or
    JSON lines up to the last newline."""
    with open(path, "rb") as f:
        data = f.read()
    return whole_tfrecords(data) if extension == ".tfrecord" else data.rfind(b"\n") + 1


class Uploader:
    """Closed files to ``url`` (fsspec). ``fs`` / ``root``: the file system and its path for
    ``url`` (the model store's, so its credentials apply); ``display``: the URL without
    credentials, for reports."""

    def __init__(self, fs, root: str, display: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.display = display
        self.pending: list[str] = []
        self.uploaded = 0

    def check(self) -> None:
        """Create the target and prove it writable (raises what the file system raises)."""
        self.fs.makedirs(self.root, exist_ok=True)
        probe = posixpath.join(self.root, f".probe-{uuid.uuid4().hex}")
        self.fs.pipe_file(probe, b"")
        self.fs.rm_file(probe)

    def upload(self, path: str | None = None) -> None:
        """Queue ``path`` and upload every queued file; the first failure is raised (the file
        and those after it stay queued)."""
        if path is not None:
            self.pending.append(path)
        while self.pending:
            local = self.pending[0]
            self.fs.put_file(local, posixpath.join(self.root, os.path.basename(local)))
            os.unlink(local)
            self.pending.pop(0)
            self.uploaded += 1
