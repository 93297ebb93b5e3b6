"""Which model a runner serves: built-in names, ``module:Class`` paths, and names registered in
``CONDUIT_RUNNER_MODELS`` (how the test suite serves models the product does not ship)."""

from __future__ import annotations

import pytest

from runners.models import MODELS, get_model
from runners.models.echo import EchoModel
from tests.fixtures.faulty import REGISTRATION, FaultyModel


def test_built_in_names_and_import_paths() -> None:
    assert get_model("echo", {}) is EchoModel
    assert get_model("tests.fixtures.faulty:FaultyModel", {}) is FaultyModel


def test_names_registered_in_the_environment() -> None:
    assert get_model("faulty", {"CONDUIT_RUNNER_MODELS": f" {REGISTRATION} ,"}) is FaultyModel
    with pytest.raises(KeyError, match="known: echo, embeddings, files, vllm"):
        get_model("faulty", {})
    with pytest.raises(ValueError, match="name=module:Class"):
        get_model("echo", {"CONDUIT_RUNNER_MODELS": "faulty"})
    with pytest.raises(TypeError, match="not a runners.model.Model"):
        get_model("runners.models:MODELS", {})


def test_the_product_registers_no_test_models() -> None:
    assert all(target.startswith("runners.models.") for target in MODELS.values())
