""".env.example names every setting of every process, and loads as it stands (empty values
mean "the default")."""

from __future__ import annotations

import os
from unittest import mock

from dotenv import dotenv_values
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from tests.deploy import settings_env

EXAMPLE = settings_env.ROOT / ".env.example"

#: Read outside the settings classes, each quoted in the file named.
OTHER_READS = {
    **settings_env.DIRECT_READS,
    "PORT": "conduit/cli.py",  # the runner's --port default, as Cog's
    "COG_MAX_CONCURRENCY": "runners/__main__.py",  # its --concurrency default
    "CONDUIT_FAULTY_RECORD": "tests/fixtures/faulty.py",  # the test model's record
}


def _example() -> dict[str, str | None]:
    return dotenv_values(EXAMPLE)


def _classes() -> set[type[BaseSettings]]:
    return {c for p in settings_env.PROCESS_PACKAGES for c in settings_env.process_classes(p)}


def _field_names(settings: type[BaseSettings], name: str, field: FieldInfo) -> set[str]:
    """The variables one field is read from (as ``settings_env.env_names`` says for all)."""
    return set(settings_env.field_env_names(settings, name, field))


def test_every_setting_is_listed() -> None:
    listed = set(_example())
    for settings in _classes():
        for name, field in settings.model_fields.items():
            names = _field_names(settings, name, field)
            assert names & listed, f"{settings.__name__}.{name}: none of {sorted(names)}"


def test_every_listed_name_is_read() -> None:
    classes = _classes()
    for name in _example():
        if name in OTHER_READS:
            assert f'"{name}"' in (settings_env.ROOT / OTHER_READS[name]).read_text(), name
        else:
            assert any(settings_env.reads(c, name) for c in classes), f"{name} is read by none"


def test_the_example_loads_with_every_settings_class() -> None:
    values = {k: v or "" for k, v in _example().items()}
    with mock.patch.dict(os.environ, values, clear=True):
        for settings in _classes():
            settings()
