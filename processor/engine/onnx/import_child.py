"""A ``.onnx`` source imported into a cache entry in a child process, off the server's GIL.

Importing a model parses its protobuf whole (``onnx.load``), copies each parameter out into
``weights.bin`` (:func:`~processor.engine.onnx.weights.externalize_parameters`) and writes the
graph back. For a 953 MiB model that is about 2.5 s of a core, all of it with the GIL held: C++
protobuf parsing and numpy's copies do not release it, so in the serving process every request
waited behind it (measured: a thread that asks for the GIL every millisecond waited 854 ms at
once, the parse, while the models already served answered nothing). In a child process the
server's threads keep the GIL. The child starts from the loading thread, so it inherits that
thread's CPU priority (Linux gives a new process its creating thread's nice value:
:mod:`processor.load_priority`), and its memory (the parsed model, about twice the file) goes
back to the system when it exits instead of staying in the server's heap.

A child costs its start (about 0.7 s here, most of it importing numpy and ml_dtypes), while the
parse holds the GIL about 0.9 ms per MiB: :func:`import_model` imports a file of at least
:data:`CHILD_MIN_BYTES` in a child and a smaller one in-process (a stall of under ~60 ms, less
than the child's start). The child is the interpreter this process runs on (``sys.executable``:
the C ABI's embedded interpreter sets it to its venv's Python) running this module, which writes
its result into the entry's work directory; where there is no interpreter to start (an embedding
without ``sys.executable``), the import runs in-process. Thread-safe: functions only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ... import errors
from ...errors import Internal, ProcessorError
from .signature import signature_of_onnx, signature_to_manifest
from .weights import externalize_parameters

CHILD_MIN_BYTES = 64 << 20
RESULT = ".import-result.json"  # in the work directory, read and removed by the parent
_ROOT = Path(__file__).resolve().parents[3]  # the directory that holds the processor package


def import_onnx(onnx_file: str, work: Path) -> dict[str, Any]:
    """Import ``onnx_file`` into ``work`` (the graph, ``weights.bin``); return its manifest.
    Raises Internal for an unreadable model (and the signature's errors)."""
    import onnx

    try:
        model = onnx.load(onnx_file)  # loads external data too
    except Exception as exc:
        raise Internal(f"cannot read ONNX model {onnx_file!r}: {type(exc).__name__}: {exc}") from exc
    signature = signature_of_onnx(model, "serving_default")
    # Initializers that are also graph inputs would be overridable by feeds; they are parameters here.
    parameters = externalize_parameters(model, work, {})
    onnx.save(model, str(work / "model.onnx"))
    return {"source": {"kind": "onnx", "path": onnx_file}, "signature": signature_to_manifest(signature),
            "parameters": parameters, "hashed_inputs": [], "check": {"status": "not applicable (ONNX source)"}}


def import_model(onnx_file: str, work: Path) -> dict[str, Any]:
    """:func:`import_onnx`, in a child process when the file holds at least
    :data:`CHILD_MIN_BYTES` (see the module doc), else in-process; blocks until it is done.
    Raises the ProcessorError the import raised (same class, same message), or Internal when the
    child ended without a result (killed: out of memory, a signal)."""
    try:
        small = os.path.getsize(onnx_file) < CHILD_MIN_BYTES
    except OSError:
        small = True  # import_onnx reports it
    if small or not sys.executable:
        return import_onnx(onnx_file, work)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", __name__, onnx_file, str(work)], env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    result_file = work / RESULT
    try:
        result = json.loads(result_file.read_text())
        result_file.unlink()
    except (OSError, ValueError):
        reason = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
        tail = proc.stderr.decode(errors="replace").strip()[-1000:]
        raise Internal(f"importing ONNX model {onnx_file!r} failed: its process ended with {reason}"
                       + (f": {tail}" if tail else "")) from None
    if "error" in result:
        error = result["error"]
        kind = getattr(errors, error["type"], None)
        raise (kind if isinstance(kind, type) and issubclass(kind, ProcessorError) else Internal)(error["message"])
    return result["manifest"]


def _main(onnx_file: str, work: str) -> int:
    try:
        result: dict[str, Any] = {"manifest": import_onnx(onnx_file, Path(work))}
    except ProcessorError as exc:
        result = {"error": {"type": type(exc).__name__, "message": exc.message}}
    except Exception as exc:  # noqa: BLE001 -- the parent reports it as the load's error
        result = {"error": {"type": "Internal", "message": f"importing ONNX model {onnx_file!r} failed: "
                                                           f"{type(exc).__name__}: {exc}"}}
    (Path(work) / RESULT).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1], sys.argv[2]))
