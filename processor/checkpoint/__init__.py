"""Checkpoints: the trainer-side writer (full + incremental) and the reader of deltas."""
