"""TF Serving's message classes without importing TensorFlow (issue 24: memory per worker).

Importing ``tensorflow_serving.apis.*_pb2`` or ``tensorflow.core.*_pb2`` runs
``tensorflow/__init__.py``: ~230 MiB of private memory in every server process, an ONNX-only one
included. :func:`messages` gives the same messages without it: the serialized
``FileDescriptorProto`` each installed ``*_pb2.py`` embeds (its ``AddSerializedFile(b'...')``)
is read from the file's source with :mod:`ast` and :func:`ast.literal_eval`, never executed, and
added to a private ``DescriptorPool``; ``message_factory.GetMessageClass`` makes the classes.

Contract:

* :func:`messages` builds the pool on its first call, once per process (a lock: concurrent first
  calls build it once), and returns the same :class:`Messages` ever after. It raises
  :class:`ImportError` (``ModuleNotFoundError`` when a package is not installed) where importing
  the pb2 modules would fail, and also when a file is not what protoc writes; a failed build is
  tried again on the next call. Callers keep their "TF Serving API disabled" fallback.
* The files: the package directories come from ``importlib.util.find_spec`` of the top-level
  name (``tensorflow_serving``, ``tensorflow``), which does not run the package's ``__init__``;
  each file's ``dependency`` list is followed to the module its own ``from ... import ..._pb2``
  line names (TensorFlow's ``xla/tsl/protobuf/error_codes.proto`` lives in
  ``tensorflow/compiler/xla/...``), else to ``<path>_pb2.py``. ``google/protobuf/*`` (the
  well-known types) come from ``google.protobuf``'s own modules, imported (they are light).
* The messages keep their real full names (``tensorflow.serving.PredictRequest``, ...), so the
  bytes are TF Serving's and ``Any.Pack`` writes TF Serving's type URLs; the pool is private, so
  they never clash with the real pb2 modules where both are loaded (tests, a process that also
  serves a TensorFlow model). They are other classes than the pb2 modules' ones: exchange them as
  bytes or field by field, not with ``CopyFrom`` or ``isinstance``.
* Thread-safe once built (classes and the pool are read-only).

Only the classes the server uses are named in :class:`Messages`; another one is a field more
(its file is in the pool already when one of the root files depends on it).
:mod:`processor.prediction_log.proto` is another thing: a hand-declared subset under a package of
its own, with fields of ours, for the prediction-log records.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal import enum_type_wrapper
from google.protobuf.message import DecodeError

# The pb2 modules whose files (and their dependencies) make the pool.
_ROOTS = tuple(f"tensorflow_serving.apis.{name}_pb2" for name in (
    "predict", "classification", "regression", "inference", "get_model_metadata", "get_model_status",
    "model_management"))


@dataclass(frozen=True)
class Messages:
    """TF Serving's (and TensorFlow's) message classes of one private pool; see the module doc."""

    PredictRequest: Any
    PredictResponse: Any
    ClassificationRequest: Any
    ClassificationResponse: Any
    RegressionRequest: Any
    RegressionResponse: Any
    MultiInferenceRequest: Any
    MultiInferenceResponse: Any
    GetModelMetadataRequest: Any
    GetModelMetadataResponse: Any
    SignatureDefMap: Any
    GetModelStatusRequest: Any
    GetModelStatusResponse: Any
    ModelVersionStatus: Any
    ReloadConfigRequest: Any
    ReloadConfigResponse: Any
    ModelServerConfig: Any  # the text-format model config file's message (server/tfserving/model_config.py)
    SignatureDef: Any
    TensorInfo: Any
    TensorShapeProto: Any
    ErrorCode: Any  # the enum tensorflow.error.Code (``ErrorCode.Value("NOT_FOUND")``)


_lock = threading.Lock()
_built: Messages | None = None


def messages() -> Messages:
    """The message classes, built once (see the module doc); ImportError where they cannot be."""
    global _built
    if _built is None:
        with _lock:
            if _built is None:
                _built = _build()
    return _built


def _build() -> Messages:
    pool = _Pool()
    try:
        for module in _ROOTS:
            pool.add(module)
    except (DecodeError, TypeError, KeyError) as exc:  # bytes that are no file, a file that does not fit
        raise ImportError(f"TF Serving's protocol buffers do not load: {exc}") from exc

    def cls(name: str) -> Any:
        return message_factory.GetMessageClass(pool.pool.FindMessageTypeByName(name))

    serving = {name: cls(f"tensorflow.serving.{name}") for name in (
        "PredictRequest", "PredictResponse", "ClassificationRequest", "ClassificationResponse",
        "RegressionRequest", "RegressionResponse", "MultiInferenceRequest", "MultiInferenceResponse",
        "GetModelMetadataRequest", "GetModelMetadataResponse", "SignatureDefMap", "GetModelStatusRequest",
        "GetModelStatusResponse", "ModelVersionStatus", "ReloadConfigRequest", "ReloadConfigResponse",
        "ModelServerConfig")}
    code = pool.pool.FindEnumTypeByName("tensorflow.error.Code")
    return Messages(**serving, SignatureDef=cls("tensorflow.SignatureDef"), TensorInfo=cls("tensorflow.TensorInfo"),
                    TensorShapeProto=cls("tensorflow.TensorShapeProto"),
                    ErrorCode=enum_type_wrapper.EnumTypeWrapper(code))


class _Pool:
    """A private pool filled file by file, each after the files it depends on."""

    def __init__(self) -> None:
        self.pool = descriptor_pool.DescriptorPool()
        self._added: set[str] = set()  # module names

    def add(self, module: str) -> None:
        if module in self._added:
            return
        if module.startswith("google.protobuf."):
            data, imports = importlib.import_module(module).DESCRIPTOR.serialized_pb, {}
        else:
            data, imports = _read(_source_file(module))
        file = descriptor_pb2.FileDescriptorProto.FromString(data)
        for dependency in file.dependency:
            self.add(imports.get(_alias(dependency)) or _module_name(dependency))
        self.pool.AddSerializedFile(data)
        self._added.add(module)


def _module_name(proto: str) -> str:
    """protoc's module of a ``.proto`` path: ``a/b-c.proto`` -> ``a.b_c_pb2``."""
    return proto.removesuffix(".proto").replace("-", "_").replace("/", ".") + "_pb2"


def _alias(proto: str) -> str:
    """The name protoc imports a dependency's module under in a ``_pb2.py``."""
    return _module_name(proto).replace("_", "__").replace(".", "_dot_")


def _source_file(module: str) -> Path:
    """The ``.py`` file of ``module``, found without importing any package of it."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)  # a top-level name: finders only, no __init__ runs
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"No module named {top!r}", name=top)
    for location in spec.submodule_search_locations:
        path = Path(location, *rest[:-1], rest[-1] + ".py")
        if path.is_file():
            return path
    raise ModuleNotFoundError(f"No module named {module!r}", name=module)


def _read(path: Path) -> tuple[bytes, dict[str, str]]:
    """A ``_pb2.py`` file's serialized FileDescriptorProto and its imports (alias -> module),
    from its source (nothing executed)."""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImportError(f"cannot read {path}: {exc}") from None
    data, imports = None, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imports.update((a.asname, f"{node.module}.{a.name}") for a in node.names if a.asname)
        elif (data is None and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "AddSerializedFile" and len(node.args) == 1):
            try:
                data = ast.literal_eval(node.args[0])
            except ValueError:
                pass
    if not isinstance(data, bytes):
        raise ImportError(f"{path} holds no AddSerializedFile(b'...') of protoc's")
    return data, imports
