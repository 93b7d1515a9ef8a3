"""Server-side batching: concurrent small requests merged into one engine call (``batching`` in
a model_config). :mod:`.model_batching` is one model's batching (its one submit path and row
budget, :mod:`.budget`), :mod:`.batcher` the reference queue, :mod:`.native_queue` each
version's native queue, :mod:`.merge` the pure concatenate / pad / split, :mod:`.settings` the
validated settings, :mod:`.stats` the counters.

Nothing is imported here, so that :mod:`processor.config` can import the settings alone.
"""
