"""The trainer side of checkpoints: what a training loop uses to write what the processor serves.

* :mod:`.writer` - :class:`~.writer.CheckpointWriter`, full and incremental checkpoints in the
  layout of docs/checkpoints.md;
* :mod:`.publish` - a checkpoint published atomically (readers never see half of it) and the
  ``checkpoint`` state file rewritten.

The processor only reads these files (:mod:`processor.checkpoint`, :mod:`processor.store`); it
never imports this package. Importing it does not import TensorFlow.
"""
