"""Builders of the project's demo and test models.

Two models, both laid out the way the serving processor expects them (see docs/checkpoints.md
and the README's "Hot update, rollback" section):

- the toy (:mod:`demo.toy_model`): DeepRec's end-to-end example ``y = a*x + b``, exported from
  TF1 graph mode or from a TF2 ``tf.Module``;
- the CTR model (:mod:`demo.ctr_model`): wide & deep on synthetic Criteo-like data
  (:mod:`demo.synthetic_data`), 26 embedding tables, several full checkpoint versions.

The trainer side of checkpoints (the incremental checkpoint writer, atomic publishing) is
:mod:`demo.trainer`; :mod:`demo.streaming_trainer` trains with it.

:mod:`demo.paths` builds either on demand and gives the matching DeepRec ``model_config``;
``python -m demo`` is the command line. Importing this package does not import TensorFlow.
"""
