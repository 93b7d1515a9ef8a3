"""Checkpoints as the processor reads them: tensor bundles and the reader of deltas.

The trainer side (the writer of full and incremental checkpoints, atomic publishing) is
:mod:`demo.trainer`; it shares the file format's names (:mod:`.delta`) with the reader.
"""
