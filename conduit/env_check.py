"""``CONDUIT_*`` variables no process reads: each process warns of them at start, with the
nearest known name, so a mistyped setting is not silently ignored.

The known names are every settings class's (:mod:`conduit.settings_catalog`, one rule for the
settings reference, ``.env.example`` and this check) plus those read outside a class
(``settings_catalog.DIRECT_READS``). Every process's names count as known to each: one
environment file usually feeds them all.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from functools import cache

PREFIX = "CONDUIT_"

log = logging.getLogger("conduit.env")


@cache
def known_names() -> frozenset[str]:
    from conduit.settings_catalog import DIRECT_READS, PROCESS_PACKAGES, process_env_names

    names = set(DIRECT_READS)
    for process in PROCESS_PACKAGES:
        names |= process_env_names(process)
    return frozenset(names)


def unknown_names(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """``(name, nearest known name or None)`` for each ``CONDUIT_*`` variable no process
    reads, in name order."""
    asked = sorted(name for name in environ if name.upper().startswith(PREFIX))
    if not asked:
        return []
    known = known_names()
    found = []
    for name in asked:
        if name.upper() in known:
            continue
        nearest = difflib.get_close_matches(name.upper(), known, n=1, cutoff=0.6)
        found.append((name, nearest[0] if nearest else None))
    return found


def warn_unknown(environ: Mapping[str, str]) -> None:
    for name, nearest in unknown_names(environ):
        hint = f" (did you mean {nearest}?)" if nearest else ""
        log.warning("%s is not a Conduit setting; it is ignored%s", name, hint)
