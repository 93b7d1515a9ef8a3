"""TF Serving's own end-to-end tests, ported: ``tensorflow_serving/model_servers/
tensorflow_model_server_test.py`` (with its base, ``test_util/tensorflow_model_server_test_base.py``)
and ``http_rest_api_handler_test.cc`` of https://github.com/tensorflow/serving (Apache License
2.0), run against our server (``python -m server``) on TF Serving base directories.

Same inputs, expected values and assertions (their names kept, as ``test_<TheirName>``). The
test models are rebuilt as TF Serving builds them (``tests/models/half_plus_two.py``, a port of
its ``saved_model_half_plus_two.py``): ``saved_model_half_plus_two_cpu`` and
``saved_model_half_plus_two_tf2_cpu`` (version 123), ``saved_model_half_plus_two_2_versions``
(123 and 124; the handler test serves 123 with the label ``Version_Label``) and
``saved_model_half_plus_three`` (the same graph with ``b = 3``: TF Serving checks in an older
export whose script is gone).

Adapted, not changed in what they check:

* TF Serving starts one server per (model name, path); here one server serves them all, each
  under its own name ("default" is the TF1 model; the TF2 one is "default_tf2"; the keras-free
  ``tf.saved_model`` exports "saved_model_save" and "saved_model_save_multi"), so the request
  names and the expected ``model_spec.name`` are those names.
* Its ``--model_config_file`` (text ``ModelServerConfig``) is our deployment file: the
  two-model config of ``testGoodModelConfig`` is two entries of the deployment.
* The metadata files (``half_plus_two_model_metadata.json``,
  ``saved_model_half_plus_two_2_versions_metadata.json``) are TF Serving's, with one difference
  of the rebuilt model, not of the server: today's TensorFlow writes the ``tf_example``
  placeholder (``shape=[None]``) as one unknown dimension where the checked-in export says
  unknown rank. The expected documents are built from TF Serving's with that one field changed.
* ``WaitForServerReady`` (a Predict of a missing model until the error says "Servable") is run
  as TF Serving runs it, after our own readiness wait.
* The C++ handler test's calls of ``ProcessRequest`` are HTTP requests; its status classes are
  our HTTP statuses (InvalidArgument / FailedPrecondition 400, NotFound 404).

Not ported (features we do not serve), with the reason:

* ``testBadModelConfig``, ``testModelConfigReload``, ``testModelConfigReloadWithZeroPollPeriod``,
  ``testGoodGrpcChannelArgs``, ``testPredictUDS``: they need TF Serving's command line
  (``--model_config_file`` and its polling, ``--grpc_channel_arguments``,
  ``--grpc_socket_path``): ported in ``tests/e2e/test_tfserving_cli.py``, against
  ``tensorflow_model_server`` (``server/tfserving/cli.py``) started with TF Serving's own command lines.
* ``testPredictOnTfLite``, ``testPredictWithSignatureDefOnTfLite``: TF Lite models.
* ``test_profiler_service_with_valid_trace_request``: it needs ``--enable_profiler`` (on in TF
  Serving, off in our deployment files): ported in ``tests/e2e/test_tfserving_profiler.py``,
  against ``tensorflow_model_server``.
* ``test_tf_text``: its ``tf_text_regression`` model needs the tensorflow-text ops, not installed
  (``custom_op_libraries`` loads such libraries: ``test_tfserving_custom_ops.py``).
* ``test_sequential_keras_saved_model_save``, ``test_distrat_sequential_keras_saved_model_save``:
  ``tf.saved_model.save`` of a Keras model; with TensorFlow 2.16+ that is Keras 3, whose
  ``tf.saved_model.save`` export reads variables nothing restores (refused with a ConfigError
  naming ``model.export()``, ``tests/integration/test_keras3_exports.py``); the tf_keras these
  tests were written for is not installed.
* ``_TestBadModel`` is a helper TF Serving itself does not run; ``kPathRegex`` checks a C++
  constant.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request

import grpc
import pytest

RPC_TIMEOUT = 20.0
DEFAULT_SERVING_SIGNATURE_DEF_KEY = "serving_default"
TEST_MODEL_NAME = "saved_model_half_plus_two_2_versions"
TEST_MODEL_VERSION1 = 123
TEST_MODEL_VERSION_LABEL = "Version_Label"
NONEXISTENT_MODEL_VERSION_LABEL = "Version_Nonexistent"


# --- the models and the server ------------------------------------------------------------------

@pytest.fixture(scope="module")
def testdata(tmp_path_factory):
    """TF Serving's testdata directory, its models rebuilt (see the module doc)."""
    import tensorflow as tf

    from models.half_plus_two import export_tf1, export_tf2

    root = tmp_path_factory.mktemp("testdata")
    export_tf1(root / "saved_model_half_plus_two_cpu")
    export_tf2(root / "saved_model_half_plus_two_tf2_cpu")
    export_tf1(root / "saved_model_half_plus_three", b=3.0)
    two = root / TEST_MODEL_NAME
    shutil.copytree(root / "saved_model_half_plus_two_cpu" / "00000123", two / "00000123")
    shutil.copytree(root / "saved_model_half_plus_two_cpu" / "00000123", two / "00000124")

    # test_tf_saved_model_save
    base = root / "tf_saved_model_save"
    r = tf.train.Checkpoint()
    r.v1 = tf.Variable(3.)
    r.v2 = tf.Variable(2.)
    r.f = tf.function(lambda x: {"y": r.v1 * r.v2 * x})
    to_save = r.f.get_concrete_function(tf.TensorSpec(None, tf.float32))
    tf.saved_model.save(r, str(base / "00000123"), to_save)

    # test_tf_saved_model_save_multiple_signatures
    base = root / "tf_saved_model_save_multi"
    m = tf.train.Checkpoint()
    m.f = tf.function(lambda x: {"y": 1.}, input_signature=[tf.TensorSpec(None, tf.float32)])
    m.g = tf.function(lambda x: {"y": 2.}, input_signature=[tf.TensorSpec(None, tf.float32)])
    tf.saved_model.save(m, str(base / "00000123"),
                        signatures={DEFAULT_SERVING_SIGNATURE_DEF_KEY: m.f, "custom_signature_key": m.g})
    return root


