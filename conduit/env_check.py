"""``CONDUIT_*`` variables no process reads: each process warns of them at start, with the
nearest known name, so a mistyped setting is not silently ignored.

The rule is :mod:`core.env_names` (``python -m runners`` applies it too, with the names that
module declares). Here the known names are read from the settings classes themselves
(:mod:`conduit.settings_catalog`, one rule for the settings reference, ``.env.example`` and
this check) plus those read outside a class (``settings_catalog.DIRECT_READS``); a test keeps
the declared list equal to them. Every process's names count as known to each: one
environment file usually feeds them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from core import env_names


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
    if not env_names.asked(environ):
        return []  # nothing to look up: spare importing every settings class
    return env_names.unknown_names(environ, known_names())


def warn_unknown(environ: Mapping[str, str]) -> None:
    env_names.warn_unknown(environ, known_names())
