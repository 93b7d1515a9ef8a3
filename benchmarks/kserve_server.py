"""Peer (b) of bench_server: KServe's Python model server wrapping the same SavedModel.

Runs in its own virtual environment with ``kserve`` and ``tensorflow-cpu`` (KServe pins
``protobuf<7``; this project needs 7). The model is a ``kserve.Model`` as KServe's docs write one:
``load()`` calls ``tf.saved_model.load``; ``predict()`` (synchronous) takes v1 row JSON
(``{"instances": [{input: value}]}``) or a v2 ``InferRequest`` (REST or gRPC) and runs the
``serving_default`` signature. Per-request latency logging is off, as our access log is in the
benchmark.

    <kserve-venv>/bin/python benchmarks/kserve_server.py --savedmodel DIR --model ctr \\
        --http_port 8080 --grpc_port 8081
    <kserve-venv>/bin/python benchmarks/kserve_server.py --make-grpc-request feeds.npz out.bin --model ctr
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _own_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--savedmodel")
    parser.add_argument("--model", default="ctr")
    parser.add_argument("--make-grpc-request", nargs=2, metavar=("FEEDS_NPZ", "OUT"))
    args, rest = parser.parse_known_args()
    sys.argv = [sys.argv[0], *rest]  # kserve parses sys.argv when imported
    return args


ARGS = _own_args()

import numpy as np  # noqa: E402

_DATATYPES = {"float32": "FP32", "float64": "FP64", "int32": "INT32", "int64": "INT64", "bool": "BOOL",
              "object": "BYTES"}


def make_grpc_request(feeds_npz: str, out: str, model: str) -> None:
    """A serialized v2 ModelInferRequest for the feeds (binary tensor contents)."""
    from kserve import InferInput, InferRequest

    feeds = np.load(feeds_npz, allow_pickle=True)
    inputs = []
    for name in feeds.files:
        array = feeds[name]
        item = InferInput(name=name, shape=list(array.shape), datatype=_DATATYPES[str(array.dtype)])
        item.set_data_from_numpy(array, binary_data=True)
        inputs.append(item)
    request = InferRequest(model_name=model, infer_inputs=inputs)
    with open(out, "wb") as f:
        f.write(request.to_grpc().SerializeToString())


def serve(savedmodel: str, name: str) -> None:
    import kserve
    import tensorflow as tf
    from kserve import InferOutput, InferRequest, InferResponse

    class SavedModelPredictor(kserve.Model):
        def __init__(self, model_name: str, path: str) -> None:
            super().__init__(model_name)
            self.path = path
            self.load()

        def load(self) -> bool:
            self.model = tf.saved_model.load(self.path)
            self.infer = self.model.signatures["serving_default"]
            self.specs = self.infer.structured_input_signature[1]
            self.ready = True
            return self.ready

        def predict(self, payload, headers=None):
            if isinstance(payload, InferRequest):
                feeds = {i.name: tf.constant(i.as_numpy(), dtype=self.specs[i.name].dtype) for i in payload.inputs}
                outputs = []
                for key, value in self.infer(**feeds).items():
                    array = value.numpy()
                    out = InferOutput(name=key, shape=list(array.shape), datatype=_DATATYPES[str(array.dtype)])
                    out.set_data_from_numpy(array, binary_data=payload.from_grpc)
                    outputs.append(out)
                return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=outputs)
            rows = payload["instances"]
            feeds = {key: tf.constant(np.asarray([row[key] for row in rows]), dtype=spec.dtype)
                     for key, spec in self.specs.items()}
            outputs = {key: value.numpy() for key, value in self.infer(**feeds).items()}
            return {"predictions": [{key: value[i].tolist() for key, value in outputs.items()}
                                    for i in range(len(rows))]}

    kserve.ModelServer(enable_grpc=True, enable_latency_logging=False).start(
        [SavedModelPredictor(name, savedmodel)])


if __name__ == "__main__":
    if ARGS.make_grpc_request:
        make_grpc_request(*ARGS.make_grpc_request, ARGS.model)
    else:
        serve(ARGS.savedmodel, ARGS.model)
