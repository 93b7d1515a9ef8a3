"""TF Serving's Input read feature by feature into a signature's named inputs (server/tfserving/features.py):
the context's features as one row, TF Serving's merge where examples have them too, refusals."""

from __future__ import annotations

import numpy as np
import pytest

from processor.errors import InvalidArgument
from processor.signature import Signature, TensorSpec
from server.tfserving.features import feature_arrays, takes_features
from server.tfserving.messages import messages

SIG = Signature("serving_default", {
    "user_seq": TensorSpec("user_seq", "user_seq:0", 9, (-1, 3)),
    "user_dense": TensorSpec("user_dense", "user_dense:0", 1, (-1, 2)),
    "item_id": TensorSpec("item_id", "item_id:0", 9, (-1,)),
    "tag": TensorSpec("tag", "tag:0", 7, (-1, 1)),
}, {"prob": TensorSpec("prob", "prob:0", 1, (-1, 1))})


def elwc(items=(5, 6, 7), context=True, tag_in_examples=True):
    request = messages().RegressionRequest()
    listed = request.input.example_list_with_context
    if context:
        features = listed.context.features.feature
        features["user_seq"].int64_list.value.extend([1, 2, 3])
        features["user_dense"].float_list.value.extend([0.5, -1.0])
        features["tag"].bytes_list.value.append(b"ctx")
    for i, item in enumerate(items):
        example = listed.examples.add().features.feature
        example["item_id"].int64_list.value.append(item)
        if tag_in_examples and i != 1:
            example["tag"].bytes_list.value.append(b"t%d" % i)
    return request.input


def test_context_features_come_as_one_row():
    arrays = feature_arrays(elwc(), SIG)
    assert arrays["user_seq"].tolist() == [[1, 2, 3]] and arrays["user_seq"].dtype == np.int64
    assert arrays["user_dense"].shape == (1, 2) and arrays["user_dense"].dtype == np.float32
    assert arrays["item_id"].tolist() == [5, 6, 7]
    # examples that have it keep theirs, the others get the context's (TF Serving's merge)
    assert arrays["tag"].tolist() == [[b"t0"], [b"ctx"], [b"t2"]]


def test_refusals_name_the_feature():
    with pytest.raises(InvalidArgument, match="feature 'user_seq' .* is missing from example 0"):
        feature_arrays(elwc(context=False), SIG)
    bad = elwc()
    bad.example_list_with_context.context.features.feature["user_dense"].ClearField("float_list")
    bad.example_list_with_context.context.features.feature["user_dense"].int64_list.value.append(1)
    with pytest.raises(InvalidArgument, match="feature 'user_dense' of the context: int64_list given"):
        feature_arrays(bad, SIG)
    bad = elwc()
    bad.example_list_with_context.context.features.feature["user_seq"].int64_list.value.append(4)
    with pytest.raises(InvalidArgument, match="4 values per row do not fill input 'user_seq'"):
        feature_arrays(bad, SIG)
    with pytest.raises(InvalidArgument, match="Input is empty."):
        feature_arrays(messages().RegressionRequest().input, SIG)


def test_which_signatures_take_features():
    assert takes_features(SIG)
    examples = Signature("s", {"inputs": TensorSpec("inputs", "x:0", 7, (-1,))}, {})
    assert not takes_features(examples)
