"""The deployments one director serves, each with its driver: the deployment, its runner and
the parts that drive that runner. Entries of every deployment share the director's workers
(one concurrency budget); each entry is run by the driver whose streams hold it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from director.deployment import ServedDeployment
from director.handling import AttemptHandler
from director.runner_monitor import RunnerMonitor
from protocol.client import RunnerClient


@dataclass(frozen=True, slots=True)
class DeploymentDriver:
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


class DeploymentDrivers:
    """The drivers in the order given; the first also runs entries of streams no deployment
    owns (``drain_streams`` given by hand)."""

    def __init__(self, drivers: Sequence[DeploymentDriver]) -> None:
        if not drivers:
            raise ValueError("a director serves at least one deployment")
        self._drivers = list(drivers)
        self._by_stream: dict[str, DeploymentDriver] = {}

    def __iter__(self) -> Iterator[DeploymentDriver]:
        return iter(self._drivers)

    def __len__(self) -> int:
        return len(self._drivers)

    def __getitem__(self, index: int) -> DeploymentDriver:
        return self._drivers[index]

    def of(self, stream: str) -> DeploymentDriver:
        driver = self._by_stream.get(stream)
        if driver is None:
            driver = next(
                (driver for driver in self._drivers if driver.owns(stream)), self._drivers[0]
            )
            self._by_stream[stream] = driver
        return driver
