"""The gRPC tests of tests/e2e/test_tfserving_signatures.py (TF Serving's Classify / Regress / MultiInference and Predict signatures through its official stub) run again against the Python gRPC server
(issue 50, ``grpc_server: "python"``; the module itself runs on the default, the native server).
Its tests that speak only HTTP are left out."""

from __future__ import annotations

import sp_checks
from test_tfserving_signatures import *  # noqa: F401,F403 - the module's tests and fixtures, run here again

python_grpc_server = sp_checks.python_grpc_rerun(globals(), only=(
    "test_classify_regress_multi_equal_tensorflow",
    "test_empty_signature_name_is_the_models_default",
    "test_predict_signature_typed_fields_and_tensor_content",
    "test_signatures_side_by_side_concurrently",
    "test_metadata_lists_every_signature",
    "test_missing_signature_and_bad_inputs_with_tf_serving_codes",
    "test_new_calls_counted_like_predict",
    "test_a_predict_signature_over_examples_takes_context",
))
