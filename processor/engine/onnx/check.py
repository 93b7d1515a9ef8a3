"""Check a converted graph against TensorFlow: both run on the same synthetic inputs.

A mismatch beyond ``|ort - tf| <= ATOL + RTOL * |tf|`` (floats; other dtypes must be equal)
raises Internal naming the output and the error, so the model is not cached or served. The
report (tolerances, largest difference per output) goes into the cache entry's manifest.

Functions only; thread-safe.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ConfigError, Internal
from ...signature import Signature

ATOL = 1e-5
RTOL = 1e-5
CHECK_BATCH = 8


def synthetic_feeds(signature: Signature, batch: int, seed: int, small_ints: bool = False) -> dict[str, np.ndarray]:
    """Random inputs that fit ``signature`` (free dimensions = ``batch``)."""
    from ...dtypes import WIRE_TYPES

    rng = np.random.default_rng(seed)
    feeds = {}
    for alias, spec in signature.inputs.items():
        shape = (batch,) if spec.shape is None else tuple(batch if d < 0 else d for d in spec.shape)
        dtype = WIRE_TYPES[spec.dtype].numpy if spec.dtype in WIRE_TYPES else np.dtype(np.float32)
        if spec.dtype == 7:  # DT_STRING: hex tokens of many lengths, some past 64 bytes
            lengths = rng.integers(0, 90, size=shape)
            flat = [rng.bytes(int(n) // 2 + 1).hex()[: int(n)].encode() for n in lengths.reshape(-1)]
            feeds[alias] = np.array(flat, dtype=object).reshape(shape)
        elif dtype.kind == "f":
            feeds[alias] = (rng.standard_normal(shape) * 2).astype(dtype)
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            lo, hi = (0, 2) if small_ints else (max(info.min, -(2 ** 62)), min(info.max, 2 ** 62))
            feeds[alias] = rng.integers(lo, hi, size=shape, dtype=dtype)
        elif dtype.kind == "b":
            feeds[alias] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            feeds[alias] = np.zeros(shape, dtype)
    return feeds


def ort_feeds(signature: Signature, feeds: dict[str, np.ndarray], hashed: tuple[str, ...] | list[str]) -> dict:
    """Feeds keyed by ONNX input name, with string inputs fingerprinted or made ``str``."""
    from ..string_hash import fingerprint64

    out = {}
    for alias, value in feeds.items():
        spec = signature.inputs[alias]
        if alias in hashed:
            value = fingerprint64(value)
        elif spec.dtype == 7:
            value = np.array([v.decode("utf-8") if isinstance(v, bytes) else v for v in value.reshape(-1)],
                             dtype=object).reshape(value.shape)
        out[spec.name] = value
    return out


def check_against_tensorflow(model, session, signature: Signature, hashed: list[str]) -> dict[str, Any]:
    """Run TF and ORT on synthetic inputs; raise Internal if an output differs beyond tolerance."""
    from .ort_env import global_pools_in_force, ort as _ort

    ort = _ort()

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if global_pools_in_force():  # ORT then refuses sessions with their own pools
        options.use_per_session_threads = False
    try:
        ort_session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ConfigError(f"backend: the converted graph does not load in ONNX Runtime ({exc}); "
                          f"serve this model with `backend: tensorflow`") from None
    aliases = list(signature.outputs)
    report: dict[str, Any] = {"atol": ATOL, "rtol": RTOL, "batch": CHECK_BATCH, "max_abs_diff": {}}
    for small_ints in (False, True):  # ids used directly as rows need small values
        feeds = synthetic_feeds(signature, CHECK_BATCH, seed=7, small_ints=small_ints)
        try:
            want = session.run([signature.outputs[a].name for a in aliases],
                               {signature.inputs[a].name: v for a, v in feeds.items()})
            break
        except Exception as exc:
            if small_ints:
                raise Internal("the TensorFlow model rejects synthetic inputs; cannot check the "
                               "conversion") from exc
    got = ort_session.run([signature.outputs[a].name for a in aliases], ort_feeds(signature, feeds, hashed))
    for alias, w, g in zip(aliases, want, got):
        w, g = np.asarray(w), np.asarray(g)
        if w.shape != g.shape:
            raise Internal(f"ONNX conversion does not match TensorFlow: output {alias!r} has shape "
                           f"{list(g.shape)}, TensorFlow's is {list(w.shape)}")
        if w.dtype.kind in "fc":
            diff = float(np.max(np.abs(g.astype(np.float64) - w))) if w.size else 0.0
            g64, w64 = g.astype(np.float64), w.astype(np.float64)
            ok = (np.abs(g64 - w64) <= ATOL + RTOL * np.abs(w64)) | (np.isnan(g64) & np.isnan(w64))
            bad = not bool(ok.all())
        else:
            diff = float(np.count_nonzero(g != w))
            bad = diff > 0
        report["max_abs_diff"][alias] = diff
        if bad:
            raise Internal(f"ONNX conversion does not match TensorFlow: output {alias!r} differs by up "
                           f"to {diff:.3g} on synthetic inputs (tolerance {ATOL} + {RTOL}*|tf|); "
                           f"serve this model with `backend: tensorflow`")
    report["status"] = "passed"
    return report
