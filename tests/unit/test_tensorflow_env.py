"""TensorFlow's process switches set before it starts (processor/tensorflow_env.py).

oneDNN is off in a process that composed its models (apply_environment) before TensorFlow
started, unless the environment says otherwise; a TensorFlow imported before apply() keeps what it had, and its environment is left
alone.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from processor import tensorflow_env

_SCRIPT = """
from processor.processor import Processor  # the library's entry point imports no TensorFlow
from processor import tensorflow_env
from processor.served_model import apply_environment
apply_environment([])  # as every model registry (server, library, C ABI) is composed
import tensorflow
print(tensorflow_env.onednn_enabled())
"""


@pytest.mark.parametrize("setting, expected", [(None, "False"), ("1", "True")])
def test_onednn_is_off_unless_the_environment_asks_for_it(setting, expected):
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.getcwd())
    if setting is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = setting
    run = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == expected


def test_a_tensorflow_already_imported_keeps_its_environment(monkeypatch):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.setitem(sys.modules, "tensorflow", sys.modules.get("tensorflow") or object())
    tensorflow_env.apply()
    assert "TF_ENABLE_ONEDNN_OPTS" not in os.environ


def test_apply_sets_only_what_is_unset(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")
    tensorflow_env.apply()
    assert os.environ["TF_ENABLE_ONEDNN_OPTS"] == "1"
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS")
    tensorflow_env.apply()
    assert os.environ["TF_ENABLE_ONEDNN_OPTS"] == "0"