@pytest.fixture(scope="module")
def server(testdata, tmp_path_factory):
    from tools.server_process import ServerProcess

    def entry(name, path, **extra):
        config = {"savedmodel_dir": str(testdata / path), "session_num": 1}
        config.update(extra.pop("model_config", {}))
        return {"name": name, "model_config": config, **extra}

    deployment = {"models": [
        entry("default", "saved_model_half_plus_two_cpu"),
        entry("default_tf2", "saved_model_half_plus_two_tf2_cpu"),
        entry("half_plus_two", "saved_model_half_plus_two_cpu"),
        entry("half_plus_three", "saved_model_half_plus_three"),
        entry(TEST_MODEL_NAME, TEST_MODEL_NAME, model_config={"restore_model_version": TEST_MODEL_VERSION1},
              version_labels={TEST_MODEL_VERSION_LABEL: TEST_MODEL_VERSION1}),
        entry("saved_model_save", "tf_saved_model_save"),
        entry("saved_model_save_multi", "tf_saved_model_save_multi"),
    ], "access_log": False}
    proc = ServerProcess(deployment, tmp_path_factory.mktemp("server")).start(timeout=240)
    states = proc.wait_models(180)
    assert set(states.values()) == {"ready"}, (states, proc.log())
    wait_for_server_ready(proc.grpc_target)
    yield proc
    assert proc.stop(timeout=30) == 0, proc.log()


# --- TF Serving's test base, ported -------------------------------------------------------------

def wait_for_server_ready(target: str) -> None:
    """``WaitForServerReady``: a Predict of a missing model until the error says "Servable"."""
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "intentionally_missing_model"
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(request, RPC_TIMEOUT)
    assert "Servable" in caught.value.details()


