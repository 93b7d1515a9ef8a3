"""What the server benchmarks (``bench_server``, ``bench_tls``) share: the load generator's run,
the demo model's request bodies for every protocol, our in-process answers to them and the check
of a server's answer against those."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import numpy as np

from benchmarks.common import loadgen_command
from benchmarks.peers import OUTPUTS, tfs_grpc_request
from benchmarks.v2_wire import v2_binary_request, v2_grpc_request, v2_json_request

ROOT = Path(__file__).resolve().parent.parent
BATCHES = (1, 256)


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The model preset and the load generator's settings, as every server benchmark takes them."""
    parser.add_argument("--preset", default="small", choices=["small", "full"])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batches", type=lambda s: tuple(int(x) for x in s.split(",")), default=BATCHES)


def run_loadgen(spec: dict, workdir: Path) -> dict:
    spec_file = workdir / "loadgen.json"
    spec_file.write_text(json.dumps(spec))
    out = subprocess.run(loadgen_command(spec_file),
                         cwd=ROOT, capture_output=True, text=True,
                         timeout=spec["seconds"] + spec["warmup_seconds"] + 120)
    if out.returncode != 0:
        raise RuntimeError(f"load generator failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- payloads ------------------------------------------------------------------------------------

def payloads(batch: int, workdir: Path) -> dict:
    """Request bodies for every protocol, written once per batch size (paths; ``v2_binary_header``:
    the JSON header's length of the v2 binary body)."""
    from demo.synthetic_data import synthetic_batch
    from processor import codec
    from processor.engine.string_hash import fingerprint

    feeds = synthetic_batch(batch, seed=7)
    rows = [{"dense": feeds["dense"][i].tolist(), "sparse_ids": feeds["sparse_ids"][i].tolist(),
             "sparse_tokens": [t.decode() for t in feeds["sparse_tokens"][i]]} for i in range(batch)]
    v2_binary, header_length = v2_binary_request(feeds)
    files = {
        "eas": codec.encode_request(feeds),
        "tfs_json": json.dumps({"instances": rows}).encode(),
        "tfs_grpc": tfs_grpc_request(feeds),
        "kserve_v1": json.dumps({"instances": rows}).encode(),
        "v2_json": v2_json_request(feeds),
        "v2_binary": v2_binary,
        "v2_grpc": v2_grpc_request(feeds),
    }
    out: dict = {}
    for key, data in files.items():
        path = workdir / f"{key}-{batch}.bin"
        path.write_bytes(data)
        out[key] = path
    out["v2_binary_header"] = header_length
    out["npz"] = workdir / f"feeds-{batch}.npz"  # for KServe's own request builder
    np.savez(out["npz"], **feeds)
    # Triton's inputs: the ONNX graph's own, the string feature as TensorFlow's 64-bit fingerprints
    out["peer_npz"] = workdir / f"peer-feeds-{batch}.npz"
    np.savez(out["peer_npz"], **{k: (fingerprint(v) if v.dtype == object else v) for k, v in feeds.items()})
    return out


def process_answers(config: dict, bodies: dict, name: str) -> tuple[dict, dict]:
    """Our in-process ``Processor.process()`` answers per batch (logits, probability as float64) and
    the model's description (its ``cache`` entry for onnxruntime: the ONNX file Triton serves)."""
    from processor import codec
    from processor.processor import Processor

    proc = Processor.create(name, json.dumps(config))
    try:
        answers = {}
        for batch, body in bodies.items():
            status, raw = proc.process(body["eas"].read_bytes())
            if status != 200:
                raise RuntimeError(f"process() answered {status}: {raw[:300]!r}")
            decoded = codec.decode_response(raw)
            answers[batch] = {k: np.asarray(decoded[k], dtype=np.float64) for k in OUTPUTS}
        with proc.manager.acquire() as group:
            model = group.describe().get("model", {})
    finally:
        proc.close()
    return answers, model


def check_probabilities(name: str, got, want: np.ndarray) -> None:
    got = np.asarray(got, dtype=np.float64).reshape(want.shape)
    if not np.allclose(got, want, rtol=1e-4, atol=1e-6):
        raise AssertionError(f"{name}: predictions differ from ours (max abs diff "
                             f"{np.max(np.abs(got - want)):.3g})")
