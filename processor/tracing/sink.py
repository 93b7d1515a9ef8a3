"""Where trace files go: a local directory, or any fsspec URL (``s3://``, ``gs://``, ``memory://``).

:func:`open_sink` creates the directory and proves it writable (writes and removes a probe
file) so a bad ``timeline_path`` fails ``initialize`` with a ConfigError naming the key, instead
of failing silently at the first trace. ``write`` may raise anything; the tracer catches,
counts and logs it. Sinks are used from one writer thread.
"""

from __future__ import annotations

import os
import posixpath
import uuid

from ..errors import ConfigError
from ..redaction import redact_url


class LocalSink:
    """Files in a local directory, each written aside and renamed into place."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.display = path

    def check(self) -> None:
        os.makedirs(self.path, exist_ok=True)
        probe = os.path.join(self.path, f".timeline-probe-{uuid.uuid4().hex}")
        with open(probe, "wb") as f:
            f.write(b"")
        os.unlink(probe)

    def write(self, name: str, data: bytes) -> str:
        target = os.path.join(self.path, name)
        tmp = os.path.join(self.path, f".{name}.tmp-{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
        return target


class FsspecSink:
    """Objects under a URL, through fsspec (one ``pipe_file`` per trace)."""

    def __init__(self, url: str, **storage_options) -> None:
        import fsspec

        self.display = redact_url(url)
        self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        self.root = root.rstrip("/")
        self._protocol = url.split("://", 1)[0]

    def check(self) -> None:
        self.fs.makedirs(self.root, exist_ok=True)
        probe = posixpath.join(self.root, f".timeline-probe-{uuid.uuid4().hex}")
        self.fs.pipe_file(probe, b"")
        self.fs.rm_file(probe)

    def write(self, name: str, data: bytes) -> str:
        target = posixpath.join(self.root, name)
        self.fs.pipe_file(target, data)
        return f"{self._protocol}://{target}" if "://" not in target else target


def open_sink(path: str, **storage_options) -> LocalSink | FsspecSink:
    """A checked sink for ``timeline_path``; ConfigError naming the key if it is not usable."""
    try:
        if "://" in path and not path.startswith("file://"):
            sink: LocalSink | FsspecSink = FsspecSink(path, **storage_options)
        else:
            sink = LocalSink(path[len("file://"):] if path.startswith("file://") else path)
        sink.check()
    except ConfigError:
        raise
    except ImportError as exc:
        raise ConfigError(f"timeline_path: no file system for {_shown(path)!r}: {exc}") from None
    except Exception as exc:  # OSError, ValueError (unknown protocol), store-specific errors
        raise ConfigError(f"timeline_path: cannot write trace files to {_shown(path)!r}: "
                          f"{type(exc).__name__}: {exc}") from None
    return sink


def _shown(path: str) -> str:
    return redact_url(path)
