"""A rate as settings spell it: ``100req/min``, ``5/s``, ``1000 req / 2 hour`` (``s``/``sec``/
``second``, ``m``/``min``/``minute``, ``h``/``hour``; ``req`` optional). One spelling for every
rate Conduit takes: a runner's per-tenant limits and an account's rate of creates alike."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SPEC = re.compile(r"^\s*(\d+)\s*(?:req(?:uests)?)?\s*/\s*(\d*)\s*([a-z]+)\s*$", re.IGNORECASE)
_UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
}


@dataclass(frozen=True)
class Limit:
    requests: int
    window: float

    @classmethod
    def parse(cls, spec: str) -> Limit:
        """``100req/min``, ``5/s``, ``1000 req / 2 hour``."""
        match = _SPEC.match(spec)
        unit = match and _UNITS.get(match.group(3).lower().removesuffix("s") or "s")
        if match is None or unit is None or int(match.group(1)) < 1:
            raise ValueError(f"rate limit {spec!r} is not like '100req/min'")
        return cls(int(match.group(1)), int(match.group(2) or 1) * unit)
