"""The deployments one director serves, each a lane: the deployment, its runner and the parts
that drive that runner. Entries of every lane share the director's workers (one concurrency
budget); each entry is run by the lane whose streams hold it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from director.deployment import ServedDeployment
from director.handling import AttemptHandler
from director.runner_monitor import RunnerMonitor
from protocol.client import RunnerClient


@dataclass(frozen=True, slots=True)
class Lane:
    deployment: ServedDeployment
    runner: RunnerClient
    monitor: RunnerMonitor
    handler: AttemptHandler
    #: The pool slot's model, when the runner is a slot of a pool host.
    model: str | None = None

    def owns(self, stream: str) -> bool:
        """Whether ``stream`` is one of this deployment's (or its version's) shards, under any
        naming or shard count."""
        return any(target.owns(stream) for target in self.deployment.targets)


class Lanes:
    """The lanes in the order given; the first also runs entries of streams no lane owns
    (``drain_streams`` given by hand)."""

    def __init__(self, lanes: Sequence[Lane]) -> None:
        if not lanes:
            raise ValueError("a director serves at least one deployment")
        self._lanes = list(lanes)
        self._by_stream: dict[str, Lane] = {}

    def __iter__(self) -> Iterator[Lane]:
        return iter(self._lanes)

    def __len__(self) -> int:
        return len(self._lanes)

    def __getitem__(self, index: int) -> Lane:
        return self._lanes[index]

    def of(self, stream: str) -> Lane:
        lane = self._by_stream.get(stream)
        if lane is None:
            lane = next((lane for lane in self._lanes if lane.owns(stream)), self._lanes[0])
            self._by_stream[stream] = lane
        return lane
