"""TF Serving's Classify, Regress and MultiInference over the DataPlane (transport-neutral: the
gRPC ``PredictionService`` and the REST ``:classify`` / ``:regress`` routes both call these).

As TF Serving does (``servables/tensorflow/classifier.cc``, ``regressor.cc``,
``multi_inference.cc``, ``util.cc``):

* the request's ``Input`` becomes one 1-D string tensor of serialized ``tf.Example``s; with
  ``example_list_with_context`` each is the context's bytes followed by the example's, so parsing
  merges them (the example's value wins for a feature both have); no example is "Input is empty.";
* the signature is the request's ``signature_name`` (none: the model's default); a missing one is
  INVALID_ARGUMENT "No signature was found with the name: ..." (MultiInference: "Requested
  signature not found in model graph: ...");
* Classify reads the outputs ``classes`` (DT_STRING) and / or ``scores`` (DT_FLOAT), each
  ``[batch, num_classes]``; Regress reads ``outputs``, ``[batch]`` or ``[batch, 1]`` DT_FLOAT;
  the response's ``model_spec`` carries the request's signature name as given and the version that
  ran. MultiInference runs every task on one version (one acquire: the first task's
  ``model_spec`` names it), for one model, each signature once, methods classify or regress only.
* the ``model_spec``'s ``version`` or ``version_label`` names the version to run on (a model may
  serve several side by side); a call naming neither runs on the default, or on the arm of the
  model's traffic split its ``routing_key`` picks (the transport's ``x-routing-key``).

Beyond TF Serving (a superset; its own requests behave as there): the signature's one input may
have any alias as long as it is DT_STRING, so Predict signatures over serialized examples (a
ranking model's ``examples`` input) take ``ExampleListWithContext`` too; a signature of named
features (not one DT_STRING input) takes the examples feature by feature, the context's
features as one row for every row (:mod:`.features`: a ranking model's user side then runs
once per request, :mod:`processor.context`); a Regress signature's
single output may have any alias, and a Classify signature without ``classes`` / ``scores`` but
with one DT_FLOAT output reads it as the scores. The method name is not checked (TF Serving's
default, ``--enable_signature_method_name_check=false``).

Errors are ProcessorErrors with TF Serving's messages. Thread-safe (no state).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from processor.dtypes import DT_FLOAT
from processor.echo import cut
from processor.errors import InvalidArgument, SignatureNotFound
from processor.request import PredictCall, PredictResult
from processor.signature import Signature

from .features import feature_arrays, takes_features
from .messages import messages

CLASSIFY = "tensorflow/serving/classify"
REGRESS = "tensorflow/serving/regress"


def examples_tensor(input_proto) -> np.ndarray:
    """A ``tensorflow.serving.Input`` as the 1-D object array of serialized examples (the
    context merged into each, see the module doc)."""
    kind = input_proto.WhichOneof("kind")
    if kind == "example_list":
        serialized = [e.SerializeToString() for e in input_proto.example_list.examples]
    elif kind == "example_list_with_context":
        listed = input_proto.example_list_with_context
        context = listed.context.SerializeToString()
        serialized = [context + e.SerializeToString() for e in listed.examples]
    else:
        serialized = []
    if not serialized:
        raise InvalidArgument("Input is empty.")
    out = np.empty(len(serialized), dtype=object)
    out[:] = serialized
    return out


Wanted = tuple[int | None, str | None]  # the version or label a request names


def wanted_of(spec) -> Wanted:
    """The version or label a ``ModelSpec`` names."""
    return (spec.version.value if spec.HasField("version") else None,
            spec.version_label if spec.HasField("version_label") else None)


def _call(model: str, input_proto, spec, deadline: float | None, wanted: Wanted | None,
          routing_key: str | None = None) -> PredictCall:
    """The DataPlane call of one classify / regress request: the examples fed to the signature's
    input (serialized, the context merged into each), or, for a signature of named features, read
    feature by feature with the context's features as one row (:mod:`.features`); every
    output fetched, shapes left to the graph. ``wanted``: the version or label (None: ``spec``'s;
    REST passes its URL's, which may exceed the proto's int64); ``routing_key``: the call's (see
    the module doc)."""
    version, label = wanted if wanted is not None else wanted_of(spec)

    def decode(signature: Signature) -> dict[str, np.ndarray]:
        if takes_features(signature):
            return feature_arrays(input_proto, signature)
        return {next(iter(signature.inputs)): examples_tensor(input_proto)}  # its one DT_STRING input
    return PredictCall(model, decode, version=version, label=label, signature_name=spec.signature_name,
                       deadline=deadline, check_shapes=False, routing_key=routing_key)


def _example_count(input_proto) -> int:
    """The number of examples of ``input_proto`` (the answer's rows); InvalidArgument if none."""
    kind = input_proto.WhichOneof("kind")
    n = (len(input_proto.example_list.examples) if kind == "example_list" else
         len(input_proto.example_list_with_context.examples) if kind == "example_list_with_context" else 0)
    if not n:
        raise InvalidArgument("Input is empty.")
    return n


def _run(dataplane, call: PredictCall) -> PredictResult:
    try:
        return dataplane.predict(call)
    except SignatureNotFound as exc:
        raise InvalidArgument(f"No signature was found with the name: {cut(exc.name)}") from None


def classify(dataplane, request, deadline: float | None = None, wanted: Wanted | None = None,
             routing_key: str | None = None):
    """A ``ClassificationRequest`` answered as a ``ClassificationResponse``."""
    return _answer(dataplane, request, deadline, wanted, messages().ClassificationResponse(), fill_classifications,
                   routing_key)


def regress(dataplane, request, deadline: float | None = None, wanted: Wanted | None = None,
            routing_key: str | None = None):
    """A ``RegressionRequest`` answered as a ``RegressionResponse``."""
    return _answer(dataplane, request, deadline, wanted, messages().RegressionResponse(), fill_regressions,
                   routing_key)


def _answer(dataplane, request, deadline: float | None, wanted: Wanted | None, response, fill,
            routing_key: str | None):
    """Run a classify / regress ``request``; ``fill`` writes the outputs into ``response.result``."""
    n = _example_count(request.input)
    result = _run(dataplane, _call(request.model_spec.name, request.input, request.model_spec, deadline, wanted,
                                   routing_key))
    _model_spec(response.model_spec, request.model_spec, result)
    fill(response.result, result.signature, result.outputs, n)
    return response


def multi_inference(dataplane, request, deadline: float | None = None, routing_key: str | None = None):
    """A ``MultiInferenceRequest`` answered as a ``MultiInferenceResponse`` (see the module doc)."""
    tasks = list(request.tasks)
    if not tasks:
        raise InvalidArgument("MultiInferenceRequest has no tasks.")  # TF Serving: the same, unnamed
    model, seen = tasks[0].model_spec.name, set()
    for task in tasks:
        if not task.model_spec.name:
            raise InvalidArgument("Found ModelSpec with an empty model name.")
        if task.model_spec.name != model:
            raise InvalidArgument("All ModelSpecs in a MultiInferenceRequest must access the same model name.")
        name = task.model_spec.signature_name
        if name in seen:
            raise InvalidArgument(f"Duplicate evaluation of signature: {cut(name or 'serving_default')}")
        seen.add(name)
        if task.method_name not in (CLASSIFY, REGRESS):
            raise InvalidArgument(f"Unsupported signature method_name: {cut(task.method_name)}")
    n = _example_count(request.input)
    call = _call(model, request.input, tasks[0].model_spec, deadline, None, routing_key)
    try:
        results = dataplane.predict_each(call, [t.model_spec.signature_name for t in tasks])
    except SignatureNotFound as exc:
        raise InvalidArgument(f"Requested signature not found in model graph: {cut(exc.name)}") from None
    response = messages().MultiInferenceResponse()
    for task, result in zip(tasks, results):
        item = response.results.add()
        _model_spec(item.model_spec, task.model_spec, result)
        if task.method_name == CLASSIFY:
            fill_classifications(item.classification_result, result.signature, result.outputs, n)
        else:
            fill_regressions(item.regression_result, result.signature, result.outputs, n)
    return response


def _model_spec(out, asked, result: PredictResult) -> None:
    out.name = asked.name
    out.signature_name = asked.signature_name  # as given, as TF Serving answers Classify/Regress
    out.version.value = result.version_number


def fill_classifications(out, signature: Signature, outputs: Mapping[str, np.ndarray], n: int) -> None:
    """``ClassificationResult`` from the signature's ``classes`` and / or ``scores``."""
    classes, scores = outputs.get("classes"), outputs.get("scores")
    if classes is None and scores is None:
        floats = [a for a, s in signature.outputs.items() if s.dtype == DT_FLOAT]
        if len(signature.outputs) != 1 or not floats:
            raise InvalidArgument(f"Expected classification signature outputs to contain at least one of "
                                  f"\"classes\" or \"scores\". Signature {signature.name!r} has "
                                  f"{sorted(signature.outputs)}")
        scores = outputs[floats[0]]
    for what, array in (("classes", classes), ("scores", scores)):
        if array is None:
            continue
        if array.ndim != 2:
            raise InvalidArgument(f"Expected Tensor shape: [batch_size num_classes] but got {list(array.shape)}")
        if what == "classes" and array.dtype != object:
            raise InvalidArgument(f"Expected classes Tensor of DT_STRING. Got: {array.dtype}")
        if what == "scores" and array.dtype != np.float32:
            raise InvalidArgument(f"Expected scores Tensor of DT_FLOAT. Got: {array.dtype}")
        if array.shape[0] != n:
            raise InvalidArgument(f"Expected {what} output batch size of {n}. Got: {array.shape[0]}")
    if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
        raise InvalidArgument(f"Tensors class and score should match in dim_size(1). Got "
                              f"{classes.shape[1]} vs. {scores.shape[1]}")
    width = (classes if classes is not None else scores).shape[1]
    score_rows = scores.tolist() if scores is not None else None
    for i in range(n):
        item = out.classifications.add()
        for c in range(width):
            cls = item.classes.add()
            if classes is not None:
                label = classes[i, c]
                cls.label = label.decode("utf-8", "replace") if isinstance(label, bytes) else str(label)
            if score_rows is not None:
                cls.score = score_rows[i][c]


def fill_regressions(out, signature: Signature, outputs: Mapping[str, np.ndarray], n: int) -> None:
    """``RegressionResult`` from the signature's ``outputs`` (or its one output)."""
    array = outputs.get("outputs")
    if array is None:
        if len(signature.outputs) != 1:
            raise InvalidArgument("Expected one output Tensor.")
        array = next(iter(outputs.values()))
    if not (array.ndim == 1 or (array.ndim == 2 and array.shape[1] == 1)):
        raise InvalidArgument(f"Expected output Tensor shape to be either [batch_size] or [batch_size, 1] "
                              f"but got {list(array.shape)}")
    if array.shape[0] != n:
        raise InvalidArgument(f"Input batch size did not match output batch size: {n} vs. {array.shape[0]}")
    if array.dtype != np.float32:
        raise InvalidArgument(f"Expected output Tensor of DT_FLOAT.  Got: {array.dtype}")
    for value in array.ravel().tolist():
        out.regressions.add(value=value)


def result_json(method: str, response) -> dict[str, Any]:
    """TF Serving's REST answer of a classify (``[[[label, score], ...], ...]``) or regress
    (``[value, ...]``) response, as a JSON-ready dict."""
    if method == "classify":
        return {"results": [[[c.label, c.score] for c in item.classes]
                            for item in response.result.classifications]}
    return {"results": [r.value for r in response.result.regressions]}
