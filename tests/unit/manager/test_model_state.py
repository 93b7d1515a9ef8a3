"""The version state machine: the allowed transitions (written out here, independently of the
table), refusals, the string values model info reports, TF Serving's state names."""

from __future__ import annotations

import itertools
import json

import pytest

from processor.errors import StatusCode
from processor.manager.model_state import TRANSITIONS, IllegalTransition, ModelState, transition
from server.tfserving import status as tfserving

S = ModelState
ALLOWED = {
    (S.NEW, S.LOADING), (S.NEW, S.FAILED), (S.NEW, S.CLOSED),
    (S.LOADING, S.WARMING), (S.LOADING, S.FAILED), (S.LOADING, S.CLOSED),
    (S.WARMING, S.READY), (S.WARMING, S.FAILED), (S.WARMING, S.CLOSED),
    (S.READY, S.READY), (S.READY, S.CLOSED),
    (S.FAILED, S.LOADING), (S.FAILED, S.FAILED), (S.FAILED, S.CLOSED),
    (S.CLOSED, S.CLOSED),
}
PAIRS = list(itertools.product(S, S))


@pytest.mark.parametrize("current, new", PAIRS, ids=[f"{a.value}->{b.value}" for a, b in PAIRS])
def test_transition(current, new):
    if (current, new) in ALLOWED:
        assert transition(current, new) is new
    else:
        with pytest.raises(IllegalTransition, match=f"from {current.value} to {new.value}") as err:
            transition(current, new)
        assert err.value.code == StatusCode.INTERNAL


def test_the_table_covers_every_state():
    assert set(TRANSITIONS) == set(S)


def test_closed_is_final_and_reachable_from_everywhere():
    assert TRANSITIONS[S.CLOSED] == {S.CLOSED}
    assert all(S.CLOSED in TRANSITIONS[s] for s in S)


def test_values_are_the_strings_model_info_reports():
    assert [s.value for s in S] == ["new", "loading", "warming", "ready", "failed", "closed"]
    assert S.READY == "ready" and f"{S.READY}" == "ready" and str(S.FAILED) == "failed"
    assert json.dumps({"state": S.WARMING}) == '{"state": "warming"}'


class _Manager:
    name = "m"

    def __init__(self, state, last_error=None):
        self.state, self.last_error = state, last_error

    def served_version(self):
        return None


@pytest.mark.parametrize("state, name", [
    (S.NEW, "START"), (S.LOADING, "LOADING"), (S.WARMING, "LOADING"), (S.READY, "AVAILABLE"),
    (S.FAILED, "END"), (S.CLOSED, "END"),
    ("ready", "AVAILABLE"), ("failed", "END"),  # a plain string (a fake manager's) maps the same
    ("unheard-of", "UNKNOWN"),
])
def test_tf_serving_state_names(state, name):
    [status] = tfserving.model_status(_Manager(state), None)
    assert (status.version, status.state, status.error_code) == (0, name, "OK")


def test_tf_serving_status_carries_the_error():
    [status] = tfserving.model_status(_Manager(S.FAILED, "no version yet"), None)
    assert (status.state, status.error_code, status.error_message) == ("END", "UNKNOWN", "no version yet")
