"""The use-case layer over fakes: DataPlane routing and checks, ServedModel built from its parts.

Fast logic tests of our own code (tests/fakes.py); the real models and servers are tested in
tests/integration and tests/e2e."""

from __future__ import annotations

import json
import time

import pytest

from fakes import ANSWER, SIGNATURE, FailingManager, FakeManager
from processor.config import ModelConfig
from processor.dataplane import DataPlane
from processor.errors import DeadlineExceeded, InvalidArgument, NotFound, ProcessorError, StatusCode
from processor.request import PredictCall
from processor.served_model import ModelRegistry, ServedModel

CONFIG = ModelConfig(savedmodel_dir="/nonexistent")


class CountingManager(FakeManager):
    """A FakeManager that counts handle acquires."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.acquired = 0

    def acquire_handle(self, number=None):
        self.acquired += 1
        return super().acquire_handle()


def dataplane(*managers, labels=None) -> DataPlane:
    return DataPlane(ModelRegistry(ServedModel(m.name, CONFIG, manager=m, version_labels=labels) for m in managers))


def test_an_unknown_model_is_not_found_naming_it_and_how_many_are_served():
    with pytest.raises(NotFound, match=r"unknown model 'c'; this server serves 2 models\)$") as err:
        dataplane(FakeManager("a"), FakeManager("b")).predict(PredictCall("c", b"\x0a\x00"))
    assert "'a'" not in str(err.value) and "'b'" not in str(err.value)  # not which: any client reads it


def test_the_empty_wire_request_is_the_signature_ping_and_others_are_served():
    plane = dataplane(FakeManager("m"))
    ping = plane.predict(PredictCall("m", b""))
    assert ping.introspection and json.loads(ping.outputs) == SIGNATURE
    answered = plane.predict(PredictCall("m", b"\x0a\x01x"))
    assert answered.outputs == ANSWER and not answered.introspection


@pytest.mark.parametrize("code", [StatusCode.UNAVAILABLE, StatusCode.NOT_FOUND, StatusCode.INTERNAL])
def test_a_manager_failure_reaches_the_caller_with_its_code(code):
    with pytest.raises(ProcessorError) as info:
        dataplane(FailingManager("m", code)).predict(PredictCall("m", b"\x0a\x01x"))
    assert info.value.code == code


def test_a_passed_deadline_is_refused_before_the_model_is_touched():
    manager = CountingManager("m")
    with pytest.raises(DeadlineExceeded):
        dataplane(manager).predict(PredictCall("m", b"\x0a\x01x", deadline=time.monotonic() - 1))
    assert manager.acquired == 0


def test_version_labels_resolve_and_an_unknown_label_or_both_are_invalid():
    plane = dataplane(FakeManager("m"), labels={"stable": 3})
    with pytest.raises(InvalidArgument, match="Unrecognized servable version label"):
        plane.predict(PredictCall("m", b"\x0a\x01x", label="canary"))
    with pytest.raises(InvalidArgument, match="cannot be supplied"):
        plane.predict(PredictCall("m", b"\x0a\x01x", version=3, label="stable"))


def test_small_requests_run_in_place_only_where_the_group_serves_natively():
    """submit (an event loop's door) runs nothing of a group that holds the GIL: a Deferred for
    a thread, with no acquire spent on it; an unknown model is refused there and then."""
    from processor.dataplane import Deferred
    from processor.request import Work

    manager = CountingManager("m")
    plane = dataplane(manager)
    deferred = plane.submit(PredictCall("m", b"\x0a\x01x"), 8192)
    assert isinstance(deferred, Deferred) and manager.acquired == 0  # the plan said: a thread
    assert deferred.run().outputs == ANSWER and manager.acquired == 1
    assert isinstance(plane.submit(Work("m", 10, lambda: "ran"), 8192), Deferred)
    with pytest.raises(NotFound):
        plane.submit(PredictCall("nope", b"\x0a\x01x"), 8192)
    assert not plane.plan("m").native and plane.plan("nope") is None


class _NativeGroup:
    """A group whose engine runs whole requests natively; ``takes``: whether it takes this one."""

    from fakes import _Group as _base

    signature = _base.signature
    version = _base.version
    serves_natively = True
    takes = True

    def __init__(self) -> None:
        self.served: list[str] = []

    def serve(self, data, in_place=False):
        self.served.append("native" if in_place else "serve")
        return ANSWER if self.takes or not in_place else None

    def serve_reference(self, data):
        self.served.append("reference")
        return ANSWER


class NativeManager(CountingManager):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.group = _NativeGroup()
        self.released = 0
        manager = self

        class Handle:
            group = self.group

            def release(self) -> None:
                manager.released += 1
        self._handle = Handle

    def acquire_handle(self, number=None):
        self.acquired += 1
        return self._handle()

    def default_group(self):
        return self.group

    def follow_default(self, listener) -> None:
        listener(self.group)


def test_submit_runs_a_small_native_request_in_place_and_defers_the_rest_holding_its_version():
    """One acquire per call whatever path it takes: a request the engine declines on the loop
    goes to a thread holding the version it was routed to, which runs the reference path (the
    native one is not tried twice)."""
    from processor.dataplane import Deferred
    from processor.request import Work

    manager = NativeManager("m")
    plane = dataplane(manager)
    assert plane.submit(PredictCall("m", b"\x0a\x01x"), 8192).outputs == ANSWER
    assert (manager.acquired, manager.released, manager.group.served) == (1, 1, ["native"])
    assert isinstance(plane.submit(PredictCall("m", b"x" * 100), 10), Deferred)  # over the size
    assert manager.acquired == 1
    manager.group.takes = False
    deferred = plane.submit(PredictCall("m", b"\x0a\x01x"), 8192)
    assert isinstance(deferred, Deferred) and (manager.acquired, manager.released) == (2, 1)
    assert deferred.run().outputs == ANSWER
    assert (manager.acquired, manager.released) == (2, 2)
    assert manager.group.served == ["native", "native", "reference"]
    held = plane.submit(PredictCall("m", b"\x0a\x01x"), 8192)
    held.close()  # never run (the pool refused it): its version is released, once
    held.close()
    assert (manager.acquired, manager.released) == (3, 3)
    assert plane.submit(Work("m", 10, lambda: "ran"), 8192) == "ran"  # decoded on the loop: in place
    assert isinstance(plane.submit(Work("m", 10, lambda: "ran"), 5), Deferred)


def test_a_served_model_is_built_from_its_parts_and_delegates_to_its_manager():
    manager = FakeManager("m")
    manager.stats = {"full_loads": 1}
    model = ServedModel("m", CONFIG, manager=manager, version_labels={"stable": 1}, threads=3)
    assert (model.tracer, model.batching, model.prediction_log) == (None, None, None)
    assert model.stats == {"full_loads": 1} and model.ready and model.state == "ready"
    info = model.info()
    assert info["inference_threads"] == 3 and info["version_labels"] == {"stable": 1}
    assert info["tf_serving_version"] is None and "timeline" not in info and "prediction_log" not in info
    model.rollback()
    model.rollback(7)
    model.unpin()
    model.reload()
    assert manager.actions == ["rollback", "pin 7", "unpin", "reload"]
    model.close()


def test_plain_says_when_a_call_needs_nothing_but_the_default_group():
    """The C ABI's direct path bypasses the DataPlane only for a model that is plain: no
    timeline, no prediction log, no shadow, no traffic split."""
    from processor.routing import RoutingSettings

    class Tracer:
        done = False

    models = {
        "plain": ServedModel("plain", CONFIG, manager=FakeManager("plain")),
        "traced": ServedModel("traced", CONFIG, manager=FakeManager("traced"), tracer=Tracer()),
        "logged": ServedModel("logged", CONFIG, manager=FakeManager("logged"), prediction_log=object()),
        "split": ServedModel("split", CONFIG, manager=FakeManager("split"), routing=RoutingSettings(
            version_labels={"a": 1, "b": 2}, traffic={"a": 90, "b": 10})),
        "shadowed": ServedModel("shadowed", CONFIG, manager=FakeManager("shadowed"), routing=RoutingSettings(
            version_labels={"canary": 2}, shadow={"label": "canary", "fraction": 0.5})),
    }
    plane = DataPlane(ModelRegistry(models.values()))
    assert {name: plane.plan(name).plain for name in models} == {
        "plain": True, "traced": False, "logged": False, "split": False, "shadowed": False}
    assert plane.plan("unknown") is None


def test_the_plan_is_published_afresh_when_the_routing_changes():
    """A shadow set at run time (the admin API) takes the model off the plain path at once."""
    model = ServedModel("m", CONFIG, manager=FakeManager("m"), version_labels={"canary": 1})
    plane = DataPlane(ModelRegistry([model]))
    seen = []
    plane.follow_plan("m", lambda plan: seen.append(plan.plain))
    model.router.update({"shadow": {"label": "canary"}}, require_served=False)
    assert seen == [True, False] and not plane.plan("m").plain
    model.router.update({"shadow": None}, require_served=False)
    assert plane.plan("m").plain and seen == [True, False, True]
