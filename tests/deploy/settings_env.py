"""Which environment variables each Conduit process reads, taken from its settings classes.

Settings classes are found in the process's packages (every ``BaseSettings`` subclass), and a
class's variables follow pydantic-settings' rules: ``env_prefix`` + field name, or the
field's validation aliases instead (every choice of an ``AliasChoices``, the head of an
``AliasPath``), plus the prefixed name again when the class also validates by name.
``reads`` asks pydantic-settings itself, so the tests can prove that rule right.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from unittest import mock

from pydantic import AliasChoices, AliasPath
from pydantic_settings import BaseSettings, EnvSettingsSource

ROOT = Path(__file__).resolve().parents[2]

#: The packages whose settings each ``conduit`` subcommand reads (the image's entrypoint is
#: ``conduit``, so a container's first argument names its process).
PROCESS_PACKAGES: dict[str, tuple[str, ...]] = {
    "api": ("api", "lane", "tracker"),
    "director": ("director", "tracker"),
    # The gateway reads the lane's settings too, for when it joins the lane.
    "gateway": ("gateway", "lane", "tracker"),
    "runner": ("runners",),
    "migrate": ("api",),
}

#: Read from ``os.environ`` directly rather than through a settings class, by the CLI every
#: process starts from; each must still appear, quoted, in the file named.
DIRECT_READS: dict[str, str] = {"CONDUIT_LOG_LEVEL": "core/logs.py"}


@cache
def settings_classes(package: str) -> tuple[type[BaseSettings], ...]:
    """Every ``BaseSettings`` subclass defined in ``package``; only modules that mention
    ``BaseSettings`` are imported (a model's module may need a GPU library)."""
    found: list[type[BaseSettings]] = []
    for module_name in _modules_mentioning(package, "BaseSettings"):
        module = importlib.import_module(module_name)
        for _, member in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(member, BaseSettings)
                and member is not BaseSettings
                and member.__module__ == module_name
            ):
                found.append(member)
    return tuple(found)


def process_classes(process: str) -> tuple[type[BaseSettings], ...]:
    return tuple(c for package in PROCESS_PACKAGES[process] for c in settings_classes(package))


def env_names(settings: type[BaseSettings]) -> set[str]:
    config = settings.model_config
    prefix = config.get("env_prefix", "")
    prefix_aliases = config.get("env_prefix_target", "variable") in ("alias", "all")
    by_name = bool(config.get("populate_by_name") or config.get("validate_by_name"))
    names: set[str] = set()
    for field_name, field in settings.model_fields.items():
        aliases = _alias_heads(field.validation_alias)
        names.update(prefix + alias if prefix_aliases else alias for alias in aliases)
        if not aliases or by_name:
            names.add(prefix + field_name)
    if not config.get("case_sensitive", False):
        names = {name.upper() for name in names}
    return names


def process_env_names(process: str) -> set[str]:
    names = {name for settings in process_classes(process) for name in env_names(settings)}
    return names | set(DIRECT_READS)


def reads(settings: type[BaseSettings], name: str) -> bool:
    """Whether pydantic-settings fills any field of ``settings`` from variable ``name``."""
    with mock.patch.dict(os.environ, {name: "1"}, clear=True):
        return bool(EnvSettingsSource(settings)())


def _alias_heads(alias: str | AliasChoices | AliasPath | None) -> list[str]:
    if alias is None:
        return []
    if isinstance(alias, str):
        return [alias]
    if isinstance(alias, AliasPath):
        return [str(alias.path[0])]
    return [head for choice in alias.choices for head in _alias_heads(choice)]


def _modules_mentioning(package: str, name: str) -> Iterator[str]:
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        if any(
            isinstance(node, ast.Name | ast.Attribute) and _names(node, name)
            for node in ast.walk(tree)
        ):
            relative = path.relative_to(ROOT).with_suffix("")
            parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
            yield ".".join(parts)


def _names(node: ast.Name | ast.Attribute, name: str) -> bool:
    return (node.id if isinstance(node, ast.Name) else node.attr) == name
