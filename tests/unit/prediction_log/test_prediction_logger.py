"""processor.prediction_log, its logic with real files and a fake of our own sink: the config key,
the record formats, sampling, the bounded queue, failing sinks, rotation by size and age,
uploads through fsspec (its memory file system). The DataPlane hook and every edge are tested
against real models and servers (tests/integration/test_prediction_log.py,
tests/e2e/test_server_prediction_log.py)."""

from __future__ import annotations

import errno
import json
import math
import os
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from processor.config import ModelConfig
from processor.errors import ConfigError, InvalidArgument
from processor.prediction_log import PredictionLogger, formats
from processor.prediction_log.proto import PredictionLog
from processor.prediction_log.record import Pending, Resolved
from processor.request import PredictCall, PredictResult, request_id_var
from sp_checks import wait_for


def config(tmp_path, **logging) -> ModelConfig:
    settings = {"sampling_rate": 1.0, "path": str(tmp_path / "logs")}
    settings.update(logging)
    return ModelConfig.from_dict({"savedmodel_dir": "/m", "logging_config": settings})


def read_tfrecords(path) -> list[bytes]:
    """The records of a TFRecord file, checking both checksums of each (as TensorFlow does)."""
    data, out, at = open(path, "rb").read(), [], 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        (length_crc,) = struct.unpack_from("<I", data, at + 8)
        assert length_crc == formats.masked_crc32c(data[at:at + 8])
        record = data[at + 12:at + 12 + length]
        (data_crc,) = struct.unpack_from("<I", data, at + 12 + length)
        assert data_crc == formats.masked_crc32c(record)
        out.append(record)
        at += 16 + length
    return out


def closed_files(directory, ext=".tfrecord") -> list[str]:
    return sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(ext))


def answered(x: float, model: str = "m") -> Pending:
    """A sampled array call, answered y = 2x, as the DataPlane leaves it."""
    pending = Pending(model, time.time_ns(), "rid-1", {"x": np.array([[x]], np.float32)}, None)
    pending.feeds = {"x": np.array([[x]], np.float32)}
    pending.result = PredictResult({"y": np.array([[2 * x]], np.float32)}, None, _Sig())
    return pending


class _Sig:
    name = "serving_default"


# --- the config key ---------------------------------------------------------------------------

@pytest.mark.parametrize("bad, key", [
    ({"sampling_rate": "0.5"}, "logging_config.sampling_rate"),
    ({"sampling_rate": 1.5}, "logging_config.sampling_rate"),
    ({"sampling_rate": True}, "logging_config.sampling_rate"),
    ({"path": "relative/dir"}, "logging_config.path"),
    ({"format": "csv"}, "logging_config.format"),
    ({"max_file_bytes": 10}, "logging_config.max_file_bytes"),
    ({"max_file_age_seconds": 0}, "logging_config.max_file_age_seconds"),
    ({"queue_size": 0}, "logging_config.queue_size"),
    ({"filename_prefix": "../x"}, "logging_config.filename_prefix"),
    ({"sampling_rat": 1}, "logging_config.sampling_rat"),
])
def test_config_errors_name_the_key(tmp_path, bad, key):
    with pytest.raises(ConfigError) as info:
        config(tmp_path, **bad)
    assert str(info.value).startswith(key), info.value


def test_config_defaults_and_off_by_default(tmp_path):
    assert ModelConfig.from_dict({"savedmodel_dir": "/m"}).logging_config is None
    settings = config(tmp_path).logging_config
    assert (settings.format, settings.queue_size, settings.remote) == ("prediction_log", 1024, False)
    assert config(tmp_path, path="memory://bucket/logs").logging_config.remote


def test_unwritable_path_is_a_config_error_naming_the_key(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"^logging_config.path: cannot write"):
        PredictionLogger.from_config("m", config(tmp_path, path=str(tmp_path / "file" / "logs")))


# --- formats ------------------------------------------------------------------------------------

