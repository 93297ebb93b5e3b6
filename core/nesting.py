"""How deep a JSON value from outside may nest: the one rule every entry applies before it walks,
stores or re-encodes what it was sent (a prediction's or training's input, a file's metadata, a
registry document, a named graph, a gateway task's fields).

Past a few hundred levels a recursive walk (a check, a validator, an encoder: orjson stops at
255) fails with a ``RecursionError``, an answer of 500. So the depth is measured first, here,
without recursion, and a value deeper than :data:`MAX_DEPTH` is refused naming the first field
found too deep. The value itself is level 1; each list or object inside adds one.
"""

from __future__ import annotations

import json
from typing import Any

#: Deepest nesting any entry takes (the value itself is level 1).
MAX_DEPTH = 64
#: The most a setting may raise it to (``CONDUIT_API_MAX_INPUT_DEPTH``); what a body's first
#: check holds it to before the configured depth is known.
DEPTH_CEILING = 200


class TooDeep(ValueError):
    """``value`` nests deeper than allowed; ``field`` is the first container past the limit."""

    def __init__(self, field: str, max_depth: int) -> None:
        self.field = field
        self.max_depth = max_depth
        self.message = f"nested deeper than {max_depth} levels"
        super().__init__(f"{field}: {self.message}")


def check_depth(value: Any, field: str, max_depth: int = MAX_DEPTH) -> None:
    """Raise :class:`TooDeep` when a list or object in ``value`` sits deeper than
    ``max_depth`` (its field a dotted path under ``field``: ``input.a.0``)."""
    pending: list[tuple[Any, str, int]] = [(value, field, 1)]
    while pending:
        item, path, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.items()
        elif isinstance(item, list | tuple):
            children = enumerate(item)
        else:
            continue
        if depth > max_depth:
            raise TooDeep(path, max_depth)
        for key, child in children:
            if isinstance(child, dict | list | tuple):
                pending.append((child, f"{path}.{key}", depth + 1))


def parse_json(text: str | bytes, field: str, max_depth: int = MAX_DEPTH) -> Any:
    """JSON text parsed, nesting at most ``max_depth``: ``ValueError`` when it is not JSON,
    :class:`TooDeep` (a ``ValueError`` too) when it nests deeper (the parser itself recurses,
    and past about a thousand levels fails on its own)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep(field, max_depth) from None
    check_depth(value, field, max_depth)
    return value
