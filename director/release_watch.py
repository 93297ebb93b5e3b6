"""A director reads its deployment's queue only while the deployment runs its runner's version.

A deployment's predictions wait in the deployment's streams (``{dp-owner/name}``), whatever
version it runs; each director runs them on its runner, which serves one version. When a
release changes the deployment's version (``PATCH /v1/deployments/o/n``), directors of the old
version stop reading those streams — what they hold finishes on the old version — and
directors of the new one read them, draining what waited into the new version: blue/green, with
no entry moved and none lost. A director started with ``--version`` of a release still to come
reads only that version's own streams until the deployment runs it, so the new fleet can be
up before the switch. A deployment its model's owner withdrew (``catalog.deployment_withdrawn``:
another account's model made private, or its version deleted) has all of its queues set aside
until it is no longer withdrawn. The versions are read from Postgres every
``release_check_interval``.
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from director.deployment import ServedDeployment, current_versions
from director.intake import Intake
from tracker.keys import Target

log = logging.getLogger(__name__)


class ReleaseWatch:
    def __init__(
        self, engine: AsyncEngine, intake: Intake, deployments: list[ServedDeployment]
    ) -> None:
        self.engine = engine
        self.intake = intake
        self.deployments = deployments

    async def check(self) -> None:
        """Set aside or take back each deployment's streams by the version it runs now."""
        versions = await current_versions(self.engine, [d.name for d in self.deployments])
        for deployment in self.deployments:
            if deployment.name not in versions:  # deleted: nothing more will be queued there
                continue
            running = versions[deployment.name]
            if running is None:  # its model's owner withdrew it: none of its queues is read
                if self.intake.stand_aside(deployment.streams()):
                    log.info("deployment %s was withdrawn by its model's owner", deployment.name)
                continue
            streams = Target.deployment(deployment.name, deployment.shards).all_streams()
            # Withdrawn no longer: its version's own queues are read again.
            await self.intake.rejoin([s for s in deployment.streams() if s not in streams])
            if running != deployment.version_id:
                if self.intake.stand_aside(streams):
                    log.info(
                        "deployment %s runs version %s, not this runner's %s: "
                        "its queue is left to that version's directors",
                        deployment.name,
                        running,
                        deployment.version_id,
                    )
            elif await self.intake.rejoin(streams):
                log.info(
                    "deployment %s runs this runner's version %s: reading its queue",
                    deployment.name,
                    deployment.version_id,
                )
