"""The ``context_inputs`` and ``context_cache`` keys of a model_config: strict, named in errors."""

from __future__ import annotations

import pytest

from processor.config import ModelConfig
from processor.errors import ConfigError


def config(**keys):
    return ModelConfig.from_dict({"savedmodel_dir": "/m", **keys})


def test_context_keys_are_typed():
    c = config(context_inputs=["user_seq", " user_dense "], context_cache={"max_entries": 100, "ttl_ms": 5000})
    assert c.context_inputs == ("user_seq", "user_dense")
    assert (c.context_cache.max_entries, c.context_cache.ttl_ms) == (100, 5000)
    assert config().context_inputs is None and config().context_cache is None


@pytest.mark.parametrize("keys, message", [
    ({"context_inputs": "user"}, "context_inputs"),
    ({"context_inputs": []}, "context_inputs"),
    ({"context_inputs": ["a", "a"]}, "names an input twice"),
    ({"context_inputs": ["a"], "context_cache": {"max_entries": "10"}}, "context_cache.max_entries"),
    ({"context_inputs": ["a"], "context_cache": {"max_entries": 0}}, "context_cache.max_entries"),
    ({"context_inputs": ["a"], "context_cache": {"max_entries": 1, "ttl": 5}}, "context_cache.ttl"),
    ({"context_inputs": ["a"], "context_cache": {}}, "context_cache.max_entries"),
    ({"context_cache": {"max_entries": 10}}, "context_cache: needs context_inputs"),
])
def test_bad_context_keys_are_refused_by_name(keys, message):
    with pytest.raises(ConfigError) as err:
        config(**keys)
    assert message in str(err.value)
