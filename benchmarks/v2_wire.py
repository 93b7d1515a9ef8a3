"""The Open Inference Protocol (KServe v2) as the server benchmarks speak it, by hand: request
bodies (REST JSON, REST with binary tensors, gRPC ``ModelInferRequest``) built from numpy feeds,
and the numeric outputs read back from any server's answer (``v2_http``, ``v2_grpc``: the check
of every v2 row against our ``process()``). Written by hand because tritonclient lives only in
the Triton venv and KServe's request builder only in the KServe venv.
"""

from __future__ import annotations

import json
import struct
import urllib.request

import numpy as np

from benchmarks.peers import MODEL

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
HEADER_LENGTH = "Inference-Header-Content-Length"
DATATYPES = {"float32": "FP32", "float64": "FP64", "int32": "INT32", "int64": "INT64", "uint64": "UINT64",
             "bool": "BOOL", "object": "BYTES"}
NUMPY_TYPES = {v: k for k, v in DATATYPES.items() if k != "object"}


# --- requests ------------------------------------------------------------------------------------

def raw_tensor(array: np.ndarray) -> bytes:
    """A tensor's raw contents in the v2 binary layout (BYTES: 4-byte LE length, then the bytes)."""
    if array.dtype == object:
        return b"".join(struct.pack("<I", len(v)) + v for v in array.reshape(-1))
    return np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()


def v2_json_request(feeds) -> bytes:
    """KServe v2 REST JSON, as KServe's and Triton's clients send it (flat ``data``, outputs JSON)."""
    inputs = []
    for name, array in feeds.items():
        flat = array.reshape(-1)
        data = [v.decode() for v in flat] if array.dtype == object else flat.tolist()
        inputs.append({"name": name, "shape": list(array.shape), "datatype": DATATYPES[str(array.dtype)],
                       "data": data})
    return json.dumps({"inputs": inputs}).encode()


def v2_binary_request(feeds) -> tuple[bytes, int]:
    """KServe v2 REST with the binary tensor extension: inputs and outputs binary."""
    header, blobs = [], []
    for name, array in feeds.items():
        raw = raw_tensor(array)
        header.append({"name": name, "shape": list(array.shape), "datatype": DATATYPES[str(array.dtype)],
                       "parameters": {"binary_data_size": len(raw)}})
        blobs.append(raw)
    doc = json.dumps({"inputs": header, "parameters": {"binary_data_output": True}}).encode()
    return doc + b"".join(blobs), len(doc)


def v2_grpc_request(feeds) -> bytes:
    """A serialized ``inference.ModelInferRequest`` with ``raw_input_contents``."""
    from processor.proto import grpc_predict_v2_pb2 as pb

    request = pb.ModelInferRequest(model_name=MODEL)
    for name, array in feeds.items():
        request.inputs.add(name=name, datatype=DATATYPES[str(array.dtype)], shape=list(array.shape))
        request.raw_input_contents.append(raw_tensor(array))
    return request.SerializeToString()


# --- answers -------------------------------------------------------------------------------------

def v2_http(url: str, body: bytes, header_length: int | None = None) -> dict[str, np.ndarray]:
    """POST a v2 infer body; the numeric outputs (JSON ``data`` or binary) by name."""
    headers = {"Content-Type": "application/json"}
    if header_length is not None:
        headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(header_length)}
    with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=60) as resp:
        raw = resp.read()
        n = resp.headers.get(HEADER_LENGTH)
    n = int(n) if n is not None else len(raw)
    doc, at, out = json.loads(raw[:n]), n, {}
    for tensor in doc["outputs"]:
        dtype = np.dtype(NUMPY_TYPES[tensor["datatype"]])
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            out[tensor["name"]] = np.frombuffer(raw[at:at + size], dtype.newbyteorder("<")).reshape(tensor["shape"])
            at += size
        else:
            out[tensor["name"]] = np.asarray(tensor["data"], dtype).reshape(tensor["shape"])
    return out


def v2_grpc(target: str, body: bytes) -> dict[str, np.ndarray]:
    """Send serialized ModelInferRequest bytes; the numeric outputs (raw or typed contents) by name."""
    import grpc

    from processor.proto import grpc_predict_v2_pb2 as pb

    with grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", -1),
                                                ("grpc.max_send_message_length", -1)]) as channel:
        raw = channel.unary_unary(MODEL_INFER)(body, timeout=60)
    response = pb.ModelInferResponse.FromString(raw)
    out = {}
    for i, tensor in enumerate(response.outputs):
        dtype = np.dtype(NUMPY_TYPES[tensor.datatype])
        if response.raw_output_contents:
            array = np.frombuffer(response.raw_output_contents[i], dtype.newbyteorder("<"))
        else:
            field = {"FP32": "fp32_contents", "FP64": "fp64_contents", "INT64": "int64_contents",
                     "INT32": "int_contents"}[tensor.datatype]
            array = np.asarray(getattr(tensor.contents, field), dtype)
        out[tensor.name] = array.reshape(tuple(tensor.shape))
    return out