def test_masked_crc32c_is_tensorflows():
    # CRC-32C of "123456789" is 0xE3069283 (RFC 3720); TFRecord masks it
    crc = 0xE3069283
    assert formats.masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_prediction_log_record_holds_the_call():
    call = Resolved("m", 7, "serving_default", "rid", 1_700_000_000_123_456_789,
                    {"x": np.array([[1.5, np.nan]], np.float32), "s": np.array([b"a", b"\xff"], object)},
                    ("y",), {"y": np.array([[3]], np.int64)}, None)
    (raw,) = read_tfrecords_bytes(formats.prediction_log(call, 0.25))
    entry = PredictionLog.FromString(raw)
    meta = entry.log_metadata
    assert (meta.model_spec.name, meta.model_spec.version.value, meta.model_spec.signature_name) == (
        "m", 7, "serving_default")
    assert (meta.sampling_config.sampling_rate, meta.timestamp_secs, meta.request_id) == (0.25, 1_700_000_000, "rid")
    x = entry.predict_log.request.inputs["x"]
    assert x.dtype == 1 and [d.size for d in x.tensor_shape.dim] == [1, 2]
    np.testing.assert_array_equal(np.frombuffer(x.tensor_content, "<f4"), [1.5, np.nan])
    assert list(entry.predict_log.request.inputs["s"].string_val) == [b"a", b"\xff"]
    assert entry.predict_log.response.outputs["y"].dtype == 9 and not meta.error_code

    failed = formats.prediction_log(call._replace(outputs=None, error=InvalidArgument("bad x")), 0.25)
    entry = PredictionLog.FromString(read_tfrecords_bytes(failed)[0])
    assert not entry.predict_log.HasField("response")
    assert (entry.log_metadata.error_code, entry.log_metadata.error_message) == ("INVALID_ARGUMENT", "bad x")


def read_tfrecords_bytes(data: bytes) -> list[bytes]:
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"pl-{os.getpid()}-{threading.get_ident()}")
    with open(path, "wb") as f:
        f.write(data)
    try:
        return read_tfrecords(path)
    finally:
        os.unlink(path)


def test_jsonl_line():
    call = Resolved("m", None, "", "rid", 1_700_000_000_000_001_000,
                    {"s": np.array([b"caf\xc3\xa9", b"\xff"], object), "x": np.array([np.inf], np.float64)},
                    (), None, InvalidArgument("no version"))
    line = formats.jsonl(call, 1.0)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    doc = json.loads(line)
    assert doc["time"] == "2023-11-14T22:13:20.000001Z" and doc["version"] is None
    assert doc["inputs"]["s"] == {"dtype": "DT_STRING", "shape": [2], "values": ["café", {"b64": "/w=="}]}
    assert doc["inputs"]["x"]["values"] == [math.inf]
    assert "outputs" not in doc and doc["error"] == {"code": "INVALID_ARGUMENT", "message": "no version"}


# --- sampling, queue, sinks -----------------------------------------------------------------

def test_sampling_rate_within_binomial_bounds(tmp_path):
    logger = PredictionLogger.from_config("m", config(tmp_path, sampling_rate=0.1))
    try:
        n, p = 20_000, 0.1
        sampled = sum(logger.begin(PredictCall("m", b"x")) is not None for _ in range(n))
        sigma = math.sqrt(n * p * (1 - p))
        assert abs(sampled - n * p) < 6 * sigma, sampled  # fails by chance about once in 10^9 runs
    finally:
        logger.close()
    never = PredictionLogger.from_config("m", config(tmp_path, sampling_rate=0))
    always = PredictionLogger.from_config("m", config(tmp_path, sampling_rate=1))
    try:
        assert not any(never.begin(PredictCall("m", b"x")) for _ in range(1000))
        assert all(always.begin(PredictCall("m", b"x")) for _ in range(1000))
    finally:
        never.close()
        always.close()


def test_begin_copies_a_view_of_the_callers_buffer(tmp_path):
    logger = PredictionLogger.from_config("m", config(tmp_path))
    try:
        buffer = bytearray(b"request")
        token = request_id_var.set("abc")
        try:
            pending = logger.begin(PredictCall("m", memoryview(buffer)))
        finally:
            request_id_var.reset(token)
        buffer[:] = b"changed"
        assert pending.wire == b"request" and pending.request_id == "abc"
        same = b"immutable"
        assert logger.begin(PredictCall("m", same)).wire is same  # bytes: referenced, not copied
    finally:
        logger.close()


