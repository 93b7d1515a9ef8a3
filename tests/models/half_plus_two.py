# Copyright 2015 The TensorFlow Authors. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""TF Serving's test models ``saved_model_half_plus_two_cpu`` and ``saved_model_half_plus_two_tf2_cpu``,
rebuilt the way TF Serving builds them.

Origin: ``tensorflow_serving/servables/tensorflow/testdata/saved_model_half_plus_two.py`` of
https://github.com/tensorflow/serving (Apache License 2.0, header above), the CPU exports
(``--device=cpu``): ``_generate_saved_model_for_half_plus_two(export_dir)`` for the TF1 graph and
``(..., tf2=True)`` for the TF2 module. Kept as in that file: the variables ``a = 0.5``,
``b = 2``, ``c = 3`` (and ``a2``, ``c2`` for ``y3``), the placeholder ``tf_example`` of serialized
``tf.Example``s parsed with the feature spec ``x`` / ``x2`` (``x2`` defaulting to 0), the tensors
named ``x``, ``y``, ``y2``, ``x2``, ``y3``, the asset file ``foo.txt`` and its main op, and the
signatures ``serving_default`` (predict x -> y), ``regress_x_to_y``, ``regress_x_to_y2``,
``regress_x2_to_y3``, ``classify_x_to_y`` (and in TF2 ``classify_x2_to_y3``). Left out: the
TF Lite, MKL, GPU, text-format, main-op and ML Metadata variants (nothing here serves them) and
the ``log_device_placement`` session option. The asset is written under the caller's directory
instead of ``/tmp/original``.

