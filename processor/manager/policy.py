"""The version policy: what to do when the store names a version. Pure functions, no I/O.

:func:`next_action` decides, for the version the store (or a pin) names now, against the one
served, the failures recorded and the pin:

======================================================  ==================  ====================
case (first match wins)                                 action              the manager then
======================================================  ==================  ====================
``target == served``                                    ``NOTHING``         does nothing
a pin is set and ``target`` is not the pinned version   ``SKIP_PINNED``     does nothing (the
(discovered before the pin)                                                 pin decides)
``target`` failed and its retry is not due yet          ``SKIP_FAILED``     does nothing
nothing served                                          ``LOAD_FULL``       loads a new group
``target`` is not ``served`` plus newer deltas on the   ``LOAD_FULL``       loads a new group,
same full (another full, run, older delta, or a chain                       swaps it in
that does not extend the served one)
otherwise                                               ``APPLY_DELTA``     applies the newer
                                                                            deltas in place
======================================================  ==================  ====================

A failed version is retried with exponential backoff (:func:`retry_delay`: the poll interval,
at least 1 s, doubled per attempt, at most :data:`MAX_BACKOFF_SECONDS`); a newer version is not
in the failures, so it is tried at once. Every load or delta that serves a version clears its
failure. TF Serving's rule instead, where a model sets it (``max_num_load_retries``,
``load_retry_interval_micros``, :class:`Retries`): every ``interval`` seconds, and after
``max_retries`` retries the version is given up (``retry_at`` infinite: never tried again).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from ..store.model_version import ModelVersion

MAX_BACKOFF_SECONDS = 300.0


class Action(StrEnum):
    """What :func:`next_action` asks the manager to do."""

    NOTHING = "nothing"
    SKIP_PINNED = "skip_pinned"
    SKIP_FAILED = "skip_failed"
    LOAD_FULL = "load_full"
    APPLY_DELTA = "apply_delta"


@dataclass(frozen=True)
class Retries:
    """How a failed version is retried: ``max_retries`` times after the first failure (None: for
    ever), every ``interval`` seconds (None: the backoff of :func:`retry_delay`)."""

    max_retries: int | None = None
    interval: float | None = None


@dataclass(frozen=True)
class Failure:
    """A version that failed: how often, when it may be tried again, and the last error."""

    attempts: int
    retry_at: float  # infinite: given up
    error: str

    @property
    def given_up(self) -> bool:
        return math.isinf(self.retry_at)


def needs_full_load(served: ModelVersion, target: ModelVersion) -> bool:
    """True unless ``target`` is ``served`` plus newer deltas on the same full checkpoint (for
    chained deltas: the links served must be the start of the target's chain)."""
    if (served.full_prefix != target.full_prefix or served.full_step != target.full_step
            or target.delta_step < served.delta_step):
        return True
    return len(target.delta_chain) > 1 and target.delta_chain[:len(served.delta_chain)] != served.delta_chain


def next_action(served: ModelVersion | None, target: ModelVersion,
                failures: Mapping[ModelVersion, Failure], pin: ModelVersion | None,
                now: float) -> Action:
    """See the module doc's table. ``now`` is on the clock ``Failure.retry_at`` was set on."""
    if served == target:
        return Action.NOTHING
    if pin is not None and target != pin:
        return Action.SKIP_PINNED
    failure = failures.get(target)
    if failure is not None and now < failure.retry_at:
        return Action.SKIP_FAILED
    if served is None or needs_full_load(served, target):
        return Action.LOAD_FULL
    return Action.APPLY_DELTA


def retry_delay(attempts: int, poll_interval: float) -> float:
    """Seconds before a version that failed ``attempts`` times is tried again."""
    return min(max(poll_interval, 1.0) * 2 ** (attempts - 1), MAX_BACKOFF_SECONDS)


def record_failure(previous: Failure | None, error: str, now: float, poll_interval: float,
                   retries: Retries = Retries()) -> Failure:
    """The failure record after one more failed attempt (``previous``: the record so far)."""
    attempts = previous.attempts + 1 if previous else 1
    if retries.max_retries is not None and attempts > retries.max_retries:
        return Failure(attempts, math.inf, error)
    delay = retries.interval if retries.interval is not None else retry_delay(attempts, poll_interval)
    return Failure(attempts, now + delay, error)
