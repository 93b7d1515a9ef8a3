"""Flat entry points called by the C shim (``libserving_processor.so``).

The C library converts arguments and copies results; everything else happens here. Contract:

* ``initialize`` returns an opaque handle or raises ProcessorError with the message to print;
* ``process``, ``batch_process`` and ``get_serving_model_info`` never raise: they return
  ``(status, payload)`` with status 200 and a serialized message, or an error status and a
  UTF-8 message; the status is the ``c_abi`` column of :data:`processor.errors.STATUS_TABLE`
  (the C library passes on those in ``C_ABI_STATUSES``, the statuses processor.h documents);
* this is the C ABI's edge: each failure is converted once with
  :func:`processor.errors.edge_error` (edge ``"c_abi"``), which logs an internal error's
  traceback -- here for ``initialize``, in :class:`~processor.processor.Processor`'s
  status-code methods (``process``, ``process_many``, ``serving_model_info``) for the rest;
* ``process`` and ``batch_process`` get each request as a read-only ``memoryview`` of the host's
  buffer (no copy); it is valid during the call only, so nothing may keep it (or a view of it)
  after returning: the C shim releases it and the host frees the memory;
* ``finalize`` releases the model; it is idempotent;
* every function is thread-safe.
"""

from __future__ import annotations

import logging

from .errors import edge_error
from .processor import EDGE, Processor

ABI_VERSION = 1

log = logging.getLogger(__name__)


def initialize(model_entry: str, model_config: str) -> Processor:
    try:
        return Processor.create(model_entry, model_config)
    except Exception as exc:
        raise edge_error(exc, EDGE, log)  # its __cause__ is exc (or it is exc)


def direct_front(handle: Processor) -> object | None:
    """The model's direct-path front as a capsule (``native/src/direct_api.h``), or None."""
    try:
        return handle.direct_capsule()
    except Exception:  # the direct path is an optimization: without it every call is served
        log.exception("the direct path is off for this model")
        return None


def process(handle: Processor, data: bytes | memoryview, direct_tried: bool = False) -> tuple[int, bytes]:
    """``direct_tried``: the C shim's direct path did not take this request (so it is not tried
    again here)."""
    return handle.process(data, direct=not direct_tried)


def batch_process(handle: Processor, requests: list[bytes | memoryview]) -> list[tuple[int, bytes]]:
    return handle.process_many(requests)


def get_serving_model_info(handle: Processor) -> tuple[int, bytes]:
    return handle.serving_model_info()


def finalize(handle: Processor) -> None:
    handle.close()
