"""TF Serving's Classify, Regress, MultiInference and Predict through the official
``tensorflow-serving-api`` stubs, against a real server (``python -m server``) serving an
Estimator-shaped export (``tests/models/estimator_like.py``): serialized ``tf.Example``s in
``ExampleList`` and ``ExampleListWithContext`` give what TensorFlow's own run of the same
SavedModel gives on the merged examples (merged here with protobuf's ``MergeFrom``, not the
server's byte concatenation); several signatures of one model answer side by side (concurrently
too); Predict's outputs are in the typed fields unless ``enable_serialization_as_tensor_content``;
shapes are left to the graph; a missing signature gets TF Serving's code and words.
"""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from sp_checks import assert_outputs_close

TIMEOUT = 30


def example(**features):
    import tensorflow as tf

    ex = tf.train.Example()
    for name, value in features.items():
        feature = ex.features.feature[name]
        if isinstance(value, float):
            feature.float_list.value.append(value)
        else:
            feature.int64_list.value.append(value)
    return ex


CONTEXT = {"user_age": 31.0, "user_group": 2}
ITEMS = [{"item_price": 1.5, "item_id": 7}, {"item_price": 0.25, "item_id": 1234},
         {"item_price": 3.0, "item_id": 5, "user_group": 4}]  # the last overrides a context feature


def merged() -> list[bytes]:
    """Each item merged into the context as TF Serving means it: the item's value wins."""
    out = []
    for item in ITEMS:
        ex = example(**CONTEXT)
        for name in item:
            if name in ex.features.feature:
                del ex.features.feature[name]
        ex.MergeFrom(example(**item))
        out.append(ex.SerializeToString())
    return out


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    from models.estimator_like import export

    base = tmp_path_factory.mktemp("estimator") / "ranker"
    return export(base)


@pytest.fixture(scope="module")
def server(export, tmp_path_factory):
    from tools.server_process import ServerProcess

    config = {"savedmodel_dir": str(export.parent)}
    deployment = {"models": [
        {"name": "ranker", "model_config": config},
        {"name": "ranker_content", "model_config": {**config, "enable_serialization_as_tensor_content": True,
                                                    "signature_name": "predict"}},
        {"name": "batched", "model_config": {**config, "batching": {"max_batch_size": 16,
                                                                    "batch_timeout_micros": 2000}}},
    ], "access_log": False}
    proc = ServerProcess(deployment, tmp_path_factory.mktemp("server")).start(timeout=180)
    assert set(proc.wait_models(120).values()) == {"ready"}, proc.log()
    yield proc
    assert proc.stop(timeout=30) == 0, proc.log()


@pytest.fixture(scope="module")
def stub(server):
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    with grpc.insecure_channel(server.grpc_target) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def fill_input(request, with_context: bool) -> None:
    if with_context:
        listed = request.input.example_list_with_context
        listed.context.CopyFrom(example(**CONTEXT))
        for item in ITEMS:
            listed.examples.add().CopyFrom(example(**item))
    else:
        for data in merged():
            request.input.example_list.examples.add().ParseFromString(data)


@pytest.mark.parametrize("with_context", [False, True], ids=["ExampleList", "ExampleListWithContext"])
@pytest.mark.parametrize("model", ["ranker", "batched"])
def test_classify_regress_multi_equal_tensorflow(stub, export, with_context, model):
    from tensorflow_serving.apis import classification_pb2, inference_pb2, regression_pb2

    from models.estimator_like import run_tensorflow

    reference = run_tensorflow(export, merged(), "classification")
    want_p1 = run_tensorflow(export, merged(), "regression")["outputs"]

    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "classification"
    fill_input(request, with_context)
    result = stub.Classify(request, TIMEOUT)
    scores = np.array([[c.score for c in item.classes] for item in result.result.classifications], np.float32)
    labels = [[c.label for c in item.classes] for item in result.result.classifications]
    assert_outputs_close({"scores": scores}, {"scores": reference["scores"]})
    assert labels == [["0", "1"]] * len(ITEMS)
    assert (result.model_spec.name, result.model_spec.signature_name, result.model_spec.version.value) == \
        (model, "classification", 1)

    request = regression_pb2.RegressionRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "regression"
    fill_input(request, with_context)
    values = np.array([r.value for r in stub.Regress(request, TIMEOUT).result.regressions], np.float32)
    assert_outputs_close({"p": values}, {"p": want_p1.ravel()})

    request = inference_pb2.MultiInferenceRequest()
    for name, method in (("classification", "classify"), ("regression", "regress")):
        task = request.tasks.add(method_name=f"tensorflow/serving/{method}")
        task.model_spec.name = model
        task.model_spec.signature_name = name
    fill_input(request, with_context)
    multi = stub.MultiInference(request, TIMEOUT)
    got = np.array([[c.score for c in item.classes] for item in multi.results[0].classification_result.classifications],
                   np.float32)
    assert_outputs_close({"scores": got}, {"scores": reference["scores"]})
    got = np.array([r.value for r in multi.results[1].regression_result.regressions], np.float32)
    assert_outputs_close({"p": got}, {"p": want_p1.ravel()})


