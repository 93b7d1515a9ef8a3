"""What the server benchmarks share about the servers they run: the model they all serve, the
check of an answer against our in-process ``process()``, free ports and readiness, and the
Triton peer (``triton_peer.py`` in its own virtual environment: its server, its tools, stopping
it with everything it started). ``bench_server`` and ``bench_batching`` both use it; neither
imports the other.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks.triton_peer import DEFAULT_VENV

HERE = Path(__file__).resolve().parent
TRITON_PEER = HERE / "triton_peer.py"
MODEL = "ctr"  # the name every server of these benchmarks serves the demo CTR model under
OUTPUTS = ("logits", "probability")  # the outputs compared with our process()


def check_same(what: str, got: dict, want: dict[str, np.ndarray], atol: float = 1e-5) -> float:
    """``got``'s logits and probability allclose (rtol 1e-5, ``atol``) to our process() answer
    ``want``; prints and returns the max abs diff. AssertionError naming ``what`` otherwise."""
    worst = 0.0
    for key in OUTPUTS:
        if key not in got:
            raise AssertionError(f"{what}: no output {key!r} (got {sorted(got)})")
        a, b = np.asarray(got[key], dtype=np.float64).reshape(-1), want[key].reshape(-1)
        if a.shape != b.shape:
            raise AssertionError(f"{what}: {key} has {a.size} values, want {b.size}")
        if not np.allclose(a, b, rtol=1e-5, atol=atol):
            raise AssertionError(f"{what}: {key} differs from our process() (max abs diff "
                                 f"{np.max(np.abs(a - b)):.3g})")
        worst = max(worst, float(np.max(np.abs(a - b), initial=0.0)))
    print(f"  checked {what}: max abs diff {worst:.2g}", flush=True)
    return worst


# --- ports and readiness -------------------------------------------------------------------------

def tfs_grpc_request(feeds) -> bytes:
    """A serialized TF Serving ``PredictRequest`` for ``feeds`` (numbers in ``tensor_content``,
    strings in ``string_val``, as ``tf.make_tensor_proto`` writes them), model MODEL; TF
    Serving's messages without TensorFlow (``server.tfserving.messages``)."""
    from server.tfserving.tensor_proto import from_numpy
    from server.tfserving.messages import messages

    request = messages().PredictRequest()
    request.model_spec.name = MODEL
    for key, array in feeds.items():
        from_numpy(np.asarray(array), request.inputs[key], tensor_content=True)
    return request.SerializeToString()


def free_port() -> int:
    """A TCP port free on the loopback now (the server binding it may still race another)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Poll ``url`` until it answers 200; RuntimeError if ``proc`` exits first, TimeoutError
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout} s")


def post_json(url: str, body: bytes) -> dict:
    """POST a JSON body; the parsed JSON answer (urllib's HTTPError on a non-2xx status)."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


# --- the Triton peer -----------------------------------------------------------------------------

def triton_python(args) -> Path:
    """The Triton venv's python: ``--triton-python``, else the default venv's."""
    return Path(args.triton_python) if args.triton_python else DEFAULT_VENV / "bin" / "python"


@contextlib.contextmanager
def triton_server(tpy: Path, work: Path, env: dict, log_name: str, serve_args: list[str]):
    """``triton_peer.py serve`` (in the Triton venv) on free ports, until its model is ready:
    yields (http port, grpc port); stopped with everything it started afterwards. RuntimeError
    with the log's last error when it does not come up."""
    http_port, grpc_port = free_port(), free_port()
    log = work / log_name
    command = [str(tpy), str(TRITON_PEER), "serve", "--http-port", str(http_port),
               "--grpc-port", str(grpc_port), *serve_args]
    proc = subprocess.Popen(command, cwd=work, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        try:
            wait_http(f"http://127.0.0.1:{http_port}/v2/models/{MODEL}/ready", proc, timeout=240)
        except Exception as exc:
            lines = log.read_text(errors="replace").splitlines() or ["(empty log)"]
            why = next((x for x in reversed(lines) if "Error" in x), lines[-1])
            raise RuntimeError(f"Triton did not start ({exc}; log {log}): {why[-400:]}") from None
        yield http_port, grpc_port
    finally:
        stop_group(proc)


def peer_versions(tpy: Path, env: dict) -> str:
    """"ran: <package> <version>, ..." of the Triton venv."""
    versions = subprocess.run([str(tpy), str(TRITON_PEER), "versions"], capture_output=True,
                              text=True, env=env).stdout
    return "ran: " + ", ".join(f"{k} {v}" for k, v in json.loads(versions).items())


def peer_tool(command: list[str], env: dict, cwd: Path) -> None:
    """Run a triton_peer.py subcommand in the Triton venv; its stderr's end in the error if it fails."""
    out = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"triton_peer.py {command[2]} failed ({out.returncode}): {last[-500:]}")


def _group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is left in process group ``pgid``."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def stop_group(proc: subprocess.Popen) -> None:
    """Stop the peer and everything it started (its own process group).

    SIGTERM makes PyTriton stop its tritonserver and stubs, but a tritonserver can outlive the
    Python process for its exit timeout; the group gets SIGTERM, then SIGKILL after 15 s.
    """
    import signal

    def signal_group(sig) -> None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        signal_group(signal.SIGKILL)
        proc.wait(30)
    signal_group(signal.SIGTERM)
    deadline = time.monotonic() + 15
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _group_alive(proc.pid):
        signal_group(signal.SIGKILL)
