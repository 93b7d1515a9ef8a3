"""Small DLRM-like ONNX models (demo/dlrm_onnx.py) built for tests: one directory per name, each
of its own seed, so that their answers differ."""

from pathlib import Path

from demo import dlrm_onnx


def build_models(base: Path, names=("a", "b")) -> dict[str, Path]:
    """``base/<name>/model.onnx`` for each name (seeds 1, 2, ...); name -> its directory."""
    out = {}
    for seed, name in enumerate(names, start=1):
        dlrm_onnx.build(base / name / "model.onnx", rows=2000, dim=8, seed=seed)
        out[name] = base / name
    return out


FEEDS = dlrm_onnx.inputs(2, seed=3)


def predict(server, model: str):
    """(HTTP status, the ``prob`` output or None) of our wire format's predict of ``FEEDS`` to
    ``model`` on a ``tools.server_process.ServerProcess``."""
    import urllib.error
    import urllib.request

    from processor import codec

    request = urllib.request.Request(server.http + f"/api/predict/{model}", data=codec.encode_request(FEEDS))
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, codec.decode_response(resp.read())["prob"]
    except urllib.error.HTTPError as err:
        return err.code, None
