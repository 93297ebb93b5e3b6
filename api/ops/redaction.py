"""Input fields the operator page never shows (``CONDUIT_API_OPS_REDACT``): secrets a client
put in an input are no operator's business, and a screenshot of the page is no leak."""

from __future__ import annotations

import functools
from typing import Any

MASK = "[redacted]"


@functools.lru_cache(maxsize=8)
def _names(setting: str) -> frozenset[str]:
    return frozenset(name.strip().lower() for name in setting.split(",") if name.strip())


def redacted(value: Any, setting: str) -> Any:
    """``value`` with every field named in ``setting`` (comma-separated, any case, at any
    depth) replaced by ``[redacted]``."""
    names = _names(setting)
    if not names:
        return value

    def walk(item: Any) -> Any:
        if isinstance(item, dict):
            return {k: MASK if str(k).lower() in names else walk(v) for k, v in item.items()}
        if isinstance(item, list):
            return [walk(v) for v in item]
        return item

    return walk(value)