Each export lands in ``<base>/00000123``, TF Serving's layout (version 123).
"""

from __future__ import annotations

from pathlib import Path

VERSION = 123


def _feature_spec(tf):
    """Feature spec for parsing tensorflow.Example: "x" and "x2" (default 0)."""
    return {"x": tf.io.FixedLenFeature([1], dtype=tf.float32),
            "x2": tf.io.FixedLenFeature([1], dtype=tf.float32, default_value=[0.0])}


def _write_asset(directory: Path) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "foo.txt"
    path.write_text("asset-file-contents")
    return str(path)


def export_tf1(base: Path, b: float = 2.0) -> Path:
    """The TF1 graph export (``saved_model_half_plus_two_cpu``); returns the version directory.
    ``b=3`` makes ``saved_model_half_plus_three`` (y = 0.5x + 3)."""
    import tensorflow.compat.v1 as tf

    sig = tf.saved_model.signature_def_utils
    info = tf.saved_model.utils.build_tensor_info
    consts = tf.saved_model.signature_constants

    def predict(x, y):
        return sig.build_signature_def({"x": info(x)}, {"y": info(y)}, consts.PREDICT_METHOD_NAME)

    def regression(x, y):
        return sig.build_signature_def({consts.REGRESS_INPUTS: info(x)}, {consts.REGRESS_OUTPUTS: info(y)},
                                       consts.REGRESS_METHOD_NAME)

    def classification(x, scores):
        return sig.build_signature_def({consts.CLASSIFY_INPUTS: info(x)},
                                       {consts.CLASSIFY_OUTPUT_SCORES: info(scores)},
                                       consts.CLASSIFY_METHOD_NAME)

    export_dir = base / f"{VERSION:08d}"
    assets = _write_asset(base.parent / f"{base.name}-original-assets")
    builder = tf.saved_model.builder.SavedModelBuilder(str(export_dir))
    with tf.Session(graph=tf.Graph()) as sess:
        with tf.device("/cpu:0"):
            a = tf.Variable(0.5, name="a")
            b = tf.Variable(b, name="b")
            c = tf.Variable(3.0, name="c")
            serialized_tf_example = tf.placeholder(tf.string, name="tf_example", shape=[None])
            tf_example = tf.parse_example(serialized_tf_example, _feature_spec(tf))
            x = tf.identity(tf_example["x"], name="x")
            y = tf.identity(tf.add(tf.multiply(a, x), b), name="y")
            y2 = tf.identity(tf.add(tf.multiply(a, x), c), name="y2")
            x2 = tf.identity(tf_example["x2"], name="x2")
            a2 = tf.Variable(0.5, name="a2")
            c2 = tf.Variable(3.0, name="c2")
            y3 = tf.identity(tf.add(tf.multiply(a2, x2), c2), name="y3")

        assets_filepath = tf.constant(assets)
        tf.add_to_collection(tf.GraphKeys.ASSET_FILEPATHS, assets_filepath)
        filename_tensor = tf.Variable("foo.txt", name="filename_tensor", trainable=False, collections=[])
        assign_filename_op = filename_tensor.assign("foo.txt")

        signature_def_map = {
            "regress_x_to_y": regression(serialized_tf_example, y),
            "regress_x_to_y2": regression(serialized_tf_example, y2),
            "regress_x2_to_y3": regression(x2, y3),
            "classify_x_to_y": classification(serialized_tf_example, y),
            consts.DEFAULT_SERVING_SIGNATURE_DEF_KEY: predict(x, y),
        }
        sess.run(tf.global_variables_initializer())
        builder.add_meta_graph_and_variables(
            sess, [tf.saved_model.tag_constants.SERVING], signature_def_map=signature_def_map,
            assets_collection=tf.get_collection(tf.GraphKeys.ASSET_FILEPATHS),
            main_op=tf.group(assign_filename_op))
    builder.save()
    return export_dir


def export_tf2(base: Path) -> Path:
    """The native TF2 module export (``saved_model_half_plus_two_tf2_cpu``)."""
    import tensorflow as tf

    class HalfPlusTwoModel(tf.Module):
        def __init__(self, asset: str):
            self.a = tf.Variable(0.5, name="a")
            self.b = tf.Variable(2.0, name="b")
            self.c = tf.Variable(3.0, name="c")
            self.asset = tf.saved_model.Asset(asset)

        def compute(self, x, inc):
            return tf.add(tf.multiply(self.a, x), inc)

        def get_serving_signatures(self):
            return {"regress_x_to_y": self.regress_xy, "regress_x_to_y2": self.regress_xy2,
                    "regress_x2_to_y3": self.regress_x2y3, "classify_x_to_y": self.classify_xy,
                    "classify_x2_to_y3": self.classify_x2y3,
                    tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY: self.predict}

        @tf.function(input_signature=[tf.TensorSpec(shape=[1], dtype=tf.float32)])
        def predict(self, x=tf.constant([0], shape=[1], dtype=tf.float32)):
            return {"y": self.compute(x, self.b)}

        @tf.function(input_signature=[tf.TensorSpec([None], dtype=tf.string, name=tf.saved_model.REGRESS_INPUTS)])
        def regress_xy(self, serialized_proto):
            x = tf.io.parse_example(serialized_proto, _feature_spec(tf))["x"]
            return {tf.saved_model.REGRESS_OUTPUTS: self.compute(x, self.b)}

        @tf.function(input_signature=[tf.TensorSpec([None], dtype=tf.string, name=tf.saved_model.REGRESS_INPUTS)])
        def regress_xy2(self, serialized_proto):
            x = tf.io.parse_example(serialized_proto, _feature_spec(tf))["x"]
            return {tf.saved_model.REGRESS_OUTPUTS: self.compute(x, self.c)}

        @tf.function(input_signature=[tf.TensorSpec(shape=[1], dtype=tf.float32, name=tf.saved_model.REGRESS_INPUTS)])
        def regress_x2y3(self, x2):
            return {tf.saved_model.REGRESS_OUTPUTS: self.compute(x2, self.c)}

        @tf.function(input_signature=[tf.TensorSpec([None], dtype=tf.string, name=tf.saved_model.CLASSIFY_INPUTS)])
        def classify_xy(self, serialized_proto):
            x = tf.io.parse_example(serialized_proto, _feature_spec(tf))["x"]
            return {tf.saved_model.CLASSIFY_OUTPUT_SCORES: self.compute(x, self.b)}

        @tf.function(input_signature=[tf.TensorSpec(shape=[1], dtype=tf.float32, name=tf.saved_model.CLASSIFY_INPUTS)])
        def classify_x2y3(self, x2):
            return {tf.saved_model.CLASSIFY_OUTPUT_SCORES: self.compute(x2, self.c)}

    export_dir = base / f"{VERSION:08d}"
    hp = HalfPlusTwoModel(_write_asset(base.parent / f"{base.name}-original-assets"))
    tf.saved_model.save(hp, str(export_dir), signatures=hp.get_serving_signatures())
    return export_dir


if __name__ == "__main__":  # python tests/models/half_plus_two.py OUT_DIR
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "artifacts/tfserving_testdata")
    print(export_tf1(out / "saved_model_half_plus_two_cpu"))
    print(export_tf2(out / "saved_model_half_plus_two_tf2_cpu"))
