"""A ranking request's context: inputs sent once for every row, and the part of the model that
depends on them alone, run once per request (issue 47).

A ranking request is one user and N candidates. An input the signature takes per row (its first
dimension free) may come with one row while the others have N: it applies to every row, and the
answer is the answer to the request with that row repeated N times (the tiled request).

* :mod:`.rows`: which inputs of a request are broadcast (:class:`~.rows.RowPlan`), the refusal of
  a one-row input the model does not take as context, tiling.
* :mod:`.partition`: the part of a graph that depends only on the context inputs (and weights)
  and is row-wise, so that its batch-1 result equals any row of its result on the tiled request;
  where it meets the rest (the boundary tensors). Engine-neutral; :mod:`.rules` says which ops
  are row-wise, for ONNX and TensorFlow op types.
* :mod:`.cache`: the boundary tensors of recent contexts, across requests (``context_cache``).
* :mod:`.runner`: :class:`~.runner.ContextRunner`, what a SessionGroup runs a request through.

The engines' halves (a part's sessions or callables) are
:mod:`processor.engine.onnx.context_part` and :mod:`processor.engine.tensorflow.context`.
Importing this package imports nothing heavy (the model config reads :mod:`.settings`).
"""
