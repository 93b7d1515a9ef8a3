"""Held: one acquire of a served version, its release, and the errors converted: the one way
the request path holds a version (``with Held(manager, number) as group:``)."""

from __future__ import annotations

from ..errors import ProcessorError, as_processor_error


class Held:
    """Served version ``number`` of ``manager`` (None: the default), referenced from construction
    (which raises as ``ModelManager.acquire_handle``: Unavailable, NotFound) until
    :meth:`release`, or the end of the ``with`` block, which releases it (unless :attr:`kept`
    was set in it) and turns any other exception than a ProcessorError into one (INTERNAL, the
    original as its ``__cause__``).

    Ownership: released exactly once, by whoever holds it last (a deferred call hands it to the
    thread that finishes it; a queued one to its ``BatchedCall``). Not thread-safe: one holder
    at a time."""

    __slots__ = ("handle", "group", "kept")

    def __init__(self, manager, number: int | None) -> None:
        self.handle = handle = manager.acquire_handle(number)
        self.group = handle.group
        self.kept = False  # set inside the block: it ends without a release (ownership passes on)

    def __enter__(self):
        return self.group

    def __exit__(self, kind, exc, tb) -> bool:
        if not self.kept:
            self.handle.release()
        if isinstance(exc, Exception) and not isinstance(exc, ProcessorError):
            raise converted(exc) from exc
        return False

    def release(self) -> None:
        self.handle.release()


def converted(exc: Exception) -> ProcessorError:
    """What a call raises for ``exc``, raised while it held a version: a ProcessorError as it
    is, anything else INTERNAL (raise it ``from exc``: the original is its ``__cause__``)."""
    return exc if isinstance(exc, ProcessorError) else as_processor_error(exc)


def on_served(manager, work, number: int | None = None):
    """``work(group)`` on the model's served version ``number`` (None: the default), held for
    the call; anything it raises is a ProcessorError."""
    with Held(manager, number) as group:
        return work(group)
