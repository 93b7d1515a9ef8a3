"""``allow_version_labels_for_unavailable_models`` (TF Serving's flag of that name, false by default
under ``tensorflow_model_server``): false, a label naming a version that does not serve is not
applied: dropped from a model that loads (TF Serving's error logged), refused on a reload that
changes only the labels (the running labels kept). True, ours: such a label waits for its
version. Over fake managers (no engine)."""

from __future__ import annotations

import logging

import pytest

from fakes import FakeStore, fake_manager, fake_models
from server.settings import DeploymentConfig


def runtime(allow: bool, labels: dict[str, int]):
    from server.runtime import ServingRuntime

    store = FakeStore(fulls=[10])
    deployment = DeploymentConfig.from_dict({
        "models": [{"name": "m", "model_config": {"savedmodel_dir": store.savedmodel_dir}, "version_labels": labels}],
        "allow_version_labels_for_unavailable_models": allow, "access_log": False})
    rt = ServingRuntime(deployment, fake_models(deployment, {"m": fake_manager(store)}))
    return rt, rt.model("m")


@pytest.mark.parametrize("allow, kept", [(False, {"stable": 10}), (True, {"stable": 10, "next": 11})])
def test_a_loading_model_keeps_only_labels_of_served_versions_unless_allowed(allow, kept, caplog):
    rt, model = runtime(allow, {"stable": 10, "next": 11})
    with caplog.at_level(logging.ERROR, logger="server"):
        assert rt.start_model(model) is None
    assert dict(model.version_labels) == kept
    said = "Request to assign label to version 11 of model m, which is not currently available for inference"
    assert (said in caplog.text) == (not allow)
    rt.close()


@pytest.mark.parametrize("allow", [False, True])
def test_a_reload_of_labels_naming_an_unserved_version(allow):
    rt, model = runtime(allow, {"stable": 10})
    assert rt.start_model(model) is None
    new = rt.deployment.model_copy(update={"models": (rt.deployment.models[0].model_copy(
        update={"version_labels": {"stable": 10, "next": 11}}),)})
    report = rt.model_set.apply(new, "test")
    if allow:
        assert report["routing"] == ["m"] and dict(model.version_labels) == {"stable": 10, "next": 11}
    else:
        assert "next names version 11, which is not served" in report["failed"]["m"]
        assert dict(model.version_labels) == {"stable": 10}
    rt.close()
