"""The gRPC tests of tests/e2e/test_tfserving_compat.py (TF Serving's own e2e tests over gRPC (model status and metadata, Classify, Regress, MultiInference, Predict, saved_model.save exports, a good model config)) run again against the Python gRPC server
(issue 50, ``grpc_server: "python"``; the module itself runs on the default, the native server).
Its tests that speak only HTTP are left out."""

from __future__ import annotations

import sp_checks
from test_tfserving_compat import *  # noqa: F401,F403 - the module's tests and fixtures, run here again

python_grpc_server = sp_checks.python_grpc_rerun(globals(), only=(
    "test_testGetModelStatus",
    "test_testGetModelMetadata",
    "test_testClassify",
    "test_testClassifyTf2",
    "test_testRegress",
    "test_testRegressTf2",
    "test_testMultiInference",
    "test_testMultiInferenceTf2",
    "test_testPredictSavedModel",
    "test_testGoodModelConfig",
    "test_test_tf_saved_model_save",
    "test_test_tf_saved_model_save_multiple_signatures",
))
