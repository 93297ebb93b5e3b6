"""Which environment variables each Conduit process reads, taken from its settings classes.

Settings classes are found in the process's packages (every ``BaseSettings`` subclass), and a
class's variables follow pydantic-settings' rules: ``env_prefix`` + field name, or the
field's validation aliases instead (every choice of an ``AliasChoices``, the head of an
``AliasPath``), plus the prefixed name again when the class also validates by name (unless
its environment source reads aliases alone: ``ENV_BY_ALIAS_ONLY``). The
settings reference (``conduit.settings_doc``) and the tests of ``.env.example`` and of the
deployment kits read them from here; ``tests/deploy/settings_env.py`` proves the rule against
pydantic-settings itself.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from pydantic import AliasChoices, AliasPath
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[1]

#: The packages whose settings each ``conduit`` subcommand reads (the image's entrypoint is
#: ``conduit``, so a container's first argument names its process).
PROCESS_PACKAGES: dict[str, tuple[str, ...]] = {
    "api": ("api", "front", "lane", "tracker", "catalog", "files", "blocks"),
    "director": ("director", "tracker", "catalog", "files"),
    # The gateway reads the lane's settings too, for when it joins the lane.
    "gateway": ("gateway", "front", "lane", "tracker", "catalog", "files", "blocks"),
    "runner": ("runners",),
    "migrate": ("api",),
}

#: Read from ``os.environ`` directly rather than through a settings class, by the CLI every
#: process starts from; each must still appear, quoted, in the file named.
DIRECT_READS: dict[str, str] = {
    "CONDUIT_LOG_LEVEL": "core/logs.py",
    "CONDUIT_LOG_FORMAT": "core/logs.py",
    "CONDUIT_RUNNER_MODELS": "runners/models/__init__.py",
}


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


def processes_reading(settings: type[BaseSettings]) -> list[str]:
    """The ``conduit`` subcommands whose processes read ``settings``."""
    return [p for p in PROCESS_PACKAGES if settings in process_classes(p)]


def field_env_names(settings: type[BaseSettings], field_name: str, field: FieldInfo) -> list[str]:
    """The variables one field is read from, in the order pydantic-settings tries them."""
    config = settings.model_config
    prefix = config.get("env_prefix", "")
    prefix_aliases = config.get("env_prefix_target", "variable") in ("alias", "all")
    by_name = bool(config.get("populate_by_name") or config.get("validate_by_name"))
    if getattr(settings, "ENV_BY_ALIAS_ONLY", False):
        by_name = False  # its environment source reads aliases alone (``runners.config``)
    aliases = _alias_heads(field.validation_alias)
    names = [prefix + alias if prefix_aliases else alias for alias in aliases]
    if not aliases or by_name:
        names.append(prefix + field_name)
    if not config.get("case_sensitive", False):
        names = [name.upper() for name in names]
    return list(dict.fromkeys(names))


def env_names(settings: type[BaseSettings]) -> set[str]:
    return {
        name
        for field_name, field in settings.model_fields.items()
        for name in field_env_names(settings, field_name, field)
    }


def process_env_names(process: str) -> set[str]:
    names = {name for settings in process_classes(process) for name in env_names(settings)}
    return names | set(DIRECT_READS)


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
        text = path.read_text()
        if name not in text:  # most modules: no parse (every process start asks, env_check)
            continue
        tree = ast.parse(text, str(path))
        if any(
            isinstance(node, ast.Name | ast.Attribute) and _names(node, name)
            for node in ast.walk(tree)
        ):
            relative = path.relative_to(ROOT).with_suffix("")
            parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
            yield ".".join(parts)


def _names(node: ast.Name | ast.Attribute, name: str) -> bool:
    return (node.id if isinstance(node, ast.Name) else node.attr) == name
