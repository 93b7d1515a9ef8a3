"""processor.errors: causes kept, and edge_error's contract (one ERROR record with the traceback
per internal error, nothing above DEBUG for the caller's errors), canonical code names."""

from __future__ import annotations

import logging

import pytest

from processor import abi
from processor.errors import (
    C_ABI_STATUSES,
    STATUS_TABLE,
    Internal,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    ProcessorError,
    ResourceExhausted,
    StatusCode,
    Unavailable,
    as_processor_error,
    edge_error,
)

LOGGER = "tests.edge"


def _raise_key_error() -> None:
    {}["missing_key"]  # a bug in our own code


def _caught(fn) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("did not raise")


def test_as_processor_error_keeps_the_cause():
    exc = _caught(_raise_key_error)
    err = as_processor_error(exc)
    assert isinstance(err, Internal) and err.code == StatusCode.INTERNAL
    assert err.__cause__ is exc and err.__suppress_context__
    assert err.message == "KeyError: 'missing_key'"
    mine = NotFound("no such model")
    assert as_processor_error(mine) is mine and mine.__cause__ is None


def test_internal_error_logs_one_error_record_with_the_original_traceback(caplog):
    exc = _caught(_raise_key_error)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        err = edge_error(exc, "grpc", logging.getLogger(LOGGER))
    assert isinstance(err, Internal) and err.__cause__ is exc
    assert err.edge == STATUS_TABLE[StatusCode.INTERNAL]
    [record] = caplog.records
    assert record.levelno == logging.ERROR and record.name == LOGGER
    assert record.edge == "grpc" and record.status == "INTERNAL"
    assert "grpc" in record.getMessage() and "KeyError: 'missing_key'" in record.getMessage()
    assert record.exc_info[1] is exc
    text = caplog.text
    assert "Traceback (most recent call last)" in text and "_raise_key_error" in text
    assert "{}[\"missing_key\"]" in text or "missing_key" in text


def test_a_wrapped_internal_error_logs_its_causes_traceback(caplog):
    """An Internal made deeper down (the data plane's as_processor_error) reaching the edge."""
    exc = _caught(_raise_key_error)
    wrapped = as_processor_error(exc)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        err = edge_error(wrapped, "http", logging.getLogger(LOGGER))
    assert err is wrapped
    [record] = caplog.records
    assert record.levelno == logging.ERROR and record.exc_info[1] is wrapped
    assert "_raise_key_error" in caplog.text  # the cause's frames, chained before the wrapper's
    assert "The above exception was the direct cause" in caplog.text


def test_one_failure_shared_by_several_requests_is_logged_once(caplog):
    """A merged batch's engine failure: each request gets its own wrapper of the same exception."""
    exc = _caught(lambda: 1 / 0)
    logger = logging.getLogger(LOGGER)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        errs = [edge_error(as_processor_error(exc), "c_abi", logger) for _ in range(3)]
    assert all(e.code == StatusCode.INTERNAL and e.__cause__ is exc for e in errs)
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.DEBUG, logging.DEBUG]
    assert caplog.records[0].exc_info is not None
    assert all(r.exc_info is None for r in caplog.records[1:])


def test_a_bare_internal_error_is_logged(caplog):
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        err = edge_error(_caught(lambda: _raise(Internal("engine returned no outputs"))), "grpc",
                         logging.getLogger(LOGGER))
    [record] = caplog.records
    assert record.levelno == logging.ERROR and record.exc_info[1] is err


def _raise(exc: BaseException) -> None:
    raise exc


@pytest.mark.parametrize("exc", [InvalidArgument("bad dtype"), NotFound("unknown model 'x'"),
                                 PayloadTooLarge("body over 10 bytes"), Unavailable("queue is full"),
                                 ProcessorError("late", StatusCode.DEADLINE_EXCEEDED)],
                         ids=lambda e: e.code.name)
def test_the_callers_errors_are_not_logged_above_debug(caplog, exc):
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        err = edge_error(exc, "http", logging.getLogger(LOGGER))
    assert err is exc
    assert all(r.levelno <= logging.DEBUG for r in caplog.records)
    assert all(r.exc_info is None for r in caplog.records)


def test_canonical_code_names():
    """StatusCode members are gRPC's canonical names; each table row names the same gRPC code."""
    assert [c.name for c in StatusCode] == ["OK", "INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION",
                                            "RESOURCE_EXHAUSTED", "INTERNAL", "UNAVAILABLE", "DEADLINE_EXCEEDED"]
    for code in StatusCode:
        assert STATUS_TABLE[code].grpc == code.name
        # FAILED_PRECONDITION goes out as 400, TF Serving's HTTP status for it
        assert STATUS_TABLE[code].http == (400 if code == StatusCode.FAILED_PRECONDITION else int(code))
    assert issubclass(PayloadTooLarge, ResourceExhausted)
    assert PayloadTooLarge("x").code == StatusCode.RESOURCE_EXHAUSTED


def test_c_abi_statuses_are_the_headers():
    """C_ABI_STATUSES is the list processor.h documents (PROCESSOR_STATUS_* defines)."""
    import re
    from pathlib import Path

    header = (Path(__file__).resolve().parents[2] / "cpp_processor" / "include" / "processor.h").read_text()
    defined = {int(v) for v in re.findall(r"#define PROCESSOR_STATUS_\w+ (\d+)", header)}
    assert defined == set(C_ABI_STATUSES)
    assert STATUS_TABLE[StatusCode.OK].c_abi in C_ABI_STATUSES


def test_abi_initialize_logs_an_internal_failure_once(caplog, monkeypatch):
    """The C ABI edge: initialize's internal failure is logged with its traceback and raised as
    Internal whose cause is the original; a config error is raised as it is, not logged."""
    from processor.processor import Processor

    def broken(entry, config):
        _raise_key_error()

    monkeypatch.setattr(Processor, "create", staticmethod(broken))
    with caplog.at_level(logging.DEBUG, logger="processor.abi"):
        with pytest.raises(Internal) as info:
            abi.initialize("", "{}")
    assert isinstance(info.value.__cause__, KeyError)
    [record] = [r for r in caplog.records if r.name == "processor.abi"]
    assert record.levelno == logging.ERROR and record.edge == "c_abi"
    assert "_raise_key_error" in caplog.text

    caplog.clear()

    def refused(entry, config):
        raise InvalidArgument("sesion_num: unknown key")

    monkeypatch.setattr(Processor, "create", staticmethod(refused))
    with caplog.at_level(logging.DEBUG, logger="processor.abi"):
        with pytest.raises(InvalidArgument, match="sesion_num"):
            abi.initialize("", "{}")
    assert all(r.levelno <= logging.DEBUG for r in caplog.records)
