"""ModelState: the serving state of one model, and the transitions it may take.

The state says whether the model can answer requests, not what a background update is doing:
while a newer version loads behind a served one, the model stays ``READY``. ``LOADING`` and
``WARMING`` are seen only while nothing is served yet (the first load, or a load after every
earlier one failed).

=========  ==========================================  ======================================
from       to                                          when
=========  ==========================================  ======================================
NEW        LOADING                                     the first load starts
NEW        FAILED                                      no version can be found yet (start waits)
LOADING    WARMING                                     the group is open, its deltas applied
LOADING    FAILED                                      materialize / open / a delta failed
WARMING    READY                                       warmup passed; the group is swapped in
WARMING    FAILED                                      warmup failed; the group is closed
READY      READY                                       another version (full or delta) swapped in
FAILED     LOADING                                     a load is tried again
FAILED     FAILED                                      it failed again (or still none found)
any        CLOSED                                      :meth:`ModelManager.close` (again: no-op)
=========  ==========================================  ======================================

``CLOSED`` is final: nothing leaves it. A failed update while a version serves changes no state
(the served version keeps serving; the failure is recorded apart). :func:`transition` is the only
way the manager changes its state: it refuses any move not in :data:`TRANSITIONS`.

The values are the strings model info has always reported (``"ready"``...); a ``ModelState``
is a ``str`` (``StrEnum``), so it compares, formats and serializes to JSON as that string.
"""

from __future__ import annotations

from enum import StrEnum

from ..errors import Internal


class ModelState(StrEnum):
    """See the module doc."""

    NEW = "new"
    LOADING = "loading"
    WARMING = "warming"
    READY = "ready"
    FAILED = "failed"
    CLOSED = "closed"


_S = ModelState

#: state -> the states it may move to (see the module doc's table).
TRANSITIONS: dict[ModelState, frozenset[ModelState]] = {
    _S.NEW: frozenset({_S.LOADING, _S.FAILED, _S.CLOSED}),
    _S.LOADING: frozenset({_S.WARMING, _S.FAILED, _S.CLOSED}),
    _S.WARMING: frozenset({_S.READY, _S.FAILED, _S.CLOSED}),
    _S.READY: frozenset({_S.READY, _S.CLOSED}),
    _S.FAILED: frozenset({_S.LOADING, _S.FAILED, _S.CLOSED}),
    _S.CLOSED: frozenset({_S.CLOSED}),
}


class IllegalTransition(Internal):
    """A state change the table does not allow (a bug in the caller, never a user error)."""


def transition(current: ModelState, new: ModelState) -> ModelState:
    """``new`` if ``current -> new`` is allowed; else raise :class:`IllegalTransition`."""
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"version state cannot go from {current.value} to {new.value}")
    return new
