"""Everything TensorFlow: the backend and the helpers it is built from.

* :mod:`.backend` - the TensorFlow backend (one Session, lanes as its inter-op pools);
* :mod:`.signature` - a SavedModel's serving tags and the Signature of a SignatureDef;
* :mod:`.variables` - in-place parameter updates of the live Session (delta checkpoints);
* :mod:`.context` - the context part: two runs of the one Session;
* :mod:`.lane_graphs` - per-lane copies of the serving graph over one set of variables;
* :mod:`.placement` - device placement: a GraphDef's embedding layer found, CPU vs GPU planned;
* :mod:`.embedding_lookup`, :mod:`.key_replay` - a graph's embedding lookups served from a
  feature store (the split run), its lookup keys replayed in numpy;
* :mod:`.op_libraries` - custom op libraries loaded before the SavedModel.

What the engines share stays in :mod:`processor.engine` (the device plan, pinning, the update
gate, TensorFlow's string fingerprint in :mod:`processor.engine.string_hash`). The ONNX Runtime
conversion reads SavedModels through :mod:`.signature` and :mod:`.variables`, never the backend.
Nothing here imports TensorFlow at import time.
"""
