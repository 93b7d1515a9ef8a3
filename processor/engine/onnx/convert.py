"""Prepare a model for ONNX Runtime: convert (or import) once, check, cache.

Two sources, one result. A TensorFlow SavedModel is converted with tf2onnx and checked against
TensorFlow (:mod:`processor.engine.onnx.from_tensorflow`: TF2 SavedModels through tf2onnx's TF2 path, so
resource variables and ``tf.lookup.StaticHashTable`` convert as ``tf2onnx.convert --saved-model``
converts them); a ``.onnx`` file in ``savedmodel_dir`` is taken as it is, imported in a child
process (:mod:`processor.engine.onnx.import_child`: a big model's parse holds the GIL for
seconds). Either way the result is a cache entry (a directory)::

    <cache>/<key>/model.onnx       the graph; parameters stored as external data in weights.bin
    <cache>/<key>/weights.bin      every parameter, 64-byte aligned
    <cache>/<key>/manifest.json    signature, parameters (offset, dtype, shape, TF variable), check

The key hashes the source (``saved_model.pb`` bytes, the checkpoint prefix and the size and
mtime of its files; or the ``.onnx`` file's path, size, mtime and inode), the tf2onnx / onnx
versions, the opset and :data:`CONVERTER_REVISION`. Entries are written aside and renamed into place, so a reader never
sees half of one and two processes converting the same model both end with a valid entry.
The cache root is ``$SP_ONNX_CACHE_DIR``, default ``~/.cache/serving-processor/onnx``.
Parameters are written and read back by :mod:`processor.engine.onnx.weights`, signatures by
:mod:`processor.engine.onnx.signature`.

Converted graphs are checked against TensorFlow on synthetic inputs before they are cached
(:mod:`processor.engine.onnx.check`): a mismatch beyond ``|ort - tf| <= ATOL + RTOL * |tf|``
fails the load with a message naming the output and the error. String inputs that only feed
``tf.strings.to_hash_bucket_fast`` become ``uint64`` inputs carrying TensorFlow's 64-bit string
fingerprint, computed by the backend (:mod:`processor.engine.string_hash`; the graph rewrite is
in :mod:`processor.engine.onnx.hash_rewrite`).

Thread-safe: functions only; the cache is safe for concurrent processes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import Internal
from ...shared_segments import flocked
from ...signature import Signature
from ...store.model_version import ModelVersion
from .import_child import import_model
from .signature import signature_from_manifest
from .from_tensorflow import OPSET, convert_savedmodel

CONVERTER_REVISION = 3


def cache_root() -> Path:
    return Path(os.environ.get("SP_ONNX_CACHE_DIR") or Path.home() / ".cache" / "serving-processor" / "onnx")


def find_onnx_file(savedmodel_dir: str) -> str | None:
    """The ``.onnx`` model in ``savedmodel_dir`` (``model.onnx`` preferred), or None."""
    directory = Path(savedmodel_dir)
    if not directory.is_dir():
        return None
    if (directory / "model.onnx").is_file():
        return str(directory / "model.onnx")
    found = sorted(p for p in directory.glob("*.onnx") if p.is_file())
    return str(found[0]) if found else None


@dataclass(frozen=True)
class PreparedModel:
    """A cache entry: where the graph is, the signature, and the parameter layout."""

    directory: Path
    manifest: dict[str, Any]
    cache_hit: bool

    @property
    def model_path(self) -> str:
        return str(self.directory / "model.onnx")

    @property
    def signature(self) -> Signature:
        return signature_from_manifest(self.manifest["signature"])

    @property
    def hashed_inputs(self) -> tuple[str, ...]:
        """Aliases of string inputs the backend must turn into uint64 fingerprints."""
        return tuple(self.manifest.get("hashed_inputs", ()))


def prepare(savedmodel_dir: str, version: ModelVersion, signature_name: str) -> PreparedModel:
    """Return the cache entry for ``version``, converting or importing it first if needed.

    Raises ProcessorError: NotFound (signature), ConfigError (a graph tf2onnx or ONNX Runtime
    cannot handle; the message names the reason and ``backend: tensorflow``), Internal
    (unreadable model, mismatch against TensorFlow).
    """
    onnx_file = find_onnx_file(savedmodel_dir)
    key = _cache_key(savedmodel_dir, version, signature_name, onnx_file)
    final = cache_root() / key
    manifest_path = final / "manifest.json"
    if manifest_path.is_file():
        return PreparedModel(final, json.loads(manifest_path.read_text()), cache_hit=True)
    cache_root().mkdir(parents=True, exist_ok=True)
    # one converter per entry: the workers of a server (or several servers) loading the same
    # version wait for the first one and then read its entry
    with flocked(cache_root() / f".{key}.lock", fcntl.LOCK_EX):
        if manifest_path.is_file():
            return PreparedModel(final, json.loads(manifest_path.read_text()), cache_hit=True)
        return _convert(savedmodel_dir, version, signature_name, onnx_file, key, final)


def _convert(savedmodel_dir: str, version: ModelVersion, signature_name: str, onnx_file: str | None,
             key: str, final: Path) -> PreparedModel:
    manifest_path = final / "manifest.json"
    work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache_root()))
    try:
        if onnx_file:
            manifest = import_model(onnx_file, work)  # a big one off this process's GIL
        else:
            manifest = convert_savedmodel(savedmodel_dir, version, signature_name, work)
        manifest["key"] = key
        (work / "manifest.json").write_text(json.dumps(manifest, indent=1))
        try:
            os.rename(work, final)
        except OSError:  # another process finished the same entry first
            if not manifest_path.is_file():
                raise
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return PreparedModel(final, json.loads(manifest_path.read_text()), cache_hit=False)


# --- cache key --------------------------------------------------------------------------------

def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _stat_list(prefix: str) -> list[tuple[str, int, int]]:
    directory, base = os.path.split(prefix)
    out = []
    for name in sorted(os.listdir(directory or ".")):
        if name.startswith(base + ".") or name == base:
            st = os.stat(os.path.join(directory, name))
            out.append((name, st.st_size, st.st_mtime_ns))
    return out


def _cache_key(savedmodel_dir: str, version: ModelVersion, signature_name: str, onnx_file: str | None) -> str:
    import onnx

    parts: dict[str, Any] = {"revision": CONVERTER_REVISION, "onnx": onnx.__version__, "opset": OPSET}
    if onnx_file:
        # the file's identity, not a digest of its bytes: an .onnx model holds its weights, and
        # hashing 1 GB took 0.6 s of a core on every load (half the load's CPU) beside serving;
        # a file written again gets a new mtime_ns (or inode), as the variables' stat list below
        st = os.stat(onnx_file)
        parts.update(kind="onnx", file=[os.path.abspath(onnx_file), st.st_size, st.st_mtime_ns, st.st_ino])
    else:
        from importlib.metadata import version as installed_version  # importing tf2onnx imports TF

        pb = os.path.join(savedmodel_dir, "saved_model.pb")
        if not os.path.isfile(pb):
            raise Internal(f"savedmodel_dir {savedmodel_dir!r} holds neither saved_model.pb nor a .onnx model")
        prefix = version.full_prefix or os.path.join(savedmodel_dir, "variables", "variables")
        parts.update(kind="savedmodel", pb=_file_digest(pb), prefix=os.path.abspath(prefix),
                     files=_stat_list(prefix), signature=signature_name, tf2onnx=installed_version("tf2onnx"))
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]
