"""Custom op libraries (``custom_op_libraries``): a TensorFlow op built here from C++ with the
headers TensorFlow's wheel ships (``tf.sysconfig``), a SavedModel that uses it, served by a real
server (``python -m server``) that loads the library before the SavedModel; the same model without
the key does not load; a missing library is a ConfigError naming the path; model info lists the
libraries and their ops.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request

import numpy as np
import pytest

OP_SOURCE = r"""
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

using namespace tensorflow;

REGISTER_OP("SpTimesThreePlusOne")
    .Input("x: float")
    .Output("y: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) { c->set_output(0, c->input(0)); return OkStatus(); });

class SpTimesThreePlusOneOp : public OpKernel {
 public:
  explicit SpTimesThreePlusOneOp(OpKernelConstruction* context) : OpKernel(context) {}
  void Compute(OpKernelContext* context) override {
    const Tensor& input = context->input(0);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, input.shape(), &output));
    auto in = input.flat<float>();
    auto out = output->flat<float>();
    for (int64_t i = 0; i < in.size(); ++i) out(i) = 3.0f * in(i) + 1.0f;
  }
};

REGISTER_KERNEL_BUILDER(Name("SpTimesThreePlusOne").Device(DEVICE_CPU), SpTimesThreePlusOneOp);
"""


@pytest.fixture(scope="module")
def op_library(tmp_path_factory):
    import tensorflow as tf

    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler (g++) to build the custom op")
    work = tmp_path_factory.mktemp("custom_op")
    source = work / "times_three.cc"
    source.write_text(OP_SOURCE)
    library = work / "libsp_times_three.so"
    command = [compiler, "-std=c++17", "-shared", "-fPIC", "-O1", str(source), "-o", str(library),
               *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return library


@pytest.fixture(scope="module")
def model_dir(op_library, tmp_path_factory):
    """A TF1 SavedModel whose serving_default is y = SpTimesThreePlusOne(x) + b (b a variable, 0.5)."""
    import tensorflow.compat.v1 as tf

    ops = tf.load_op_library(str(op_library))  # in this process, to build the graph
    export = tmp_path_factory.mktemp("custom_op_model") / "model"
    graph = tf.Graph()
    with graph.as_default(), tf.Session(graph=graph) as sess:
        x = tf.placeholder(tf.float32, [None, 1], name="x")
        b = tf.Variable(0.5, name="b")
        y = tf.identity(ops.sp_times_three_plus_one(x) + b, name="y")
        sess.run(tf.global_variables_initializer())
        builder = tf.saved_model.builder.SavedModelBuilder(str(export / "1"))
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
            "serving_default": tf.saved_model.predict_signature_def({"x": x}, {"y": y})})
        builder.save()
    return export


def test_served_with_its_library_and_refused_without(op_library, model_dir, tmp_path_factory):
    from tools.server_process import ServerProcess

    config = {"savedmodel_dir": str(model_dir)}
    deployment = {"models": [{"name": "custom", "model_config": {**config, "custom_op_libraries": [str(op_library)]}}],
                  "access_log": False}
    with ServerProcess(deployment, tmp_path_factory.mktemp("server")).start(timeout=180) as proc:
        assert proc.wait_models(120) == {"custom": "ready"}, proc.log()
        body = json.dumps({"instances": [[1.0], [2.0]]}).encode()
        request = urllib.request.Request(f"{proc.http}/v1/models/custom:predict", data=body)
        with urllib.request.urlopen(request, timeout=30) as resp:
            got = np.array(json.loads(resp.read())["predictions"], np.float32)
        np.testing.assert_allclose(got, [[4.5], [7.5]], rtol=1e-6)
        libraries = proc.get_json("/api/models/custom")["session_group"]["custom_op_libraries"]
        assert libraries == [{"path": str(op_library), "ops": ["SpTimesThreePlusOne"]}]

    # TensorFlow's op registry is the process's: without the key (in a process that never loaded
    # the library) the SavedModel does not load, and the error names the op
    deployment = {"models": [{"name": "no_library", "model_config": config}], "access_log": False}
    with ServerProcess(deployment, tmp_path_factory.mktemp("server")).start(timeout=180) as proc:
        assert proc.wait_models(120) == {"no_library": "failed"}, proc.log()
        assert "SpTimesThreePlusOne" in json.dumps(proc.get_json("/api/models/no_library"))


def test_missing_library_is_a_config_error_naming_the_path(model_dir, tmp_path):
    from processor.errors import ConfigError
    from processor.processor import Processor

    missing = tmp_path / "libnot_there.so"
    config = {"savedmodel_dir": str(model_dir), "custom_op_libraries": [str(missing)]}
    with pytest.raises(ConfigError, match=f"custom_op_libraries: {missing} is not a readable file"):
        Processor.create("custom", json.dumps(config))

    not_a_library = tmp_path / "libgarbage.so"
    not_a_library.write_bytes(b"not an ELF file")
    config["custom_op_libraries"] = [str(not_a_library)]
    with pytest.raises(ConfigError, match=f"could not load {not_a_library}"):
        Processor.create("custom", json.dumps(config))
