"""``conduit config [PROCESS]``: the settings a process would run with, read from the
environment as it would read them, one ``NAME=value`` line per setting under its class;
secrets masked (fields kept out of ``repr``, names that say token, secret, password or key,
and the password of a URL)."""

from __future__ import annotations

import enum
import json
import os
import re
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from conduit.outages import masked_url

MASK = "***"
_SECRET = re.compile(r"(token|secret|password|(^|_)key($|_))", re.IGNORECASE)


def is_secret(field_name: str, field: FieldInfo) -> bool:
    return field.repr is False or bool(_SECRET.search(field_name))


def shown(value: Any, secret: bool) -> str:
    """A value as an environment variable would spell it."""
    if value is None or value == "":
        return ""
    if secret:
        return MASK
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return masked_url(value) if "://" in value else value
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, default=str)


def settings_lines(settings: type[BaseSettings]) -> list[str]:
    from conduit.settings_catalog import field_env_names

    try:
        instance = settings()
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        return [f"# cannot be read: {where}: {problem['msg']}"]
    lines = []
    for name, field in settings.model_fields.items():
        env = _display_name(field_env_names(settings, name, field))
        lines.append(f"{env}={shown(getattr(instance, name), is_secret(name, field))}")
    return lines


def _display_name(names: list[str]) -> str:
    """The name the docs use: a ``CONDUIT_*`` one (or a shared URL's) where the field has one."""
    return next((n for n in names if n.startswith("CONDUIT_") or n.endswith("_URL")), names[0])


def render(processes: Iterable[str]) -> str:
    from conduit.settings_catalog import DIRECT_READS, process_classes

    blocks = []
    done: set[type[BaseSettings]] = set()
    for process in processes:
        for settings in process_classes(process):
            if settings in done:
                continue
            done.add(settings)
            header = f"# {process}: {settings.__module__}.{settings.__qualname__}"
            blocks.append("\n".join([header, *settings_lines(settings)]))
    direct = [f"{name}={os.environ.get(name, '')}" for name in sorted(DIRECT_READS)]
    blocks.append("\n".join(["# every process (read by the command line)", *direct]))
    return "\n\n".join(blocks)
