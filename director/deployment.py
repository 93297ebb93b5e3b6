"""What a director needs to know about the deployment it serves, loaded once at start."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, select, tuple_
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.lookups import deployment_withdrawn
from tracker.keys import Target
from tracker.priority import Priority
from tracker.tables import Deployment, Model, Version


@dataclass(frozen=True, slots=True)
class ServedDeployment:
    """The deployment a director serves: its streams and the limits of its runs (the api's
    view of a deployment is ``catalog.lookups.DeploymentInfo``)."""

    name: str
    version_id: str
    shards: int
    version_shards: int
    prediction_timeout: float
    max_attempts: int = 1
    #: ``X-Priority`` for predictions that do not carry their own.
    priority: str = Priority.NORMAL
    #: ``training``: it runs the trainings of its version, not the deployment's predictions.
    job_kind: str = "prediction"

    @property
    def trains(self) -> bool:
        return self.job_kind == "training"

    @property
    def targets(self) -> list[Target]:
        if self.trains:
            return [Target.training(self.version_id, self.version_shards)]
        return [
            Target.deployment(self.name, self.shards),
            Target.version(self.version_id, self.version_shards),
        ]

    def streams(self) -> list[str]:
        return [stream for target in self.targets for stream in target.all_streams()]

    def draining(self, old_shards: int | None, extra: list[str]) -> list[str]:
        """Streams of an earlier layout still to be read until empty (no-downtime changes):
        the old shard count's, and ``extra``."""
        current = set(self.streams())
        old = []
        if old_shards:
            old = [
                stream
                for target in self.targets
                for stream in Target(target.kind, target.key, old_shards).all_streams()
            ]
        wanted = old + extra
        return [s for s in dict.fromkeys(wanted) if s and s not in current]


async def load_deployment(
    engine: AsyncEngine, name: str, version: str | None = None
) -> ServedDeployment:
    """The deployment's settings. ``version``: the one served (a version of the deployment's
    model), when not the one the deployment runs now."""
    owner, _, short = name.partition("/")
    served = Version.id == (version if version is not None else Deployment.version_id)
    query = (
        select(
            Version.id,
            Deployment.shards,
            Version.shards,
            Deployment.prediction_timeout,
            Deployment.max_attempts,
            Deployment.priority,
        )
        .join(Version, and_(served, Version.model_id == Deployment.model_id))
        .where(Deployment.owner == owner, Deployment.name == short)
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query)).one_or_none()
    if row is None:
        if version is not None:
            raise LookupError(f"deployment {name} does not exist or has no version {version}")
        raise LookupError(f"deployment {name} does not exist")
    return ServedDeployment(name, *row)


async def current_versions(engine: AsyncEngine, names: list[str]) -> dict[str, str | None]:
    """The version each deployment of ``names`` runs now (one query): None for one its model's
    owner withdrew (``catalog.deployment_withdrawn``); a deleted one is left out."""
    pairs = [tuple(name.split("/", 1)) for name in names]
    query = (
        select(Deployment.owner, Deployment.name, Deployment.version_id, deployment_withdrawn())
        .join(Model, Model.id == Deployment.model_id)
        .where(tuple_(Deployment.owner, Deployment.name).in_(pairs))
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    return {
        f"{owner}/{name}": None if withdrawn else version
        for owner, name, version, withdrawn in rows
    }
