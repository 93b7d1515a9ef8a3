"""ModelStore: listing, reading and fetching model artefacts where they live.

The processor needs a few file-system questions answered (does it exist, what is in a
directory, when was it modified) and, for engines that read local files only, a local copy of
one version. :class:`ModelStore` asks through fsspec, so a local path and an object-store URL
(``s3://...``; ``oss://...`` is S3-compatible and goes through the same client) share one code
path. Paths handed around inside the processor are the store's own (protocol stripped);
:meth:`ModelStore.url` gives them back their scheme, without credentials, for reports.

Thread-safe: fsspec file systems may be shared between threads; :meth:`materialize` serializes
its downloads.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import tempfile
import threading
from dataclasses import replace
from typing import TYPE_CHECKING

import fsspec

from ..errors import ConfigError, Unavailable

if TYPE_CHECKING:
    from ..config import ModelConfig
    from .model_version import ModelVersion

CACHE_ROOT = os.path.join(tempfile.gettempdir(), "serving-processor-cache")


class ModelStore:
    """File-system view of model artefacts. See the module doc."""

    def __init__(self, fs: fsspec.AbstractFileSystem | None = None, scheme: str = "",
                 location: str = "") -> None:
        self.fs = fs or fsspec.filesystem("file")
        self.scheme = scheme
        # Copies from different endpoints never share a cache directory.
        self._cache = os.path.join(CACHE_ROOT, hashlib.sha1(f"{scheme}|{location}".encode()).hexdigest()[:12])
        self._fetch_lock = threading.Lock()

    @classmethod
    def for_config(cls, config: ModelConfig) -> ModelStore:
        """The store ``model_store_type`` names; ConfigError if it cannot be built."""
        kind = config.model_store_type
        if kind == "local":
            return cls()
        options = {}
        if config.oss_access_id:
            options.update(key=config.oss_access_id, secret=config.oss_access_key)
        if config.oss_endpoint:
            endpoint = config.oss_endpoint
            if "://" not in endpoint:
                endpoint = f"https://{endpoint}"
            options["client_kwargs"] = {"endpoint_url": endpoint}
        try:
            return cls(fsspec.filesystem("s3", **options), scheme=kind, location=config.oss_endpoint or "")
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"model_store_type: cannot open the {kind!r} store: {exc}") from None

    @property
    def is_local(self) -> bool:
        return not self.scheme

    def strip(self, path: str) -> str:
        """A config path (maybe a URL) as this store's own path."""
        if self.scheme and path.startswith(f"{self.scheme}://"):
            return path[len(self.scheme) + 3:]
        return self.fs._strip_protocol(path)  # noqa: SLF001 (fsspec's documented normalizer)

    def url(self, path: str) -> str:
        """A store path as the user wrote it (scheme, no credentials); local paths unchanged."""
        return f"{self.scheme}://{path}" if self.scheme and path else path

    def exists(self, path: str) -> bool:
        return self.fs.exists(path)

    def list_dirs(self, path: str) -> list[str]:
        return [e["name"] for e in self._ls(path) if e["type"] == "directory"]

    def list_files(self, path: str) -> list[str]:
        """Base names of the files directly inside ``path``."""
        return [posixpath.basename(e["name"]) for e in self._ls(path) if e["type"] != "directory"]

    def size(self, path: str) -> int:
        """The size of file ``path`` in bytes; FileNotFoundError if there is none."""
        return int(self.fs.size(path))

    def mtime(self, path: str) -> float:
        info = self.fs.info(path)
        value = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
        return value.timestamp() if hasattr(value, "timestamp") else float(value)

    def _ls(self, path: str) -> list[dict]:
        try:
            return self.fs.ls(path, detail=True, refresh=True) if self.scheme else self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return []

    # --- local copies -----------------------------------------------------------------------

    def materialize(self, version: ModelVersion) -> ModelVersion:
        """``version`` with every path local: the same object for a local store, else a cached copy.

        The SavedModel directory is fetched once; each checkpoint's files once. Raises
        Unavailable if a download fails (the caller keeps serving what it has).
        """
        if self.is_local:
            return version
        with self._fetch_lock:
            try:
                return replace(version,
                               savedmodel_dir=self._fetch_dir(version.savedmodel_dir),
                               full_prefix=self._fetch_prefix(version.full_prefix),
                               delta_prefix=self._fetch_prefix(version.delta_prefix),
                               delta_chain=tuple((s, self._fetch_prefix(p)) for s, p in version.delta_chain),
                               run_dir=self._local(version.run_dir) if version.run_dir else "")
            except OSError as exc:
                raise Unavailable(f"cannot fetch version {version.label} from the "
                                  f"{self.scheme} store: {exc}") from None

    def _local(self, path: str) -> str:
        return os.path.join(self._cache, path.lstrip("/"))

    def _fetch_dir(self, path: str) -> str:
        local = self._local(path)
        for remote, info in self.fs.find(path, detail=True).items():
            self._get(remote, info["size"], os.path.join(local, posixpath.relpath(remote, path)))
        return local

    def _fetch_prefix(self, prefix: str) -> str:
        if not prefix:
            return ""
        directory, base = posixpath.split(prefix)
        for entry in self._ls(directory):
            name = posixpath.basename(entry["name"])
            if entry["type"] != "directory" and name.startswith(base + "."):
                self._get(entry["name"], entry["size"], os.path.join(self._local(directory), name))
        return self._local(prefix)

    def _get(self, remote: str, size: int, local: str) -> None:
        if os.path.exists(local) and os.path.getsize(local) == size:
            return  # checkpoint files are immutable once published; a size change means a new file
        os.makedirs(os.path.dirname(local), exist_ok=True)
        tmp = f"{local}.part"
        self.fs.get_file(remote, tmp)
        os.replace(tmp, local)  # a half-downloaded file never looks complete