def test_empty_signature_name_is_the_models_default(stub, export):
    from tensorflow_serving.apis import classification_pb2

    from models.estimator_like import run_tensorflow

    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "ranker"  # no signature_name: serving_default, a classification here
    fill_input(request, True)
    result = stub.Classify(request, TIMEOUT)
    got = np.array([[c.score for c in item.classes] for item in result.result.classifications], np.float32)
    assert_outputs_close({"s": got}, {"s": run_tensorflow(export, merged(), "serving_default")["scores"]})
    assert result.model_spec.signature_name == ""  # as given, as TF Serving answers


def predict_request(model, signature, serialized, content=False):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    request.inputs["examples"].CopyFrom(tf.make_tensor_proto(np.array(serialized, dtype=object)))
    return request


def test_predict_signature_typed_fields_and_tensor_content(stub, export):
    import tensorflow as tf

    from models.estimator_like import run_tensorflow

    want = run_tensorflow(export, merged(), "predict")
    typed = stub.Predict(predict_request("ranker", "predict", merged()), TIMEOUT)
    assert typed.model_spec.signature_name == "predict" and typed.model_spec.version.value == 1
    assert len(typed.outputs["probabilities"].float_val) == 2 * len(ITEMS)
    assert not typed.outputs["probabilities"].tensor_content
    assert list(typed.outputs["class_ids"].int64_val) == want["class_ids"].ravel().tolist()
    assert_outputs_close({k: tf.make_ndarray(v) for k, v in typed.outputs.items()}, want)

    # the model whose default signature is "predict" and that writes tensor_content
    content = stub.Predict(predict_request("ranker_content", "", merged()), TIMEOUT)
    assert content.model_spec.signature_name == "predict"
    assert content.outputs["probabilities"].tensor_content and not content.outputs["probabilities"].float_val
    assert_outputs_close({k: tf.make_ndarray(v) for k, v in content.outputs.items()}, want)


def test_signatures_side_by_side_concurrently(stub, export):
    from tensorflow_serving.apis import regression_pb2

    from models.estimator_like import run_tensorflow

    want_p1 = run_tensorflow(export, merged(), "regression")["outputs"].ravel()
    want_logits = run_tensorflow(export, merged(), "predict")["logits"]

    def regress(_):
        request = regression_pb2.RegressionRequest()
        request.model_spec.name = "batched"
        request.model_spec.signature_name = "regression"
        fill_input(request, True)
        return np.array([r.value for r in stub.Regress(request, TIMEOUT).result.regressions], np.float32)

    def predict(_):
        import tensorflow as tf

        response = stub.Predict(predict_request("batched", "predict", merged()), TIMEOUT)
        return tf.make_ndarray(response.outputs["logits"])

    with ThreadPoolExecutor(8) as pool:
        regressions = list(pool.map(regress, range(24)))
        logits = list(pool.map(predict, range(24)))
    for got in regressions:
        assert_outputs_close({"p": got}, {"p": want_p1})
    for got in logits:
        assert_outputs_close({"l": got}, {"l": want_logits})


def test_metadata_lists_every_signature(server, stub):
    from tensorflow_serving.apis import get_model_metadata_pb2

    response = stub.GetModelMetadata(get_model_metadata_pb2.GetModelMetadataRequest(
        model_spec={"name": "ranker"}, metadata_field=["signature_def"]), TIMEOUT)
    sig_map = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(sig_map)
    assert set(sig_map.signature_def) == {"serving_default", "classification", "regression", "predict", "ranking"}
    with urllib.request.urlopen(f"{server.http}/v1/models/ranker/metadata", timeout=TIMEOUT) as resp:
        doc = json.loads(resp.read())
    assert set(doc["metadata"]["signature_def"]["signature_def"]) == set(sig_map.signature_def)


