"""Ranking policies: which of the blocks a search found a task runs on.

A search's ``policyRuleURI`` names a policy; code never comes from the request. Built in:
``least-loaded`` (the fewest tasks waiting per ready runner slot; another cluster's blocks by
the load its gateway publishes), ``random``, ``lowest-latency`` (this cluster's blocks first,
then other clusters by the latency this gateway measured to each) and ``sticky`` (the same
block for a session while the candidates stay the same: rendezvous hashing of the session id).
Others are installed as Python entry points of the group ``conduit.ranking_policies``: the
entry point's name is the URI (or the URI without its ``:version``), its object a
:class:`RankingPolicy` (or a class making one). A URI is a name (lowercase letters, digits,
``.``, ``_``, ``-``; at most 64) and an optional ``:version`` (at most 64 of those and
uppercase): anything else is refused before any lookup, and so is a name no policy has. A
policy is made once per name it resolves to, never per URI a request sends.

A policy sees plain :class:`Candidate` values and returns them in its order of preference; it
does no I/O (the gateway gathers loads and latencies first).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol

ENTRY_POINT_GROUP = "conduit.ranking_policies"
#: A policy URI: a name, and an optional version.
URI = re.compile(r"(?P<name>[a-z0-9][a-z0-9._-]{0,63})(?::[A-Za-z0-9._-]{1,64})?")


@dataclass(frozen=True, slots=True)
class Candidate:
    block_id: str
    cluster_id: str
    #: This cluster's own block (else another cluster's, run through its gateway).
    local: bool
    metadata: Mapping[str, Any]
    #: Tasks waiting per ready runner slot (None: unknown).
    load: float | None = None
    #: Seconds a call to the block's cluster took lately (0 for this cluster; None: unknown).
    latency: float | None = None


@dataclass(frozen=True, slots=True)
class RankingContext:
    session_id: str
    #: The rule's ``settings`` and ``parameters``, as the request gave them.
    settings: Mapping[str, Any] = field(default_factory=dict)
    parameters: Mapping[str, Any] = field(default_factory=dict)


class RankingPolicy(Protocol):
    def rank(
        self, candidates: Sequence[Candidate], context: RankingContext
    ) -> Sequence[Candidate]: ...


class UnknownPolicy(LookupError):
    """A URI not of a policy URI's shape, or naming no policy (the message quotes at most a
    short prefix of it)."""


def _measured(value: float | None) -> float:
    return value if value is not None else float("inf")


class LeastLoaded:
    def rank(self, candidates: Sequence[Candidate], context: RankingContext) -> list[Candidate]:
        return sorted(candidates, key=lambda c: (_measured(c.load), not c.local, c.block_id))


class Random:
    def rank(self, candidates: Sequence[Candidate], context: RankingContext) -> list[Candidate]:
        shuffled = list(candidates)
        random.shuffle(shuffled)
        return shuffled


class LowestLatency:
    def rank(self, candidates: Sequence[Candidate], context: RankingContext) -> list[Candidate]:
        return sorted(candidates, key=lambda c: (_measured(c.latency), c.block_id))


class Sticky:
    def rank(self, candidates: Sequence[Candidate], context: RankingContext) -> list[Candidate]:
        def weight(candidate: Candidate) -> bytes:
            key = f"{context.session_id}\0{candidate.cluster_id}\0{candidate.block_id}"
            return hashlib.blake2b(key.encode(), digest_size=8).digest()

        return sorted(candidates, key=weight, reverse=True)


BUILT_IN: dict[str, Callable[[], RankingPolicy]] = {
    "least-loaded": LeastLoaded,
    "random": Random,
    "lowest-latency": LowestLatency,
    "sticky": Sticky,
}


class Policies:
    """Policies by the name a URI resolves to, each made once per process: as many as the
    gateway has, whatever URIs requests send."""

    def __init__(self) -> None:
        self._made: dict[str, RankingPolicy] = {}

    def get(self, uri: str) -> RankingPolicy:
        name = _resolve(uri)
        policy = self._made.get(name)
        if policy is None:
            policy = self._made[name] = _load(name)
        return policy


def _installed() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _resolve(uri: str) -> str:
    """The name of the policy ``uri`` names: the URI itself when a policy is installed under
    it whole, else its name without the version."""
    shape = URI.fullmatch(uri)
    if shape is None:
        shown = repr(uri) if len(uri) <= 32 else f"{uri[:32]!r}... ({len(uri)} characters)"
        raise UnknownPolicy(
            f"not a policy URI (a name of lowercase letters, digits, '.', '_', '-' and an "
            f"optional ':version'): {shown}"
        )
    name = shape["name"]
    if uri in BUILT_IN or name in BUILT_IN:
        return uri if uri in BUILT_IN else name
    installed = _installed()
    if uri in installed:
        return uri
    if name in installed:
        return name
    known = sorted({*BUILT_IN, *installed})
    raise UnknownPolicy(f"no ranking policy {uri!r} (known: {', '.join(known)})")


def _load(name: str) -> RankingPolicy:
    if name in BUILT_IN:
        return BUILT_IN[name]()
    made = _installed()[name].load()
    policy = made() if isinstance(made, type) else made
    if not callable(getattr(policy, "rank", None)):
        raise UnknownPolicy(f"ranking policy {name!r} has no rank()")
    return policy  # type: ignore[no-any-return]
