"""The version policy, table-tested: next_action, needs_full_load, the retry backoff."""

from __future__ import annotations

import pytest

from processor.manager.policy import (MAX_BACKOFF_SECONDS, Action, Failure, needs_full_load, next_action,
                                      record_failure, retry_delay)
from processor.store.model_version import ModelVersion

RUN = "/run"


def full(step: int, run: str = RUN) -> ModelVersion:
    return ModelVersion(step, -1, full_prefix=f"{run}/model.ckpt-{step}", run_dir=run)


def delta(full_step: int, *steps: int, run: str = RUN) -> ModelVersion:
    """``full_step`` plus the deltas ``steps`` (a chain when more than one)."""
    chain = tuple((s, f"{run}/.incremental_checkpoint/incremental_model.ckpt-{s}") for s in steps)
    return ModelVersion(full_step, steps[-1], full_prefix=f"{run}/model.ckpt-{full_step}",
                        delta_prefix=chain[-1][1], run_dir=run, delta_chain=chain)


SAVEDMODEL = ModelVersion(-1, -1, savedmodel_dir="/sm")
NOW = 100.0
DUE = {delta(10, 12): Failure(1, NOW, "e")}  # retry due exactly now
LATER = {delta(10, 12): Failure(1, NOW + 1, "e")}

# (case, served, target, failures, pin, action)
CASES = [
    ("same version", full(10), full(10), {}, None, Action.NOTHING),
    ("same version, failed once", full(10), full(10), LATER, None, Action.NOTHING),
    ("same pinned version", full(10), full(10), {}, full(10), Action.NOTHING),
    ("nothing served", None, full(10), {}, None, Action.LOAD_FULL),
    ("nothing served, a savedmodel", None, SAVEDMODEL, {}, None, Action.LOAD_FULL),
    ("newer full", full(10), full(20), {}, None, Action.LOAD_FULL),
    ("older full", full(20), full(10), {}, None, Action.LOAD_FULL),
    ("same step, another run", full(10), full(10, run="/run2"), {}, None, Action.LOAD_FULL),
    ("a delta on the served full", full(10), delta(10, 12), {}, None, Action.APPLY_DELTA),
    ("a newer delta on the served full", delta(10, 12), delta(10, 14), {}, None, Action.APPLY_DELTA),
    ("an older delta", delta(10, 14), delta(10, 12), {}, None, Action.LOAD_FULL),
    ("the full alone after a delta", delta(10, 12), full(10), {}, None, Action.LOAD_FULL),
    ("a delta of a newer full", delta(10, 12), delta(20, 22), {}, None, Action.LOAD_FULL),
    ("a chain extending the served one", delta(10, 11, 12), delta(10, 11, 12, 13), {}, None, Action.APPLY_DELTA),
    ("a chain not extending the served one", delta(10, 11, 12), delta(10, 11, 13), {}, None, Action.LOAD_FULL),
    ("pinned elsewhere: stale discovery", full(10), full(20), {}, full(10), Action.SKIP_PINNED),
    ("pinned elsewhere, nothing served", None, full(20), {}, full(10), Action.SKIP_PINNED),
    ("the pinned version, not served yet", full(20), full(10), {}, full(10), Action.LOAD_FULL),
    ("failed, retry not due", full(10), delta(10, 12), LATER, None, Action.SKIP_FAILED),
    ("failed, retry due", full(10), delta(10, 12), DUE, None, Action.APPLY_DELTA),
    ("failed, nothing served, not due", None, delta(10, 12), LATER, None, Action.SKIP_FAILED),
    ("another version failed: a newer one is tried", full(10), delta(10, 14), LATER, None, Action.APPLY_DELTA),
    ("pinned elsewhere wins over failed", full(10), delta(10, 12), LATER, full(10), Action.SKIP_PINNED),
]


@pytest.mark.parametrize("case, served, target, failures, pin, action", CASES, ids=[c[0] for c in CASES])
def test_next_action(case, served, target, failures, pin, action):
    assert next_action(served, target, failures, pin, NOW) is action


def test_every_action_is_in_the_table():
    assert {c[-1] for c in CASES} == set(Action)


@pytest.mark.parametrize("served, target, full_load", [
    (full(10), delta(10, 12), False),
    (delta(10, 12), delta(10, 12), False),  # the same (next_action answers NOTHING before asking)
    (delta(10, 12), delta(10, 13), False),  # cumulative: one link, replaces the served delta
    (delta(10, 13), delta(10, 12), True),
    (full(10), full(11), True),
    (full(10, run="/a"), full(10, run="/b"), True),
    (delta(10, 11), delta(10, 11, 12), False),
    (full(10), delta(10, 11, 12), False),
    (delta(10, 11, 12), delta(10, 11, 13), True),
    (delta(10, 11, 12), delta(10, 12, 13), True),
])
def test_needs_full_load(served, target, full_load):
    assert needs_full_load(served, target) is full_load


@pytest.mark.parametrize("attempts, interval, delay", [
    (1, 2.0, 2.0), (2, 2.0, 4.0), (3, 2.0, 8.0),
    (1, 0.2, 1.0), (2, 0.0, 2.0),  # at least 1 s, whatever the poll interval
    (20, 2.0, MAX_BACKOFF_SECONDS),
])
def test_retry_delay(attempts, interval, delay):
    assert retry_delay(attempts, interval) == delay


def test_record_failure_counts_attempts_and_backs_off():
    first = record_failure(None, "bad", NOW, 2.0)
    assert first == Failure(1, NOW + 2.0, "bad")
    second = record_failure(first, "worse", NOW + 5, 2.0)
    assert second == Failure(2, NOW + 5 + 4.0, "worse")