def test_missing_signature_and_bad_inputs_with_tf_serving_codes(stub):
    from tensorflow_serving.apis import classification_pb2, regression_pb2

    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(predict_request("ranker", "nope", merged()), TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details().startswith('Serving signature key "nope" not found.')

    request = classification_pb2.ClassificationRequest(model_spec={"name": "ranker", "signature_name": "nope"})
    request.input.example_list.examples.add().CopyFrom(example(**ITEMS[0]))
    with pytest.raises(grpc.RpcError) as caught:
        stub.Classify(request, TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "No signature was found with the name: nope"

    request = regression_pb2.RegressionRequest(model_spec={"name": "ranker", "signature_name": "regression"})
    with pytest.raises(grpc.RpcError) as caught:
        stub.Regress(request, TIMEOUT)
    assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "Input is empty.")

    # Regress on a signature with several outputs, Classify's shape check
    request = regression_pb2.RegressionRequest(model_spec={"name": "ranker", "signature_name": "predict"})
    request.input.example_list.examples.add().CopyFrom(example(**ITEMS[0]))
    with pytest.raises(grpc.RpcError) as caught:
        stub.Regress(request, TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "Expected one output Tensor" in \
        caught.value.details()

    # a shape the graph cannot take: the engine's own refusal, still INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(predict_request("ranker", "predict", [merged()]), TIMEOUT)  # rank 2 for [None]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # the server still serves
    assert len(stub.Predict(predict_request("ranker", "predict", merged()), TIMEOUT).outputs) == 3


def test_rest_classify_regress_with_context(server, export):
    from models.estimator_like import run_tensorflow

    body = {"signature_name": "classification", "context": CONTEXT,
            "examples": [dict(item) for item in ITEMS]}
    request = urllib.request.Request(f"{server.http}/v1/models/ranker:classify", data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=TIMEOUT) as resp:
        doc = json.loads(resp.read())
    want = run_tensorflow(export, merged(), "classification")["scores"]
    assert [[c[0] for c in row] for row in doc["results"]] == [["0", "1"]] * len(ITEMS)
    got = np.array([[c[1] for c in row] for row in doc["results"]], np.float32)
    assert_outputs_close({"s": got}, {"s": want})

    body["signature_name"] = "regression"
    request = urllib.request.Request(f"{server.http}/v1/models/ranker:regress", data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=TIMEOUT) as resp:
        got = np.array(json.loads(resp.read())["results"], np.float32)
    assert_outputs_close({"p": got}, {"p": run_tensorflow(export, merged(), "regression")["outputs"].ravel()})


def test_new_calls_counted_like_predict(server, stub):
    """Metrics count Classify / Regress / MultiInference (gRPC and REST) as they count Predict."""
    from tensorflow_serving.apis import classification_pb2, inference_pb2, regression_pb2

    for make, call in ((classification_pb2.ClassificationRequest, stub.Classify),
                       (regression_pb2.RegressionRequest, stub.Regress)):
        request = make(model_spec={"name": "ranker", "signature_name": "regression" if call == stub.Regress else ""})
        fill_input(request, True)
        call(request, TIMEOUT)
    request = inference_pb2.MultiInferenceRequest()
    request.tasks.add(model_spec={"name": "ranker", "signature_name": "regression"},
                      method_name="tensorflow/serving/regress")
    fill_input(request, True)
    stub.MultiInference(request, TIMEOUT)
    for method, signature in (("classify", "classification"), ("regress", "regression")):
        body = json.dumps({"signature_name": signature, "examples": [dict(ITEMS[0])]}).encode()
        with urllib.request.urlopen(urllib.request.Request(f"{server.http}/v1/models/ranker:{method}", data=body),
                                    timeout=TIMEOUT) as resp:
            assert resp.status == 200
    with urllib.request.urlopen(f"{server.http}/metrics", timeout=TIMEOUT) as resp:
        text = resp.read().decode()
    for protocol, api in (("grpc", "tfs_classify"), ("grpc", "tfs_regress"), ("grpc", "tfs_multi_inference"),
                          ("http", "tfs_classify"), ("http", "tfs_regress")):
        assert any(f'protocol="{protocol}"' in line and f'api="{api}"' in line and 'model="ranker"' in line
                   for line in text.splitlines() if line.startswith("sp_requests")), (protocol, api)


def test_a_predict_signature_over_examples_takes_context(stub, export):
    """Beyond TF Serving: Regress and Classify on a predict signature whose one input is the
    serialized examples (any alias) and whose one output is the score."""
    from tensorflow_serving.apis import classification_pb2, regression_pb2

    from models.estimator_like import run_tensorflow

    want = run_tensorflow(export, merged(), "ranking")["probability"]
    request = regression_pb2.RegressionRequest(model_spec={"name": "ranker", "signature_name": "ranking"})
    fill_input(request, True)
    got = np.array([r.value for r in stub.Regress(request, TIMEOUT).result.regressions], np.float32)
    assert_outputs_close({"p": got}, {"p": want.ravel()})
    request = classification_pb2.ClassificationRequest(model_spec={"name": "ranker", "signature_name": "ranking"})
    fill_input(request, True)
    result = stub.Classify(request, TIMEOUT)
    got = np.array([[c.score for c in item.classes] for item in result.result.classifications], np.float32)
    assert_outputs_close({"p": got}, {"p": want})
    assert all(c.label == "" for item in result.result.classifications for c in item.classes)
