"""The version policy, the VersionRouter (labels, a sticky weighted split, runtime updates) and
the ShadowRunner (bounded, shed when busy, never blocking the offering thread)."""

import threading
import time

import pytest

from processor.config import ModelConfig
from processor.errors import ConfigError, InvalidArgument
from processor.request import PredictCall
from processor.routing import RoutingSettings, VersionRouter, key_point
from processor.shadow import ShadowRunner
from sp_checks import wait_for


# --- policy --------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy, want", [
    (None, [7]), ({"latest": {"num_versions": 2}}, [5, 7]), ({"all": {}}, [1, 5, 7]),
    ({"specific": {"versions": [1, 9]}}, [1])])
def test_each_policy_selects(policy, want):
    extra = {} if policy is None else {"model_version_policy": policy}
    assert ModelConfig.from_dict({"savedmodel_dir": "/m", **extra}).model_version_policy.select([7, 1, 5]) == want


@pytest.mark.parametrize("policy, key", [
    ({"latest": {}, "all": {}}, "model_version_policy"), ({"latest": {"num_versions": 0}}, "num_versions"),
    ({"specific": {"versions": ["1"]}}, "versions"), ({"specific": {"versions": [1, 1]}}, "distinct"),
    ({"newest": {}}, "newest")])
def test_a_bad_policy_names_the_key(policy, key):
    with pytest.raises(ConfigError, match=key):
        ModelConfig.from_dict({"savedmodel_dir": "/m", "model_version_policy": policy})


# --- router --------------------------------------------------------------------------------------

def router(serves=(1, 2), **settings) -> VersionRouter:
    return VersionRouter("m", RoutingSettings(**settings), serves=lambda n: n in serves)


def test_labels_resolve_and_both_or_an_unknown_label_are_invalid():
    r = router(version_labels={"stable": 1})
    assert r.resolve(None, "stable") == 1 and r.resolve(3, None) == 3 and r.resolve(None, None) is None
    with pytest.raises(InvalidArgument, match="Unrecognized servable version label: canary"):
        r.resolve(None, "canary")
    with pytest.raises(InvalidArgument, match="cannot be supplied"):
        r.resolve(1, "stable")


def test_the_split_is_sticky_weighted_and_falls_back_to_the_default():
    r = router(version_labels={"stable": 1, "canary": 2}, traffic={"stable": 95, "canary": 5})
    arms = [r.choose(f"user-{i}") for i in range(100_000)]
    assert abs(sum(a == (2, "canary") for a in arms) / len(arms) - 0.05) <= 0.005
    assert all(r.choose(f"user-{i}") == arms[i] for i in range(0, 100_000, 997))
    assert key_point("user-1") == key_point("user-1")  # BLAKE2b: the same in every process
    gone = router(serves=(1,), version_labels={"stable": 1, "canary": 2}, traffic={"canary": 1})
    assert gone.choose("anyone") is None  # the arm's version is not served: the default answers
    assert router().choose("x") is None  # no split


def test_an_update_is_validated_whole_against_the_served_versions():
    r = router(version_labels={"stable": 1, "canary": 2})
    with pytest.raises(InvalidArgument, match="label canary names version 7, which is not served"):
        r.update({"version_labels": {"stable": 1, "canary": 7}, "traffic": {"stable": 1}})
    assert r.routing.settings.version_labels == {"stable": 1, "canary": 2} and r.routing.arms == ()
    with pytest.raises(InvalidArgument, match="neither a version number nor one of the labels"):
        r.update({"traffic": {"beta": 1}})
    with pytest.raises(InvalidArgument, match="add up to more than 0"):
        r.update({"traffic": {"stable": 0}})
    with pytest.raises(InvalidArgument, match="unknown routing key"):
        r.update({"weights": {}})
    r.update({"traffic": {"2": 1}, "shadow": {"label": "stable"}})
    assert r.choose("k") == (2, "2") and r.routing.shadow == 1
    r.update({"shadow": None})
    assert r.routing.shadow is None
    assert router(serves=(1,), version_labels={"x": 9}).dangling() == {"label x": 9}


# --- shadow --------------------------------------------------------------------------------------

CALL = PredictCall("m", memoryview(b"\x0a\x00"))


def test_copies_run_on_the_shadow_version_with_the_caller_s_buffer_copied():
    ran = []
    runner = ShadowRunner("m", ran.append)
    assert runner.offer(CALL, 2, 1.0, 10)
    assert wait_for(lambda: len(ran) == 1, 5)
    assert ran[0].version == 2 and ran[0].inputs.__class__ is bytes and ran[0].deadline is None
    runner.close()
    assert runner.stats()["ran"] == 1


def test_a_full_queue_drops_and_the_offering_thread_never_waits():
    release = threading.Event()
    runner = ShadowRunner("m", lambda call: release.wait(10))
    started = time.perf_counter()
    outcomes = [runner.offer(CALL, 2, 1.0, 3) for _ in range(50)]
    assert time.perf_counter() - started < 1.0  # never blocked by the stuck copy
    assert sum(outcomes) <= 4 and runner.stats()["dropped"] >= 46
    release.set()
    runner.close()


def test_copies_are_shed_while_busy():
    ran = []
    runner = ShadowRunner("m", ran.append)
    busy = [True]
    runner.busy = lambda: busy[0]
    assert not runner.offer(CALL, 2, 1.0, 10)
    busy[0] = False
    assert runner.offer(CALL, 2, 1.0, 10)
    assert wait_for(lambda: len(ran) == 1, 5)
    assert runner.stats()["shed"] == 1 and not runner.offer(CALL, 2, 0.0, 10)  # fraction 0: never
    runner.close()
