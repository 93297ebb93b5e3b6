"""A runner reads its settings by their documented names only: the api's ``TOKEN`` or the dev
stack's ``REDIS_URL`` in the same shell are not its runner token or its Redis."""

from __future__ import annotations

import pytest

from runners.config import RunnerConfig

TOKEN = "r8_" + "a" * 30


def test_bare_field_names_in_the_environment_are_not_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("CONDUIT_RUNNER_TOKEN", "CONDUIT_RUNNER_REDIS_URL", "MAX_QUEUE_DEPTH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TOKEN", TOKEN)
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("MAX_QUEUE_DEPTH", "3")
    config = RunnerConfig()
    assert config.token is None
    assert config.redis_url is None
    assert config.max_queue_depth == 3  # its documented name


def test_documented_names_and_keywords_still_set_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONDUIT_RUNNER_TOKEN", TOKEN)
    assert RunnerConfig().token == TOKEN
    assert RunnerConfig(token="b" * 20).token == "b" * 20
    monkeypatch.setenv("WEBHOOK_TIMEOUT", "3")  # a setting whose name is its field's
    assert RunnerConfig().webhook_timeout == 3.0
