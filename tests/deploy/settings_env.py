"""Which environment variables each Conduit process reads: the rule is
``conduit.settings_catalog``'s (re-exported here for the tests); ``reads`` asks
pydantic-settings itself, so the tests can prove that rule right.
"""

from __future__ import annotations

import os
from unittest import mock

from pydantic_settings import BaseSettings, EnvSettingsSource

from conduit.settings_catalog import (
    DIRECT_READS,
    PROCESS_PACKAGES,
    ROOT,
    env_names,
    field_env_names,
    process_classes,
    process_env_names,
    settings_classes,
)

__all__ = [
    "DIRECT_READS",
    "PROCESS_PACKAGES",
    "ROOT",
    "env_names",
    "field_env_names",
    "process_classes",
    "process_env_names",
    "reads",
    "settings_classes",
]


def reads(settings: type[BaseSettings], name: str) -> bool:
    """Whether pydantic-settings fills any field of ``settings`` from variable ``name``."""
    with mock.patch.dict(os.environ, {name: "1"}, clear=True):
        return bool(EnvSettingsSource(settings)())