def test_full_queue_drops_and_counts(tmp_path):
    logger = PredictionLogger.from_config("m", config(tmp_path, queue_size=4))
    entered, release = threading.Event(), threading.Event()
    write = logger._files.write

    def held_write(record):
        entered.set()
        release.wait(30)
        write(record)

    logger._files.write = held_write
    try:
        logger.submit(answered(0.0))
        assert entered.wait(10)  # the writer holds that record; the queue is empty again
        for i in range(10):
            logger.submit(answered(float(i)))
        assert logger.describe()["dropped_queue_full"] == 6 and logger.describe()["queued"] == 4
        release.set()
        assert logger.flush()
        info = logger.describe()
        assert (info["written"], info["dropped_queue_full"], info["failed"]) == (5, 6, 0)
    finally:
        release.set()
        logger.close()
    assert len(read_tfrecords(closed_files(tmp_path / "logs")[0])) == 5


class _FullDisk:
    """A sink whose every write fails as a full disk does (a fake of our own LogFiles)."""

    def __init__(self, files) -> None:
        self.files = files

    def write(self, record):
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.files, name)


def test_failing_sink_is_counted_and_reported(tmp_path):
    logger = PredictionLogger.from_config("m", config(tmp_path))
    logger._files = _FullDisk(logger._files)
    try:
        for i in range(3):
            logger.submit(answered(float(i)))
        assert logger.flush()
        info = logger.describe()
        assert (info["written"], info["failed"], info["write_errors"]) == (0, 3, 3)
        assert "No space left on device" in info["last_error"]
    finally:
        logger.close()


def test_write_error_keeps_the_complete_records(tmp_path):
    logger = PredictionLogger.from_config("m", config(tmp_path))
    try:
        logger.submit(answered(1.0))
        assert logger.flush(timeout=10)
        logger.submit(answered(2.0))
        wait_for(lambda: logger.describe()["current_file"] is not None and logger.describe()["written"] == 2)
        tmp = logger.describe()["current_file"]
        real = logger._files._file
        logger._files._file = _Broken(real)
        logger.submit(answered(3.0))
        assert logger.flush()
        assert logger.describe()["write_errors"] == 1 and not os.path.exists(tmp)
        files = closed_files(tmp_path / "logs")
        assert [len(read_tfrecords(f)) for f in files] == [1, 1]  # the second file cut at record 2
    finally:
        logger.close()


