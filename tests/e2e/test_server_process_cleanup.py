"""tools.server_process: a server a test (or benchmark) started and never stopped, because it
failed before its stop(), is stopped when the Python process exits, not left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import model_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_a_server_left_running_is_stopped_at_exit(toy_model, tmp_path):
    deployment = {"models": [{"name": "toy", "model_config": model_config(toy_model)}], "access_log": False}
    script = (
        "import json, sys\n"
        "from tools.server_process import ServerProcess\n"
        f"server = ServerProcess(json.loads({json.dumps(json.dumps(deployment))}), {str(tmp_path)!r}).start(180)\n"
        "print(server.proc.pid, flush=True)\n"
        "raise SystemExit('failing before stop()')\n")
    child = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=280,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    assert child.returncode != 0 and "failing before stop()" in child.stderr
    pid = int(child.stdout.split()[0])
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _alive(pid)
    if left:
        os.kill(pid, signal.SIGKILL)  # not for the next tests to meet
    assert not left, f"server {pid} left running"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False