def call_rest(url: str, req) -> bytes:
    """``CallREST`` (one attempt: the server is ready): the response body; raises on an error."""
    json_data = json.dumps(req).encode("utf-8") if req is not None else None
    with urllib.request.urlopen(urllib.request.Request(url, data=json_data), timeout=RPC_TIMEOUT) as resp:
        return resp.read()


def sorted_object(obj):
    """``SortedObject``."""
    if isinstance(obj, dict):
        return sorted((k, sorted_object(v)) for k, v in obj.items())
    if isinstance(obj, list):
        return sorted(sorted_object(x) for x in obj)
    if isinstance(obj, tuple):
        return list(sorted(sorted_object(x) for x in obj))
    return obj


def verify_model_spec(actual_model_spec, exp_model_name, exp_signature_name, exp_version):
    """``_VerifyModelSpec``."""
    assert actual_model_spec.name == exp_model_name
    assert actual_model_spec.signature_name == exp_signature_name
    assert actual_model_spec.version.value == exp_version


def verify_predict_request(model_server_address, expected_output, expected_version, model_name="default",
                           specify_output=True, batch_input=False,
                           signature_name=DEFAULT_SERVING_SIGNATURE_DEF_KEY, rpc_timeout=RPC_TIMEOUT):
    """``VerifyPredictRequest``."""
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature_name
    request.inputs["x"].dtype = types_pb2.DT_FLOAT
    request.inputs["x"].float_val.append(2.0)
    dim = request.inputs["x"].tensor_shape.dim.add()
    dim.size = 1
    if batch_input:
        request.inputs["x"].tensor_shape.dim.add().size = 1
    if specify_output:
        request.output_filter.append("y")
    with grpc.insecure_channel(model_server_address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        result = stub.Predict(request, rpc_timeout)
    assert "y" in result.outputs
    assert types_pb2.DT_FLOAT == result.outputs["y"].dtype
    assert 1 == len(result.outputs["y"].float_val)
    assert expected_output == result.outputs["y"].float_val[0]
    verify_model_spec(result.model_spec, request.model_spec.name, signature_name, expected_version)


def expected_metadata(name: str, version: str) -> dict:
    """TF Serving's metadata file for the half_plus_two export (see the module doc)."""
    shape_of = {"dim": [{"size": "-1", "name": ""}, {"size": "1", "name": ""}], "unknown_rank": False}

    def info(name, dtype="DT_FLOAT", shape=shape_of):
        return {"dtype": dtype, "tensor_shape": shape, "name": name}

    # TF Serving's file: {"dim": [], "unknown_rank": true}; today's TensorFlow: one free dimension
    examples = info("tf_example:0", "DT_STRING", {"dim": [{"size": "-1", "name": ""}], "unknown_rank": False})

    def sig(inputs, outputs, method):
        return {"inputs": inputs, "outputs": outputs, "method_name": f"tensorflow/serving/{method}",
                "defaults": {}}

    return {"model_spec": {"name": name, "signature_name": "", "version": version},
            "metadata": {"signature_def": {"signature_def": {
                "regress_x2_to_y3": sig({"inputs": info("x2:0")}, {"outputs": info("y3:0")}, "regress"),
                "serving_default": sig({"x": info("x:0")}, {"y": info("y:0")}, "predict"),
                "classify_x_to_y": sig({"inputs": examples}, {"scores": info("y:0")}, "classify"),
                "regress_x_to_y2": sig({"inputs": examples}, {"outputs": info("y2:0")}, "regress"),
                "regress_x_to_y": sig({"inputs": examples}, {"outputs": info("y:0")}, "regress"),
            }}}}


# --- tensorflow_model_server_test.py --------------------------------------------------------------

def test_testGetModelStatus(server):
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "default"
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        result = stub.GetModelStatus(request, RPC_TIMEOUT)
    assert 1 == len(result.model_version_status)
    assert 123 == result.model_version_status[0].version
    assert 0 == result.model_version_status[0].status.error_code


def test_testGetModelMetadata(server):
    from tensorflow_serving.apis import get_model_metadata_pb2, prediction_service_pb2_grpc

    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "default"
    request.metadata_field.append("signature_def")
    with grpc.insecure_channel(server.grpc_target) as channel:
        result = prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(request, RPC_TIMEOUT)
    assert "default" == result.model_spec.name
    assert 123 == result.model_spec.version.value
    assert 1 == len(result.metadata)
    assert "signature_def" in result.metadata


def _test_classify(server, model_name):
    from tensorflow_serving.apis import classification_pb2, prediction_service_pb2_grpc

    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = "classify_x_to_y"
    example = request.input.example_list.examples.add()
    example.features.feature["x"].float_list.value.extend([2.0])
    with grpc.insecure_channel(server.grpc_target) as channel:
        result = prediction_service_pb2_grpc.PredictionServiceStub(channel).Classify(request, RPC_TIMEOUT)
    assert 1 == len(result.result.classifications)
    assert 1 == len(result.result.classifications[0].classes)
    assert 3.0 == result.result.classifications[0].classes[0].score
    verify_model_spec(result.model_spec, request.model_spec.name, request.model_spec.signature_name, 123)


def test_testClassify(server):
    _test_classify(server, "default")


def test_testClassifyTf2(server):
    _test_classify(server, "default_tf2")


def _test_regress(server, model_name):
    from tensorflow_serving.apis import prediction_service_pb2_grpc, regression_pb2

    request = regression_pb2.RegressionRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = "regress_x_to_y"
    example = request.input.example_list.examples.add()
    example.features.feature["x"].float_list.value.extend([2.0])
    with grpc.insecure_channel(server.grpc_target) as channel:
        result = prediction_service_pb2_grpc.PredictionServiceStub(channel).Regress(request, RPC_TIMEOUT)
    assert 1 == len(result.result.regressions)
    assert 3.0 == result.result.regressions[0].value
    verify_model_spec(result.model_spec, request.model_spec.name, request.model_spec.signature_name, 123)


def test_testRegress(server):
    _test_regress(server, "default")


def test_testRegressTf2(server):
    _test_regress(server, "default_tf2")


def _test_multi_inference(server, model_name):
    from tensorflow_serving.apis import inference_pb2, prediction_service_pb2_grpc

    request = inference_pb2.MultiInferenceRequest()
    request.tasks.add().model_spec.name = model_name
    request.tasks[0].model_spec.signature_name = "regress_x_to_y"
    request.tasks[0].method_name = "tensorflow/serving/regress"
    request.tasks.add().model_spec.name = model_name
    request.tasks[1].model_spec.signature_name = "classify_x_to_y"
    request.tasks[1].method_name = "tensorflow/serving/classify"
    example = request.input.example_list.examples.add()
    example.features.feature["x"].float_list.value.extend([2.0])
    with grpc.insecure_channel(server.grpc_target) as channel:
        result = prediction_service_pb2_grpc.PredictionServiceStub(channel).MultiInference(request, RPC_TIMEOUT)
    assert 2 == len(result.results)
    assert 3.0 == result.results[0].regression_result.regressions[0].value
    assert 3.0 == result.results[1].classification_result.classifications[0].classes[0].score
    for i in range(2):
        verify_model_spec(result.results[i].model_spec, request.tasks[i].model_spec.name,
                          request.tasks[i].model_spec.signature_name, 123)


def test_testMultiInference(server):
    _test_multi_inference(server, "default")


def test_testMultiInferenceTf2(server):
    _test_multi_inference(server, "default_tf2")


def test_testPredictSavedModel(server):
    """``_TestPredict``."""
    verify_predict_request(server.grpc_target, expected_output=3.0, expected_version=123)
    verify_predict_request(server.grpc_target, expected_output=3.0, specify_output=False, expected_version=123)


def test_testGoodModelConfig(server):
    target = server.grpc_target
    verify_predict_request(target, model_name="half_plus_two", expected_output=3.0, expected_version=123)
    verify_predict_request(target, model_name="half_plus_two", expected_output=3.0, specify_output=False,
                           expected_version=123)
    verify_predict_request(target, model_name="half_plus_three", expected_output=4.0, expected_version=123)
    verify_predict_request(target, model_name="half_plus_three", expected_output=4.0, specify_output=False,
                           expected_version=123)


def test_testClassifyREST(server):
    url = f"{server.http}/v1/models/default:classify"
    json_req = {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]}
    assert json.loads(call_rest(url, json_req).decode()) == {"results": [[["", 3.0]]]}


