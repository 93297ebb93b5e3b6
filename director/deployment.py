"""What a director needs to know about the deployment it serves, loaded once at start."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from director.queue import Target
from tracker.tables import Deployment, Version


@dataclass(frozen=True, slots=True)
class DeploymentInfo:
    name: str
    version_id: str
    shards: int
    version_shards: int
    prediction_timeout: float
    max_attempts: int = 1
    #: ``X-Priority`` for predictions that do not carry their own.
    priority: str = "normal"

    @property
    def targets(self) -> list[Target]:
        return [
            Target("dp", self.name, self.shards),
            Target("vp", self.version_id, self.version_shards),
        ]

    def streams(self) -> list[str]:
        return [stream for target in self.targets for stream in target.all_streams()]

    def draining(self, old_shards: int | None, extra: list[str]) -> list[str]:
        """Streams of an earlier layout still to be read until empty (no-downtime changes)."""
        current = set(self.streams())
        old = []
        if old_shards:
            old = [
                stream
                for target in self.targets
                for stream in Target(target.kind, target.key, old_shards).all_streams()
            ]
        return [s for s in dict.fromkeys(old + extra) if s and s not in current]


async def load_deployment(engine: AsyncEngine, name: str) -> DeploymentInfo:
    owner, _, short = name.partition("/")
    query = (
        select(
            Deployment.version_id,
            Deployment.shards,
            Version.shards,
            Deployment.prediction_timeout,
            Deployment.max_attempts,
            Deployment.priority,
        )
        .join(Version, Version.id == Deployment.version_id)
        .where(Deployment.owner == owner, Deployment.name == short)
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query)).one_or_none()
    if row is None:
        raise LookupError(f"deployment {name} does not exist")
    return DeploymentInfo(name, *row)
