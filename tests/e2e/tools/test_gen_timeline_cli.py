"""tools/timeline/gen_timeline.py run as a script (a subprocess), on a hand-made StepStats file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from unit.tools.timeline_helpers import check_chrome_trace, write_timeline

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def timeline_file(tmp_path) -> Path:
    return write_timeline(tmp_path)


def test_cli_converts_and_summarizes(timeline_file, tmp_path):
    out = tmp_path / "out.json"
    script = REPO / "tools" / "timeline" / "gen_timeline.py"
    done = subprocess.run([sys.executable, str(script), "-s", str(timeline_file), str(out)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    check_chrome_trace(json.loads(out.read_text()))
    assert done.stdout.splitlines()[3].split()[1] == "dense/MatMul"  # first row of the op table
    # the tool does not need TensorFlow
    probe = ("import sys, runpy; sys.argv = ['gen_timeline', %r, %r]; "
             "sys.modules['tensorflow'] = None\n"
             "try:\n    runpy.run_path(%r, run_name='__main__')\nexcept SystemExit as e:\n    assert e.code == 0\n"
             "assert 'tensorflow' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]"
             % (str(timeline_file), str(tmp_path / "b.json"), str(script)))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
