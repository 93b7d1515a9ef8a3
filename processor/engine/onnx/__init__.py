"""Everything ONNX Runtime: the backend and the helpers it is built from.

* :mod:`.backend` - the ONNX Runtime backend (N sessions over one copy of the parameters);
* :mod:`.native_engine` - the native engine serving whole wire requests without the GIL;
* :mod:`.param_buffers` - the parameters in processor-owned host or GPU memory, shared by sessions;
* :mod:`.placement`, :mod:`.split` - device placement: the graph split at its embedding lookups;
* :mod:`.profile` - ONNX Runtime profiles read into trace events;
* :mod:`.ort_env` - the onnxruntime module, its process-wide thread pools, pool thread pinning;
* :mod:`.ort_errors` - a run's ONNX Runtime errors mapped to ours;
* :mod:`.convert` - a SavedModel or ``.onnx`` file prepared for serving (cached);
* :mod:`.from_tensorflow` - TensorFlow SavedModels converted with tf2onnx;
* :mod:`.check` - a converted graph checked against TensorFlow;
* :mod:`.hash_rewrite` - TensorFlow's string hashing rewritten for ONNX Runtime;
* :mod:`.signature`, :mod:`.weights` - the signature and parameters stored next to the model.

The helpers never import the backend: what both need lives in :mod:`.ort_env` (and
:mod:`processor.engine.tensorflow.signature` on the TensorFlow side). Nothing here imports onnxruntime,
onnx, tf2onnx or TensorFlow at import time.
"""
