"""The ``cpu_scheduling`` key (server/cpu_policy.py): validated strictly; "batch" puts the
threads running and those started after under SCHED_BATCH (in a child process, so the test's
own keeps its policy); "other" and "io_batch" change nothing process-wide ("io_batch" is the
native gRPC server's, for its own threads). (A real server: tests/e2e/server/test_cpu_scheduling.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from processor.errors import ConfigError
from sp_checks import toy_deployment as deployment


def test_io_batch_is_the_default_and_the_others_are_accepted():
    assert deployment().cpu_scheduling == "io_batch"
    assert deployment(cpu_scheduling="other").cpu_scheduling == "other"
    assert deployment(cpu_scheduling="batch").cpu_scheduling == "batch"


@pytest.mark.parametrize("value", ["BATCH", "fifo", "idle", "", 1, None, True])
def test_anything_else_is_a_config_error_naming_the_key(value):
    with pytest.raises(ConfigError) as info:
        deployment(cpu_scheduling=value)
    assert info.value.message.startswith("cpu_scheduling"), info.value.message


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_BATCH is Linux's")
def test_batch_covers_the_threads_running_and_those_to_come():
    script = """
import os, threading
from server import cpu_policy
ready, done = threading.Event(), threading.Event()
seen = {}
def before():
    ready.set(); done.wait(); seen["before"] = os.sched_getscheduler(0)
t = threading.Thread(target=before); t.start(); ready.wait()
cpu_policy.apply("other")
cpu_policy.apply("io_batch")
print(os.sched_getscheduler(0) == os.SCHED_OTHER)
cpu_policy.apply("batch")
after = threading.Thread(target=lambda: seen.__setitem__("after", os.sched_getscheduler(0)))
after.start(); after.join(); done.set(); t.join()
print(os.sched_getscheduler(0) == seen["before"] == seen["after"] == os.SCHED_BATCH)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"], out.stdout


def test_without_sched_batch_it_is_a_config_error_naming_the_key(monkeypatch):
    import os

    from server import cpu_policy

    monkeypatch.delattr(os, "SCHED_BATCH", raising=False)
    with pytest.raises(ConfigError) as info:
        cpu_policy.apply("batch")
    assert info.value.message.startswith("cpu_scheduling")
    cpu_policy.apply("other")  # nothing asked, nothing needed
    cpu_policy.apply("io_batch")
    assert [cpu_policy.io_threads_batch(p) for p in ("other", "io_batch", "batch")] == [False, True, False]