class _Broken:
    """A file whose writes fail half-way (the first half reaches the disk)."""

    def __init__(self, f) -> None:
        self.f = f

    def write(self, data):
        self.f.write(data[: len(data) // 2])
        self.f.flush()
        raise OSError(errno.EIO, "Input/output error")

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_rotation_by_size(tmp_path):
    logger = PredictionLogger.from_config("m", config(tmp_path, max_file_bytes=4096, format="jsonl"))
    try:
        for i in range(60):
            logger.submit(answered(float(i)))
        assert logger.flush()
    finally:
        logger.close()
    files = closed_files(tmp_path / "logs", ".jsonl")
    assert len(files) > 1 and not [f for f in os.listdir(tmp_path / "logs") if f.endswith(".tmp")]
    lines = [json.loads(line) for f in files for line in open(f)]
    assert [d["inputs"]["x"]["values"] for d in lines] == [[[float(i)]] for i in range(60)]
    assert all(os.path.getsize(f) >= 4096 for f in files[:-1])


def test_rotation_by_age(tmp_path):
    logger = PredictionLogger.from_config("m", config(tmp_path, max_file_age_seconds=0.2))
    try:
        logger.submit(answered(1.0))
        # no flush: the writer closes the file once it is 0.2 s old
        assert wait_for(lambda: logger.describe()["files_closed"] == 1, timeout=30)
        assert len(read_tfrecords(closed_files(tmp_path / "logs")[0])) == 1
    finally:
        logger.close()


def test_closed_files_are_uploaded_through_fsspec(tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    url = f"memory://pl-{os.getpid()}/logs"
    logger = PredictionLogger.from_config("m", config(tmp_path, path=url, staging_dir=str(tmp_path / "stage")))
    try:
        logger.submit(answered(1.0))
        assert logger.flush()
        info = logger.describe()
        assert (info["files_uploaded"], info["uploads_pending"]) == (1, 0)
        (remote,) = fs.ls(f"/pl-{os.getpid()}/logs", detail=False)
        assert remote.endswith(".tfrecord") and os.listdir(tmp_path / "stage") == []
        assert PredictionLog.FromString(read_tfrecords_bytes(fs.cat_file(remote))[0]).log_metadata.request_id == "rid-1"
    finally:
        logger.close()
        fs.rm(f"/pl-{os.getpid()}", recursive=True)


def test_close_writes_the_queue_and_refuses_later_records(tmp_path):
    logger = PredictionLogger.from_config("m", config(tmp_path))
    for i in range(20):
        logger.submit(answered(float(i)))
    logger.close()
    assert len(read_tfrecords(closed_files(tmp_path / "logs")[0])) == 20
    logger.submit(answered(0.0))
    assert logger.describe()["dropped_closed"] == 1


# --- what a crash leaves ------------------------------------------------------------------------

def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _leftover(directory, pid: int, seq: int, data: bytes, ext: str = ".tfrecord") -> str:
    path = os.path.join(directory, f"m-20260101T000000-{pid}-{seq:06d}{ext}.tmp")
    with open(path, "wb") as f:
        f.write(data)
    return path


def test_a_crash_left_file_is_cut_to_whole_records_and_published_live_ones_are_left(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    whole = [formats.tfrecord(b"record-%d" % i) for i in range(3)]
    dead = _dead_pid()
    torn = _leftover(logs, dead, 1, b"".join(whole) + formats.tfrecord(b"cut short")[:-3])
    bad_crc = whole[0] + whole[1][:-1] + b"\x00" + whole[2]  # the second record's data checksum is wrong
    corrupt = _leftover(logs, dead, 2, bad_crc)
    empty = _leftover(logs, dead, 3, formats.tfrecord(b"x")[:5])
    live_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = _leftover(logs, live_process.pid, 1, whole[0][:-2])  # a sibling worker writing now
        other = _leftover(logs, dead, 4, b"junk", ext=".jsonl")  # another format's file
        logger = PredictionLogger.from_config("m", config(tmp_path))
        try:
            assert logger.flush()
            assert logger.describe()["files_recovered"] == 2
        finally:
            logger.close()
        assert read_tfrecords(torn[:-4]) == [b"record-%d" % i for i in range(3)]
        assert read_tfrecords(corrupt[:-4]) == [b"record-0"]
        assert not os.path.exists(empty) and not os.path.exists(empty[:-4])
        assert os.path.exists(live) and os.path.exists(other)
    finally:
        live_process.kill()
        live_process.wait()


def test_a_crash_left_jsonl_file_keeps_its_whole_lines_and_is_uploaded(tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    url = f"memory://pl-recover-{os.getpid()}/logs"
    stage = tmp_path / "stage"
    stage.mkdir()
    _leftover(stage, _dead_pid(), 1, b'{"a":1}\n{"a":2}\n{"a":', ext=".jsonl")
    logger = PredictionLogger.from_config("m", config(tmp_path, path=url, staging_dir=str(stage), format="jsonl"))
    try:
        assert logger.flush()
        info = logger.describe()
        assert (info["files_recovered"], info["files_uploaded"]) == (1, 1)
        (remote,) = fs.ls(f"/pl-recover-{os.getpid()}/logs", detail=False)
        assert fs.cat_file(remote) == b'{"a":1}\n{"a":2}\n' and os.listdir(stage) == []
    finally:
        logger.close()
        fs.rm(f"/pl-recover-{os.getpid()}", recursive=True)