def test_testRegressREST(server):
    url = f"{server.http}/v1/models/default:regress"
    json_req = {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]}
    assert json.loads(call_rest(url, json_req).decode()) == {"results": [3.0]}


def test_testPredictREST(server):
    url = f"{server.http}/v1/models/default:predict"
    assert json.loads(call_rest(url, {"instances": [2.0, 3.0, 4.0]}).decode()) == {"predictions": [3.0, 3.5, 4.0]}


def test_testPredictColumnarREST(server):
    url = f"{server.http}/v1/models/default:predict"
    assert json.loads(call_rest(url, {"inputs": [2.0, 3.0, 4.0]}).decode()) == {"outputs": [3.0, 3.5, 4.0]}


def test_testGetStatusREST(server):
    url = f"{server.http}/v1/models/default"
    assert json.loads(call_rest(url, None).decode()) == {"model_version_status": [{
        "version": "123", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}


def test_testGetModelMetadataREST(server):
    url = f"{server.http}/v1/models/default/metadata"
    got = json.loads(call_rest(url, None).decode())
    assert sorted_object(got) == sorted_object(expected_metadata("default", "123"))


def test_testPrometheusEndpoint(server):
    resp_data = call_rest(f"{server.http}/monitoring/prometheus/metrics", None)
    assert "# TYPE" in resp_data.decode("utf-8")


def test_test_tf_saved_model_save(server):
    verify_predict_request(server.grpc_target, model_name="saved_model_save", expected_output=12.0,
                           specify_output=False, expected_version=123)


def test_test_tf_saved_model_save_multiple_signatures(server):
    verify_predict_request(server.grpc_target, model_name="saved_model_save_multi", expected_output=2.0,
                           expected_version=123, signature_name="custom_signature_key")
    verify_predict_request(server.grpc_target, model_name="saved_model_save_multi", expected_output=1.0,
                           expected_version=123)


# --- http_rest_api_handler_test.cc ----------------------------------------------------------------

def process_request(server, method: str, path: str, body: str = "") -> tuple[int, dict]:
    """``handler_.ProcessRequest``: (HTTP status, the JSON answer)."""
    data = body.encode() if method == "POST" else None
    request = urllib.request.Request(server.http + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=RPC_TIMEOUT) as resp:
            assert resp.headers["Content-Type"] == "application/json"
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


INVALID_ARGUMENT, NOT_FOUND = 400, 404


def test_UnsupportedApiCalls(server):
    for method, path, message in [
        ("GET", "/v1/foo", "Malformed request"),
        ("POST", "/v1/foo", "Malformed request"),
        ("GET", "/v1/models", "Missing model name"),
        ("GET", "/v1/models/debug/model_name", "Malformed request"),
        ("POST", "/v1/models", "Malformed request"),
        ("GET", "/v1/models/foo:predict", "Malformed request"),
        ("GET", "/v1/models/foo/version/50:predict", "Malformed request"),
        ("POST", "/v1/models/foo/version/50:regress", "Malformed request"),
        ("POST", "/v1/models/foo/versions/HELLO:regress", "Malformed request"),
        ("POST", f"/v1/models/foo/versions/{2**64 - 1}:regress", "Failed to convert version"),
        ("POST", "/v1/models/foo/metadata", "Malformed request"),
        ("POST", "/v1/models/foo/label/some_label:regress", "Malformed request"),
        ("POST", "/v1/models/foo/versions/50/labels/some_label:regress", "Malformed request"),
        ("POST", "/v1/models/foo/versions/some_label:regress", "Malformed request"),
    ]:
        status, doc = process_request(server, method, path)
        assert status == INVALID_ARGUMENT and message in doc["error"], (method, path, status, doc)


def test_PredictModelNameVersionErrors(server):
    for path in ("/v1/models/foo:predict", "/v1/models/foo/versions/50:predict",
                 f"/v1/models/{TEST_MODEL_NAME}99:predict"):
        status, _ = process_request(server, "POST", path, '{ "instances": [1] }')
        assert status == NOT_FOUND, path


def test_PredictRequestErrors(server):
    req_path = f"/v1/models/{TEST_MODEL_NAME}:predict"
    for path, body, message in [
        (req_path, "", "JSON Parse error: The document is empty"),
        (req_path, "instances = [1, 2]", "JSON Parse error: Invalid value"),
        (req_path, '{ "instances": ["x", "y"] }', "not of expected type: float"),
        (f"/v1/models/{TEST_MODEL_NAME}/labels/{NONEXISTENT_MODEL_VERSION_LABEL}:predict",
         '{ "instances": ["x", "y"] }', "Unrecognized servable version label"),
        (req_path, '{ "signature_name": 100 }', "'signature_name' key must be a string value."),
    ]:
        status, doc = process_request(server, "POST", path, body)
        assert status == INVALID_ARGUMENT and message in doc["error"], (body, status, doc)


def _ok(server, method, path, body, expected):
    status, doc = process_request(server, method, path, body)
    assert status == 200 and doc == expected, (path, body, status, doc)


def test_Predict(server):
    base, v1 = f"/v1/models/{TEST_MODEL_NAME}", TEST_MODEL_VERSION1
    _ok(server, "POST", f"{base}:predict", '{"instances": [[1.0, 2.0], [3.0, 4.0]]}',
        {"predictions": [[2.5, 3.0], [3.5, 4.0]]})
    _ok(server, "POST", f"{base}/versions/{v1}:predict", '{"instances": [1.0, 2.0]}', {"predictions": [2.5, 3.0]})
    _ok(server, "POST", f"{base}/labels/{TEST_MODEL_VERSION_LABEL}:predict", '{"instances": [1.0, 2.0]}',
        {"predictions": [2.5, 3.0]})
    _ok(server, "POST", f"{base}/versions/{v1}:predict",
        '{"signature_name": "serving_default", "instances": [3.0, 4.0]}', {"predictions": [3.5, 4.0]})
    _ok(server, "POST", f"{base}/versions/{v1}:predict",
        '{"signature_name": "serving_default", "inputs": [3.0, 4.0]}', {"outputs": [3.5, 4.0]})


def test_Regress(server):
    base = f"/v1/models/{TEST_MODEL_NAME}"
    body = '{"signature_name": "regress_x_to_y", "examples": [ { "x": 80.0 } ] }'
    for path in (f"{base}:regress", f"{base}/versions/{TEST_MODEL_VERSION1}:regress",
                 f"{base}/labels/{TEST_MODEL_VERSION_LABEL}:regress"):
        _ok(server, "POST", path, body, {"results": [42]})


def test_Classify(server):
    base = f"/v1/models/{TEST_MODEL_NAME}"
    _ok(server, "POST", f"{base}:classify",
        '{"signature_name": "classify_x_to_y", "examples": [ { "x": 20.0 } ] }', {"results": [[["", 12]]]})
    _ok(server, "POST", f"{base}/labels/{TEST_MODEL_VERSION_LABEL}:classify",
        '{"signature_name": "classify_x_to_y", "examples": [ { "x": 10.0 } ] }', {"results": [[["", 7]]]})


def test_GetStatus(server):
    expected = {"model_version_status": [{"version": "123", "state": "AVAILABLE",
                                          "status": {"error_code": "OK", "error_message": ""}}]}
    base = f"/v1/models/{TEST_MODEL_NAME}"
    for path in (base, f"{base}/versions/{TEST_MODEL_VERSION1}", f"{base}/labels/{TEST_MODEL_VERSION_LABEL}"):
        _ok(server, "GET", path, "", expected)


def test_GetModelMetadata(server):
    _ok(server, "GET", f"/v1/models/{TEST_MODEL_NAME}/metadata", "", expected_metadata(TEST_MODEL_NAME, "123"))
