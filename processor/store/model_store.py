"""ModelStore: listing and reading model artefacts where they live.

The processor only needs a few file-system questions answered (does it exist, what is in a
directory, when was it modified). :class:`ModelStore` asks them through fsspec, so a local path
and an object-store URL (``s3://...``) go through the same code. Thread-safe: fsspec file systems
may be shared between threads.
"""

from __future__ import annotations

import posixpath

import fsspec


class ModelStore:
    """File-system view of model artefacts under one protocol (``file`` for local paths)."""

    def __init__(self, fs: fsspec.AbstractFileSystem | None = None) -> None:
        self.fs = fs or fsspec.filesystem("file")

    @classmethod
    def for_path(cls, path: str, **storage_options) -> ModelStore:
        fs, _ = fsspec.core.url_to_fs(path, **storage_options)
        return cls(fs)

    @property
    def is_local(self) -> bool:
        return "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))

    def exists(self, path: str) -> bool:
        return self.fs.exists(path)

    def list_dirs(self, path: str) -> list[str]:
        return [e["name"] for e in self._ls(path) if e["type"] == "directory"]

    def list_files(self, path: str) -> list[str]:
        """Base names of the files directly inside ``path``."""
        return [posixpath.basename(e["name"]) for e in self._ls(path) if e["type"] != "directory"]

    def mtime(self, path: str) -> float:
        info = self.fs.info(path)
        value = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
        return value.timestamp() if hasattr(value, "timestamp") else float(value)

    def _ls(self, path: str) -> list[dict]:
        try:
            return self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return []
