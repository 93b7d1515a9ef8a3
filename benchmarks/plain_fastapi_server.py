"""Peer (a) of bench_server: the FastAPI + TensorFlow server a user would write by hand.

Loads the SavedModel with ``tf.saved_model.load``, calls its ``serving_default`` signature, speaks
TF Serving's row JSON (``{"instances": [{input: value}, ...]}`` -> ``{"predictions": [...]}``).
The endpoint is a plain ``def``, so FastAPI runs it on its thread pool, as most such servers do.

    python benchmarks/plain_fastapi_server.py --savedmodel DIR --port 8601
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import uvicorn  # noqa: E402
from fastapi import FastAPI  # noqa: E402


def create_app(savedmodel_dir: str) -> FastAPI:
    model = tf.saved_model.load(savedmodel_dir)
    infer = model.signatures["serving_default"]
    specs = infer.structured_input_signature[1]
    app = FastAPI()

    @app.get("/health")
    def health() -> dict:
        return {"ok": True}

    @app.post("/v1/models/{name}:predict")
    def predict(name: str, body: dict) -> dict:
        rows = body["instances"]
        feeds = {key: tf.constant(np.asarray([row[key] for row in rows]), dtype=spec.dtype)
                 for key, spec in specs.items()}
        outputs = {key: value.numpy() for key, value in infer(**feeds).items()}
        return {"predictions": [{key: value[i].tolist() for key, value in outputs.items()}
                                for i in range(len(rows))]}

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--savedmodel", required=True)
    parser.add_argument("--port", type=int, default=8601)
    args = parser.parse_args()
    uvicorn.run(create_app(args.savedmodel), host="127.0.0.1", port=args.port, access_log=False,
                log_level="warning")


if __name__ == "__main__":
    main()
