"""The JSON edges' native parts (``processor._native``'s ``json_array`` / ``json_numbers``,
``native/src/module_json.cc``), each answering None where its Python reference must decide.

* :func:`array`: parsed JSON values (nested lists of int / float) as a numpy array, the way
  TF Serving REST's decode reads them (:func:`server.tfserving.rest_json_values.to_array`, numpy's
  shape of the lists) or KServe v2's (``count`` numbers of any nesting, flat:
  :func:`server.kserve.open_inference.to_array`). Only what the reference accepts, converted as it
  converts it: booleans, strings, empty lists, integers beyond int64, values out of the type's
  range are the reference's to accept or refuse.
* :func:`numbers`: a numeric array's ``orjson.dumps(array.tolist())``, byte for byte, without
  a Python object per element; None for non-finite floats and other dtypes.
* :func:`scan_tfs`: a TF Serving REST predict body of the plain form (numbers and lists of them,
  named inputs, an optional signature name; ``native/src/tfs_scan.h``) read straight into
  numbers per input, no Python object per value; :func:`server.tfserving.rest_json.decode_scan`
  makes its arrays as the reference decodes the parsed body.
* :func:`depth`: how deeply a JSON text nests arrays and objects
  (:func:`server.http.json_stream.nesting_depth` is the reference).

Without the extension each always answers None. Pure functions; thread-safe.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from processor.native import MODULE

_array = MODULE.json_array if MODULE is not None else None
_numbers = MODULE.json_numbers if MODULE is not None else None
_scan_tfs = MODULE.scan_tfs if MODULE is not None else None
_depth = MODULE.json_depth if MODULE is not None else None


def array(value: Any, dtype: np.dtype, count: int = -1) -> np.ndarray | None:
    """``value`` (a list) as an array of ``dtype``: ``count`` < 0, of the lists' shape (TF
    Serving); else exactly ``count`` numbers, flat (KServe v2). None: not taken."""
    if _array is None or type(value) is not list:
        return None
    return _array(value, dtype.num, count)


def numbers(array_: np.ndarray) -> bytes | None:
    """``orjson.dumps(array_.tolist())`` for a numeric array of finite values; None: not taken."""
    return _numbers(array_) if _numbers is not None else None


def scan_tfs(body: bytes | bytearray) -> Any:
    """``body`` read natively (a ``TfsScan``: ``columnar``, ``signature_name`` or None,
    ``names`` ("" for bare values), ``arrays(type_nums)`` or None); None: parse it with the
    reference."""
    return _scan_tfs(body) if _scan_tfs is not None else None


def depth(body: bytes | bytearray, limit: int) -> int | None:
    """How deeply ``body`` nests arrays and objects outside strings, counted up to ``limit + 1``;
    None: no extension."""
    return _depth(body, limit) if _depth is not None else None
