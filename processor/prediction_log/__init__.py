"""Prediction logging: what a served model saw and answered, for training and skew checks.

* :class:`LoggingConfig` (:mod:`.settings`): the ``logging_config`` key of a model_config;
* :class:`PredictionLogger` (:mod:`.logger`): sampling on the request thread, a bounded queue,
  the writer thread, counters;
* :mod:`.record`: what a sampled call keeps, and its decoding on the writer thread;
* :mod:`.formats` / :mod:`.proto`: TFRecord files of ``tensorflow.serving.PredictionLog``
  (without TensorFlow) and JSON lines;
* :mod:`.files`: rotating files (by size and age) and the upload of closed files (fsspec).

The one hook is :meth:`processor.dataplane.DataPlane.predict` (and ``predict_many``), which
every edge goes through, so HTTP, gRPC (ours, TF Serving, KServe v2) and the C ABI log alike.
"""

from .logger import PredictionLogger
from .settings import LoggingConfig

__all__ = ["LoggingConfig", "PredictionLogger"]
