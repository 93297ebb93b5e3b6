"""Ranking policies: which of the blocks a search found a task runs on.

A search's ``policyRuleURI`` names a policy; code never comes from the request. Built in:
``least-loaded`` (the fewest tasks waiting per ready runner slot; another cluster's blocks by
the load its gateway publishes), ``random``, ``lowest-latency`` (this cluster's blocks first,
then other clusters by the latency this gateway measured to each) and ``sticky`` (the same
block for a session while the candidates stay the same: rendezvous hashing of the session id).
Others are installed as Python entry points of the group ``conduit.ranking_policies``: the
entry point's name is the URI (or the URI without its ``:version``), its object a
:class:`RankingPolicy` (or a class making one). An unknown URI is refused, naming it.

A policy sees plain :class:`Candidate` values and returns them in its order of preference; it
does no I/O (the gateway gathers loads and latencies first).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol

ENTRY_POINT_GROUP = "conduit.ranking_policies"


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
    pass


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
    """Policies by URI, each made once per process."""

    def __init__(self) -> None:
        self._made: dict[str, RankingPolicy] = {}

    def get(self, uri: str) -> RankingPolicy:
        policy = self._made.get(uri)
        if policy is None:
            policy = self._made[uri] = _load(uri)
        return policy


def _load(uri: str) -> RankingPolicy:
    name = uri.partition(":")[0] if uri not in BUILT_IN else uri
    if name in BUILT_IN:
        return BUILT_IN[name]()
    installed = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    found = installed.get(uri) or installed.get(name)
    if found is None:
        known = sorted({*BUILT_IN, *installed})
        raise UnknownPolicy(f"no ranking policy {uri!r} (known: {', '.join(known)})")
    made = found.load()
    policy = made() if isinstance(made, type) else made
    if not callable(getattr(policy, "rank", None)):
        raise UnknownPolicy(f"ranking policy {uri!r} has no rank()")
    return policy  # type: ignore[no-any-return]
